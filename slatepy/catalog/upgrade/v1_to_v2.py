"""Version 1 -> 2, frozen (RFC 0028 §5): a source's ``url`` becomes ``connection`` without its
password (no secrets in the catalog), plus an empty ``location``; the ``storage_usage`` id
allocator is added. A pure function of the objects; its types are its own."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import msgspec

from slatepy.catalog.upgrade.v1 import SourceV1


class SourceV2(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    kind: str
    connection: str = ""
    location: str = ""
    data_shard: str = ""
    remap_shard: str = ""
    options: dict[str, str] = {}


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    netloc = f"{userinfo.partition(':')[0]}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def migrate(objects: dict[str, dict[bytes, bytes]]) -> dict[str, dict[bytes, bytes]]:
    """The version-2 objects of version-1 ``objects`` (which it does not change)."""
    out = {name: dict(entries) for name, entries in objects.items()}
    sources = out.get("sources", {})
    for key, raw in sources.items():
        old = msgspec.json.decode(raw, type=SourceV1)
        new = SourceV2(
            name=old.name,
            kind=old.kind,
            connection=_without_password(old.url),
            data_shard=old.data_shard,
            remap_shard=old.remap_shard,
            options=old.options,
        )
        sources[key] = msgspec.json.encode(new)
    allocators = out.setdefault("id_allocators", {})
    allocators.setdefault(msgspec.json.encode({"name": "storage_usage"}), b'{"next_id":1}')
    return out
