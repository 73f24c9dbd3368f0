"""The typed read accessors of a catalog state, over its generic ``entries`` (RFC 0028 §1)."""

from __future__ import annotations

from typing import Any

import msgspec

from slatepy.catalog.objects import (
    AuditEvent,
    Database,
    Shard,
    ShardKey,
    Sink,
    Source,
    StorageUsage,
    collection,
)


class TypedReads:
    """Mixed into :class:`slatepy.catalog.state.CatalogState`: each collection as its
    Structs, and the config, settings and id allocators as plain maps."""

    def entries(self, name: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        raise NotImplementedError

    def typed(self, name: str) -> list[tuple[Any, Any]]:
        """Every ``(key, value)`` of a collection as its Structs (see ``objects.py``)."""
        coll = collection(name)
        return [
            (msgspec.convert(k, coll.key), msgspec.convert(v, coll.value))
            for k, v in self.entries(name)
        ]

    def databases(self) -> list[tuple[int, Database]]:
        return [(k.id, v) for k, v in self.typed("databases")]

    def sources(self) -> list[tuple[int, Source]]:
        return [(k.id, v) for k, v in self.typed("sources")]

    def sinks(self) -> list[tuple[int, Sink]]:
        return [(k.id, v) for k, v in self.typed("sinks")]

    def shards(self) -> list[tuple[ShardKey, Shard]]:
        return self.typed("shards")

    def audit_log(self) -> list[tuple[int, AuditEvent]]:
        """Every audit event, oldest first (read from storage: it is not cached)."""
        return [(k.id, v) for k, v in self.typed("audit_log")]

    def storage_usage(self) -> list[tuple[int, StorageUsage]]:
        return [(k.id, v) for k, v in self.typed("storage_usage")]

    def config(self, key: str) -> int | None:
        for k, v in self.entries("config"):
            if k["key"] == key:
                return int(v["value"])
        return None

    def deploy_generation(self) -> int | None:
        """Config ``deploy_generation`` (readable before opening; None: uninitialized)."""
        return self.config("deploy_generation")

    def settings(self) -> dict[str, str]:
        return {k["name"]: v["value"] for k, v in self.entries("settings")}

    def system_configurations(self) -> dict[str, str]:
        return {k["name"]: v["value"] for k, v in self.entries("system_configurations")}

    def id_allocators(self) -> dict[str, int]:
        return {k["name"]: v["next_id"] for k, v in self.entries("id_allocators")}
