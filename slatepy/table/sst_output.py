"""SSTs written into ``compacted/`` under fresh random ids: streamed while they are built
(a compaction's outputs, a bulk load's SSTs), or put whole.

A streamed SST sends its finished data blocks (``ObjectStore.open_writer``) once
:data:`SEND_BYTES` of them are buffered, so memory holds about one part of an SST, not the
whole of it (RFC 0011). Written with an overwrite: the id is a fresh uuid4, and the SST
becomes part of the database only when the manifest update naming it succeeds.
"""

from __future__ import annotations

import uuid

from slatepy.format.compression import Compression
from slatepy.format.sst import EncodedSst, SstBuilder
from slatepy.store.base import ObjectStore, PutData
from slatepy.store.cas import create_if_absent
from slatepy.table.layout import compacted_path

SEND_BYTES = 8 * 1024 * 1024
"""Finished data blocks a streamed SST buffers before they are sent to the store."""


class StreamedSst:
    """One SST on its way to ``compacted/{id}``: add entries through :attr:`builder`, call
    :meth:`send_if_due` between additions, then :meth:`finish` (or :meth:`abort`)."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        block_size: int,
        bloom_bits_per_key: int,
        compression: Compression = "none",
        compression_level: int = 0,
        lookup_index: bool = True,
    ) -> None:
        self.id = uuid.uuid4().hex
        self.builder = SstBuilder(
            writer_epoch=0,
            block_size=block_size,
            bloom_bits_per_key=bloom_bits_per_key,
            compression=compression,
            compression_level=compression_level,
            lookup_index=lookup_index,
        )
        self._writer = store.open_writer(compacted_path(self.id))

    def send_if_due(self) -> None:
        """Send the finished blocks once :data:`SEND_BYTES` of them are buffered."""
        if self.builder.buffered_bytes >= SEND_BYTES:
            self._writer.write(self.builder.take_data())

    def finish(self) -> EncodedSst:
        """Finish the SST and complete its object; the encoded SST (its meta)."""
        encoded = self.builder.finish()
        self._writer.write(encoded.data)
        self._writer.commit()
        return encoded

    def abort(self) -> None:
        """Abandon the object (nothing of it is left)."""
        self._writer.abort()


def put_new_sst(store: ObjectStore, data: PutData) -> str:
    """Create ``data`` (a whole SST) under a fresh id in ``compacted/``; return the id."""
    sst_id = uuid.uuid4().hex
    if create_if_absent(store, compacted_path(sst_id), data) is not None:
        raise RuntimeError(f"compacted SST id collision: {sst_id}")  # a uuid4 collision
    return sst_id
