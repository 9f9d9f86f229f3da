"""The BlobStore contract: every blob store passes this one suite.

Subclass :class:`BlobStoreContract` in a ``test_*.py`` module (name it ``Test…``)
and fill in the hooks:

    class TestMyStore(BlobStoreContract):
        def make_store(self, request):
            return MyStore(request.getfixturevalue("tmp_path"))

        def tamper(self, store, ref, data):
            ...  # overwrite the stored bytes of `ref`, behind the store's back
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from typing import Protocol

import pytest

from aaa_django.data import (
    BlobIntegrityError,
    BlobInventory,
    BlobNotFoundError,
    BlobRef,
    BlobStore,
    NamespacedBlobStore,
)
from aaa_django.data.keys import namespace_segment

# Namespaces are stream names from outside; these must be stored, isolated from each
# other, and never turned into a path or key that leaves the store's area.
HOSTILE_NAMESPACES = [
    "..",
    ".",
    "../../etc",
    "../../../../../../tmp/escaped",
    "/etc/passwd",
    "/",
    "//server/share",
    "a/../../b",
    "run-1/../run-2",
    "C:\\Windows\\System32",
    "..\\..\\x",
    "nul\0byte",
    "\0",
    "~",
    "=",
    "%2E%2E",
    "~2E~2E",
    "~~",
    "%",
    "ns\nwith\nnewlines",
    "ü/..",
    "\udc80 lone surrogate",
    "x" * 1000,
    "../" * 200,
]

# Hash values a forged ref might carry to reach a path outside the store.
HOSTILE_SHAS = [
    "../../etc/passwd",
    "/etc/passwd",
    "..",
    "",
    "0" * 63,
    "0" * 65,
    "A" * 64,  # hashes are lowercase: one blob, one name
    "0" * 62 + "/.",
    "0" * 63 + "\0",
    "../" + "0" * 61,
]


class SpecBlobStore:
    """Spec 004's "your own" store: the four methods, nothing more."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def put(self, data: bytes, media_type: str) -> BlobRef:
        self.blobs[hashlib.sha256(data).hexdigest()] = data
        return BlobRef.for_bytes(data, media_type)

    def get(self, ref: BlobRef) -> bytes:
        try:
            return ref.verify(self.blobs[ref.sha256])
        except KeyError:
            raise BlobNotFoundError(ref.key) from None

    def exists(self, ref: BlobRef) -> bool:
        return ref.sha256 in self.blobs

    def delete(self, ref: BlobRef) -> None:
        self.blobs.pop(ref.sha256, None)


class InventoriedBlobStore(NamespacedBlobStore, BlobInventory, Protocol):
    """What the suite checks: a blob store with namespaces and an inventory (every store
    the package ships is one)."""


def forged(ref: BlobRef, **changes: object) -> BlobRef:
    """A ref with ``changes`` applied behind validation's back (as an attacker might)."""
    fake = object.__new__(BlobRef)
    for f in dataclasses.fields(BlobRef):
        object.__setattr__(fake, f.name, changes.get(f.name, getattr(ref, f.name)))
    return fake


class BlobStoreContract:
    """Behaviour every :class:`~aaa_django.data.BlobStore` must have."""

    # --- hooks -------------------------------------------------------------------

    def make_store(self, request: pytest.FixtureRequest) -> BlobStore:
        """A fresh, empty store (use ``request.getfixturevalue`` for fixtures)."""
        raise NotImplementedError

    def tamper(self, store: BlobStore, ref: BlobRef, data: bytes) -> None:
        """Replace the stored bytes of ``ref`` with ``data`` without the store's API."""
        raise NotImplementedError

    def escaped(self, store: BlobStore) -> list[str]:
        """Anything the store wrote outside its own area (directory, key prefix)."""
        return []

    @pytest.fixture
    def store(self, request: pytest.FixtureRequest) -> BlobStore:
        return self.make_store(request)

    # --- put / get ---------------------------------------------------------------

    def test_is_a_blob_store(self, store: InventoriedBlobStore) -> None:
        assert isinstance(store, BlobStore)

    def test_put_returns_the_ref_and_get_returns_the_bytes(self, store: InventoriedBlobStore) -> None:
        ref = store.put(b"hello", "text/plain", namespace="run-1")

        assert ref == BlobRef.for_bytes(b"hello", "text/plain", namespace="run-1")
        assert ref.sha256 == "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        assert ref.size == 5
        assert store.get(ref) == b"hello"
        assert store.exists(ref)

    def test_round_trips_empty_and_binary_bytes(self, store: InventoriedBlobStore) -> None:
        for data in (b"", bytes(range(256)) * 40, "ünïcode \u2603".encode()):
            ref = store.put(data, namespace="run-1")
            assert store.get(ref) == data
            assert ref.media_type == "application/octet-stream"

    def test_defaults_to_the_empty_namespace(self, store: InventoriedBlobStore) -> None:
        ref = store.put(b"data")

        assert ref.namespace == ""
        assert store.get(ref) == b"data"
        assert store.list("") == [ref]

    def test_accepts_bytes_like_data_but_not_str(self, store: InventoriedBlobStore) -> None:
        assert store.get(store.put(bytearray(b"abc"))) == b"abc"  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            store.put("text is not bytes")  # type: ignore[arg-type]

    def test_rejects_a_bad_media_type(self, store: InventoriedBlobStore) -> None:
        with pytest.raises(ValueError):
            store.put(b"x", "text/plain\r\nX-Injected: 1")

    def test_a_ref_is_json_round_trippable_and_still_reads(self, store: InventoriedBlobStore) -> None:
        ref = store.put(b'{"a":1}', "application/json", namespace="run-1")

        assert store.get(BlobRef.from_dict(ref.to_dict())) == b'{"a":1}'

    # --- content addressing and namespaces -----------------------------------------

    def test_same_bytes_in_one_namespace_are_stored_once(self, store: InventoriedBlobStore) -> None:
        first = store.put(b"same", namespace="run-1")
        second = store.put(b"same", namespace="run-1")

        assert first == second
        assert store.list("run-1") == [first]

    def test_same_bytes_in_two_namespaces_are_two_blobs(self, store: InventoriedBlobStore) -> None:
        a = store.put(b"same", namespace="run-a")
        b = store.put(b"same", namespace="run-b")

        assert a.sha256 == b.sha256 and a != b
        store.delete(a)
        assert not store.exists(a)
        assert store.get(b) == b"same"

    def test_a_ref_only_reads_in_its_own_namespace(self, store: InventoriedBlobStore) -> None:
        ref = store.put(b"mine", namespace="run-a")
        elsewhere = BlobRef(ref.sha256, ref.size, ref.media_type, "run-b")

        assert not store.exists(elsewhere)
        with pytest.raises(BlobNotFoundError):
            store.get(elsewhere)

    def test_list_returns_the_namespaces_refs_sorted_with_media_types(self, store: InventoriedBlobStore) -> None:
        refs = [
            store.put(b"one", "text/plain", namespace="run-1"),
            store.put(b"{}", "application/json", namespace="run-1"),
            store.put(b"\x89PNG", "image/png", namespace="run-1"),
        ]
        store.put(b"other", namespace="run-2")

        assert list(store.list("run-1")) == sorted(refs, key=lambda r: r.sha256)
        assert list(store.list("never-written")) == []

    # --- delete --------------------------------------------------------------------

    def test_delete_removes_one_blob_and_is_idempotent(self, store: InventoriedBlobStore) -> None:
        gone = store.put(b"gone", namespace="run-1")
        kept = store.put(b"kept", namespace="run-1")

        store.delete(gone)
        store.delete(gone)

        assert not store.exists(gone)
        with pytest.raises(BlobNotFoundError):
            store.get(gone)
        assert store.list("run-1") == [kept]

    def test_a_deleted_blob_can_be_put_again(self, store: InventoriedBlobStore) -> None:
        ref = store.put(b"again", "text/plain", namespace="run-1")
        store.delete(ref)

        assert store.put(b"again", "text/plain", namespace="run-1") == ref
        assert store.get(ref) == b"again"
        assert store.list("run-1") == [ref]

    def test_delete_namespace_removes_only_that_namespace(self, store: InventoriedBlobStore) -> None:
        erased = [store.put(bytes([i]) * 10, namespace="run-erased") for i in range(5)]
        shared = store.put(b"in both", namespace="run-erased")
        kept = [store.put(b"in both", namespace="run-kept"), store.put(b"k", namespace="")]
        near = store.put(b"n", namespace="run-erased-2")  # a prefix is not a namespace

        assert store.delete_namespace("run-erased") == 6

        for ref in [*erased, shared]:
            assert not store.exists(ref)
        assert store.list("run-erased") == []
        for ref in [*kept, near]:
            assert store.get(ref)
        assert store.delete_namespace("run-erased") == 0

    def test_delete_namespace_of_an_unknown_namespace_is_zero(self, store: InventoriedBlobStore) -> None:
        assert store.delete_namespace("never-written") == 0

    # --- inventory (the orphan sweep) -------------------------------------------------

    def test_lists_every_namespace_by_segment_and_its_hashes(self, store: InventoriedBlobStore) -> None:
        assert isinstance(store, NamespacedBlobStore) and isinstance(store, BlobInventory)
        a = [store.put(b"a1", namespace="run-a"), store.put(b"a2", namespace="run-a")]
        long = store.put(b"l", namespace="x" * 1000)  # a hashed segment
        odd = store.put(b"o", namespace="../../etc")

        segments = set(store.segments())

        expected = {namespace_segment(ns) for ns in ("run-a", "x" * 1000, "../../etc")}
        assert expected <= segments and len(segments - expected) == 0
        assert store.hashes(namespace_segment("run-a")) == sorted(r.sha256 for r in a)
        assert store.hashes(namespace_segment("x" * 1000)) == [long.sha256]
        assert store.hashes(namespace_segment("never-written")) == []
        assert store.hashes(namespace_segment("../../etc")) == [odd.sha256]

    def test_written_at_is_when_the_blob_was_stored(self, store: InventoriedBlobStore) -> None:
        before = time.time()
        ref = store.put(b"dated", namespace="run-1")
        when = store.written_at(namespace_segment("run-1"), ref.sha256)

        assert when is not None and before - 5 <= when <= time.time() + 5  # storage clocks
        assert store.written_at(namespace_segment("run-1"), "0" * 64) is None

    def test_discard_removes_one_blob_by_segment(self, store: InventoriedBlobStore) -> None:
        gone = store.put(b"gone", namespace="run-1")
        kept = [store.put(b"kept", namespace="run-1"), store.put(b"gone", namespace="run-2")]

        store.discard(namespace_segment("run-1"), gone.sha256)
        store.discard(namespace_segment("run-1"), gone.sha256)  # idempotent

        assert not store.exists(gone)
        assert all(store.exists(r) for r in kept)
        assert self.escaped(store) == []

    def test_a_forged_segment_is_rejected_before_any_io(self, store: InventoriedBlobStore) -> None:
        real = store.put(b"x", namespace="run-1")
        for segment in ("..", "../run-1", "a/b", "", ".", "~~" + "0" * 10):
            with pytest.raises(ValueError):
                store.discard(segment, real.sha256)
            with pytest.raises(ValueError):
                store.hashes(segment)
        with pytest.raises(ValueError):
            store.discard(namespace_segment("run-1"), "../" + real.sha256[3:])
        assert store.get(real) == b"x"

    # --- failures --------------------------------------------------------------------

    def test_a_missing_blob_raises_not_found(self, store: InventoriedBlobStore) -> None:
        ref = BlobRef.for_bytes(b"never stored", namespace="run-1")

        assert not store.exists(ref)
        with pytest.raises(BlobNotFoundError):
            store.get(ref)

    def test_tampered_bytes_of_the_same_size_raise_integrity_error(self, store: InventoriedBlobStore) -> None:
        ref = store.put(b"the original", namespace="run-1")
        self.tamper(store, ref, b"the tampered")

        with pytest.raises(BlobIntegrityError):
            store.get(ref)

    def test_tampered_bytes_of_another_size_raise_integrity_error(self, store: InventoriedBlobStore) -> None:
        ref = store.put(b"the original", namespace="run-1")

        self.tamper(store, ref, b"")
        with pytest.raises(BlobIntegrityError):
            store.get(ref)
        self.tamper(store, ref, b"the original, and then much more" * 100)
        with pytest.raises(BlobIntegrityError):
            store.get(ref)

    def test_a_ref_with_a_wrong_size_raises_integrity_error(self, store: InventoriedBlobStore) -> None:
        ref = store.put(b"twelve bytes", namespace="run-1")

        with pytest.raises(BlobIntegrityError):
            store.get(dataclasses.replace(ref, size=11))

    # --- hostile input ----------------------------------------------------------------

    # One test per property, the hostile values as subtests: a fresh store per value
    # would cost a new S3 session each.

    def test_hostile_namespaces_are_stored_safely_and_erased_alone(
        self, store: InventoriedBlobStore, subtests: pytest.Subtests
    ) -> None:
        neighbour = store.put(b"payload", namespace="")
        for namespace in HOSTILE_NAMESPACES:
            with subtests.test(namespace=namespace):
                ref = store.put(b"payload", "text/plain", namespace=namespace)

                assert ref.namespace == namespace
                assert store.get(ref) == b"payload"
                assert store.list(namespace) == [ref]
                assert self.escaped(store) == []

                assert store.delete_namespace(namespace) == 1
                assert not store.exists(ref)
                assert store.list("") == [neighbour]
                assert self.escaped(store) == []

    def test_hostile_namespaces_do_not_collide(self, store: InventoriedBlobStore) -> None:
        refs = {ns: store.put(ns.encode("utf-8", "surrogatepass"), namespace=ns) for ns in ["", *HOSTILE_NAMESPACES]}

        for ns, ref in refs.items():
            assert store.list(ns) == [ref], ns

    def test_a_forged_hash_is_rejected_before_any_io(
        self, store: InventoriedBlobStore, subtests: pytest.Subtests
    ) -> None:
        real = store.put(b"x", namespace="run-1")
        for sha in HOSTILE_SHAS:
            with subtests.test(sha=sha):
                with pytest.raises(ValueError):
                    BlobRef(sha, 1)
                with pytest.raises(ValueError):
                    BlobRef.from_dict({"sha256": sha, "size": 1, "namespace": "run-1"})

                fake = forged(real, sha256=sha)
                for op in (store.get, store.exists, store.delete):
                    with pytest.raises(ValueError):
                        op(fake)
        assert store.get(real) == b"x"
        assert self.escaped(store) == []

    def test_a_forged_namespace_type_is_rejected(self, store: InventoriedBlobStore) -> None:
        real = store.put(b"x", namespace="run-1")
        with pytest.raises(TypeError):
            store.get(forged(real, namespace=None))
        with pytest.raises(TypeError):
            store.put(b"x", namespace=None)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            store.delete_namespace(None)  # type: ignore[arg-type]
