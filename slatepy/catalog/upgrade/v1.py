"""Catalog schema version 1, frozen: never change these types (RFC 0028 §5).

Version 1 kept a source's upstream as ``url``, password included, and had no
``storage_usage`` id allocator. Only what differs from later versions is restated here, and
nothing is imported from the current objects.
"""

from __future__ import annotations

import msgspec

VERSION = 1


class SourceV1(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    kind: str
    url: str = ""
    data_shard: str = ""
    remap_shard: str = ""
    options: dict[str, str] = {}


def initial_objects() -> dict[str, dict[bytes, bytes]]:
    """What a new version-1 catalog held (for tests that make an old catalog)."""
    enc = msgspec.json.encode
    return {
        "config": {
            enc({"key": "catalog_version"}): enc({"value": VERSION}),
            enc({"key": "deploy_generation"}): enc({"value": 0}),
        },
        "id_allocators": {
            enc({"name": kind}): enc({"next_id": 1})
            for kind in ("database", "source", "sink", "audit_log")
        },
    }
