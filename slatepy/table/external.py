"""Reading compacted SSTs that live in another store: a clone's shared SSTs (RFC 0017).

A clone's manifest references SSTs of its source database without copying them. Everything
that reads SSTs (the table reader of a writer or reader, the compactor, ``inspect``) reads
through the store it was given, so the routing lives in the store: :class:`ExternalSsts`
sends a read of ``compacted/{id}.sst`` for an external ``id`` to the store that holds it and
everything else (all writes, deletes and listings) to the clone's own store. So nothing the
clone does can write or delete under the source's location.

Which ids are external is learnt lazily: ``locate`` is called once, on the first read of a
compacted SST the own store does not have, so a database that is not a clone pays nothing.
External SSTs never exist in the own store (ids are fresh uuids), and nothing adds an
external SST to a clone after it is made, so the map, once loaded, never misses one a
process of the clone can still read. It may only hold too many: the clone's GC drops the
ids no active manifest references any more (and then the whole entry, releasing the
source's checkpoint; RFC 0017), and a map loaded before that keeps routing ids that nothing
reads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from slatepy.errors import NotFound, SlatepyError
from slatepy.store.base import ObjectMeta, ObjectStore, ObjectWriter, WrappingStore
from slatepy.store.local_read import KeptReads
from slatepy.table.layout import compacted_id

T = TypeVar("T")

Locate = Callable[[], Mapping[str, ObjectStore]]
"""Returns ``{sst id: the store holding compacted/{id}.sst}`` for the external SSTs."""


class ExternalSsts(WrappingStore):
    """``inner``, with reads of external compacted SSTs sent where they live."""

    def __init__(self, inner: ObjectStore, locate: Locate) -> None:
        super().__init__(inner)
        self._locate = locate
        self._where: Mapping[str, ObjectStore] | None = None
        self._lock = threading.Lock()

    def source_of(self, path: str) -> ObjectStore | None:
        """The other store ``path`` is read from, if it is an external SST (loads the map)."""
        sst_id = compacted_id(path)
        return None if sst_id is None else self._map().get(sst_id)

    def _map(self) -> Mapping[str, ObjectStore]:
        with self._lock:
            if self._where is None:
                self._where = dict(self._locate())
            return self._where

    def _read(self, path: str, read: Callable[[ObjectStore], T]) -> T:
        sst_id = compacted_id(path)
        if sst_id is None:
            return read(self.inner)
        where = self._where
        if where is not None:
            return read(where.get(sst_id, self.inner))
        try:
            return read(self.inner)
        except NotFound as missing:
            try:
                source = self._map().get(sst_id)
            except SlatepyError as failed:
                # Cannot tell (the store failed while we looked): the store's failure, not
                # the miss, which callers take for a lost SST (a clone's would read as
                # damage). Retries or a later read load the map again.
                raise failed from missing
            if source is None:
                raise
        return read(source)

    def kept_reads(self, path: str) -> KeptReads | None:
        """The shortcut of the store ``path`` is read from: the clone's own until the map is
        loaded (an external SST's first read loads it, as it misses in the own store, whose
        shortcut never serves a path it has no descriptor of)."""
        sst_id = compacted_id(path)
        where = self._where
        if sst_id is None or where is None:
            return self.inner.kept_reads(path)
        return where.get(sst_id, self.inner).kept_reads(path)

    def get(self, path: str) -> bytes:
        return self._read(path, lambda store: store.get(path))

    def get_range(self, path: str, start: int, end: int) -> bytes:
        return self._read(path, lambda store: store.get_range(path, start, end))

    def get_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return self._read(path, lambda store: store.get_ranges(path, ranges))

    def get_suffix(self, path: str, length: int) -> bytes:
        return self._read(path, lambda store: store.get_suffix(path, length))

    def head(self, path: str) -> ObjectMeta:
        return self._read(path, lambda store: store.head(path))

    def open_writer(self, path: str) -> ObjectWriter:
        """The own store's stream: writes are not routed, so a compaction output through a
        writer's stack streams as it is built instead of being buffered whole (up to
        ``target_sst_bytes``) by the base class's fallback (issue 33 item 4)."""
        return self.inner.open_writer(path)
