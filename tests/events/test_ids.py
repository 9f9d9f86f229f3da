"""Derived ids are uuid5 texts: ``derive_id`` computes them itself (faster), and must
give exactly what ``uuid.uuid5`` gives, or every id ever written would change."""

from __future__ import annotations

import random
import uuid

from aaa_django.events import derive_id
from aaa_django.events.ids import _NAMESPACE


def test_derive_id_is_uuid5_of_the_joined_parts():
    rnd = random.Random(19)
    alphabet = "abcXYZ019-_.:\x1f é λ 😀 \u2028"
    for _ in range(5000):
        parent = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 40)))
        parts = [
            rnd.choice(
                [
                    "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 30))),
                    rnd.randint(-(10**12), 10**12),
                    None,
                    ("tool", rnd.randint(0, 9)),
                ]
            )
            for _ in range(rnd.randint(0, 4))
        ]
        key = "\x1f".join([parent, *(str(p) for p in parts)])
        assert derive_id(parent, *parts) == str(uuid.uuid5(_NAMESPACE, key))


def test_a_derived_id_is_a_version_5_uuid():
    value = uuid.UUID(derive_id("run-1", "aaa.run.completed"))
    assert value.version == 5 and value.variant == uuid.RFC_4122
    assert derive_id("run-1", "aaa.run.completed") == "%s" % value
