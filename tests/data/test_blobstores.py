"""Every blob store passes the BlobStore contract (aaa_django/testing/blobstore.py).

Also here: the BlobRef value and the namespace encoding the stores share.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from pathlib import Path

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage
from hypothesis import given
from hypothesis import strategies as st

from aaa_django.data import BlobIntegrityError, BlobRef, FileBlobStore, InMemoryBlobStore
from aaa_django.data.keys import is_segment, namespace_segment, segment_namespace
from aaa_django.site.blobs import StorageBlobStore
from aaa_django.testing.blobstore import BlobStoreContract
from tests.conftest import S3_ACCESS_KEY, S3_REGION, S3_SECRET_KEY


def files_outside(top: Path, inside: Path) -> list[str]:
    """Every path under ``top`` that is neither ``inside`` (or within it) nor its parent."""
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            if not (path == inside or inside in path.parents or path in inside.parents):
                found.append(str(path))
    return found


class TestInMemoryBlobStore(BlobStoreContract):
    def make_store(self, request):
        return InMemoryBlobStore()

    def tamper(self, store, ref, data):
        store._blobs[(ref.namespace, ref.sha256)] = (data, ref.media_type)


class TestFileBlobStore(BlobStoreContract):
    def make_store(self, request):
        self.sandbox = request.getfixturevalue("tmp_path")
        return FileBlobStore(self.sandbox / "blobs" / "root")

    def tamper(self, store, ref, data):
        store._path(ref).write_bytes(data)

    def escaped(self, store):
        return files_outside(self.sandbox, store.root)

    def test_layout_is_sharded_by_hash_under_the_encoded_namespace(self, store):
        ref = store.put(b"{}", "application/json", namespace="run-1/../x")
        sha = ref.sha256

        blob = store.root / "run-1~2F~2E~2E~2Fx" / sha[:2] / sha[2:4] / sha
        assert blob.read_bytes() == b"{}"
        assert blob.with_name(sha + ".meta.json").is_file()
        assert not [p for p in blob.parent.iterdir() if p.name.startswith(".tmp-")]

    def test_a_blob_without_its_sidecar_is_still_listed_and_repaired(self, store):
        ref = store.put(b"{}", "application/json", namespace="run-1")
        sidecar = store._path(ref).with_name(ref.sha256 + ".meta.json")
        sidecar.unlink()  # as if the process died between the two writes

        assert store.list("run-1") == [BlobRef(ref.sha256, 2, "application/octet-stream", "run-1")]
        store.put(b"{}", "application/json", namespace="run-1")
        assert store.list("run-1") == [ref]

    def test_delete_namespace_removes_its_directory(self, store):
        store.put(b"a", namespace="run-1")
        store.put(b"b", namespace="run-2")

        store.delete_namespace("run-1")

        assert sorted(p.name for p in store.root.iterdir()) == ["run-2"]


class TestStorageBlobStoreOnFileSystemStorage(BlobStoreContract):
    def make_store(self, request):
        self.sandbox = request.getfixturevalue("tmp_path")
        self.location = self.sandbox / "media"
        return StorageBlobStore(FileSystemStorage(location=self.location))

    def tamper(self, store, ref, data):
        key = store._key(ref.namespace, ref.sha256)
        store.storage.delete(key)  # FileSystemStorage never overwrites: it renames
        assert store.storage.save(key, ContentFile(data)) == key

    def escaped(self, store):
        return files_outside(self.sandbox, self.location / store.prefix)

    def test_delete_namespace_removes_its_directories(self, store):
        store.put(b"a", namespace="run-1")
        store.put(b"b", namespace="run-2")

        store.delete_namespace("run-1")

        assert sorted(p.name for p in (self.location / "aaa-blobs").iterdir()) == ["run-2"]


class TestStorageBlobStoreOnS3(BlobStoreContract):
    """Against a real S3 API (moto's server, started by bin/test), via a STORAGES alias
    whose S3Storage has a ``location``, as a site sharing its bucket would set."""

    def make_store(self, request):
        options = {**request.getfixturevalue("s3_bucket"), "location": "site-media"}
        settings = request.getfixturevalue("settings")
        settings.STORAGES = {
            **settings.STORAGES,
            "blobs": {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": options},
        }
        import boto3

        self.bucket = options["bucket_name"]
        self.s3 = boto3.client(
            "s3",
            endpoint_url=options["endpoint_url"],
            aws_access_key_id=S3_ACCESS_KEY,
            aws_secret_access_key=S3_SECRET_KEY,
            region_name=S3_REGION,
        )
        return StorageBlobStore(alias="blobs", prefix="tenant-a/blobs")

    def object_key(self, store, ref):
        return f"site-media/{store._key(ref.namespace, ref.sha256)}"

    def tamper(self, store, ref, data):
        self.s3.put_object(Bucket=self.bucket, Key=self.object_key(store, ref), Body=data)

    def escaped(self, store):
        keys = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
            keys += [o["Key"] for o in page.get("Contents", ())]
        return [k for k in keys if not k.startswith(f"site-media/{store.prefix}/")]

    def test_objects_carry_the_media_type(self, store):
        ref = store.put(b"{}", "application/json", namespace="run-1")

        head = self.s3.head_object(Bucket=self.bucket, Key=self.object_key(store, ref))
        assert head["ContentType"] == "application/json"
        assert head["ContentLength"] == 2

    def test_a_gzipping_storage_still_round_trips_and_verifies(self, store):
        store.storage.gzip = True
        store.storage.gzip_content_types = ("application/json",)
        data = b'{"text":"' + b"compressible " * 1000 + b'"}'
        ref = store.put(data, "application/json", namespace="run-1")

        head = self.s3.head_object(Bucket=self.bucket, Key=self.object_key(store, ref))
        assert head["ContentEncoding"] == "gzip" and head["ContentLength"] < len(data)
        assert store.get(ref) == data
        self.tamper(store, ref, b"{}")
        with pytest.raises(BlobIntegrityError):
            store.get(ref)

    def test_a_read_is_one_get_request(self, store):
        ref = store.put(b"{}", "application/json", namespace="run-1")
        sent = []
        events = store.storage.connection.meta.client.meta.events
        events.register("before-call.s3", lambda model, **_: sent.append(model.name))

        assert store.get(ref) == b"{}"
        assert sent == ["GetObject"]


def test_storage_blob_store_defaults_to_the_default_storage(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path)},
        },
    }
    store = StorageBlobStore()
    ref = store.put(b"x", namespace="run-1")

    assert (tmp_path / "aaa-blobs" / "run-1" / ref.sha256[:2] / ref.sha256).read_bytes() == b"x"


@pytest.mark.parametrize("prefix", ["..", "a/../b", "a//b", "./a", "a\\b"])
def test_storage_blob_store_rejects_a_prefix_that_is_not_a_plain_path(prefix):
    with pytest.raises(ValueError):
        StorageBlobStore(FileSystemStorage(), prefix=prefix)


def test_storage_blob_store_takes_a_storage_or_an_alias_not_both():
    with pytest.raises(ValueError):
        StorageBlobStore(FileSystemStorage(), alias="default")


# --- BlobRef ---------------------------------------------------------------------------

SHA = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"


def test_a_ref_round_trips_through_json():
    ref = BlobRef(SHA, 5, "text/plain", "run-1")

    assert ref.to_dict() == {
        "sha256": SHA,
        "size": 5,
        "media_type": "text/plain",
        "namespace": "run-1",
    }
    assert BlobRef.from_dict(json.loads(json.dumps(ref.to_dict()))) == ref
    assert ref.key == f"run-1/{SHA}"


def test_a_ref_from_a_dict_defaults_and_ignores_unknown_keys():
    assert BlobRef.from_dict({"sha256": SHA, "size": 5, "future": 1}) == BlobRef(SHA, 5, "application/octet-stream", "")
    with pytest.raises(ValueError):
        BlobRef.from_dict({"size": 5})
    with pytest.raises(TypeError):
        BlobRef.from_dict([SHA, 5])


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"size": -1}, ValueError),
        ({"size": True}, TypeError),
        ({"size": 5.0}, TypeError),
        ({"sha256": SHA.upper()}, ValueError),
        ({"sha256": None}, TypeError),
        ({"media_type": ""}, ValueError),
        ({"media_type": "text/plain\n"}, ValueError),
        ({"namespace": b"run-1"}, TypeError),
    ],
)
def test_a_ref_with_a_bad_field_cannot_be_built(fields, error):
    with pytest.raises(error):
        BlobRef(**{"sha256": SHA, "size": 5, **fields})


def test_a_ref_is_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        BlobRef(SHA, 5).size = 6


# --- namespace encoding ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("namespace", "segment"),
    [
        ("run-0192ab_c", "run-0192ab_c"),
        ("", "~~"),
        ("..", "~2E~2E"),
        ("../x", "~2E~2E~2Fx"),
        ("a~b", "a~7Eb"),
        ("ü", "~C3~BC"),
        ("x" * 150, "x" * 150),
    ],
)
def test_a_namespace_becomes_one_safe_readable_segment(namespace, segment):
    assert namespace_segment(namespace) == segment


def test_a_namespace_too_long_for_a_file_name_is_hashed():
    assert namespace_segment("x" * 151) == "~~" + hashlib.sha256(b"x" * 151).hexdigest()


@given(st.text(), st.text())
def test_namespace_segments_are_safe_and_distinct(a, b):
    seg = namespace_segment(a)

    assert re.fullmatch(r"[A-Za-z0-9_~-]{1,150}", seg)
    assert seg not in (".", "..")
    assert (namespace_segment(b) == seg) == (a == b)


@given(st.text())
def test_a_segment_names_its_namespace_unless_it_is_a_hash(namespace):
    seg = namespace_segment(namespace)

    assert is_segment(seg)
    if len(seg) <= 150 and not (seg.startswith("~~") and namespace):
        assert segment_namespace(seg) == namespace
    else:
        assert segment_namespace(seg) is None  # a hash: the sweep compares segments


@pytest.mark.parametrize("name", [".", "..", "", "a/b", "~2e", "~41", "~~", "~~abc", "é", "~G0"])
def test_only_what_namespace_segment_makes_is_a_segment(name):
    made = name == "~~"  # the empty namespace's
    assert is_segment(name) == made
