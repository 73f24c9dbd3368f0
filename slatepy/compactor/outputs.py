"""Compaction outputs: the SSTs one compaction writes, cut at ``target_sst_bytes`` and
streamed to the store while they are built (``slatepy.compactor.executor`` feeds them).

An output holds about ``SEND_BYTES`` of finished blocks before they are sent, so memory
holds about one part of an SST, not the whole of it (RFC 0011). Outputs are written under
``compacted/`` with fresh random ids; they become part of the database only when the
manifest update publishing them succeeds.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence

from slatepy.compactor.planner import CompactionPolicy
from slatepy.format.block import Entry
from slatepy.format.compression import Compression
from slatepy.format.kinds import RangeTombstone
from slatepy.format.sst import EncodedSst, SstBuilder
from slatepy.manifest.record import SstHandle
from slatepy.store.base import ObjectStore
from slatepy.store.cas import create_if_absent
from slatepy.table.layout import compacted_path

SEND_BYTES = 8 * 1024 * 1024
"""Finished data blocks an output SST buffers before they are streamed to the store."""
YIELD_EVERY = 128


class OutputWriter:
    """The outputs of one compaction as entries arrive: cut at ``policy.target_sst_bytes``
    before an entry once the open output's estimated size reached it, so an output ends
    only when another entry follows (the last output is still open for the range
    tombstones). Entries added in bulk (:meth:`add_plain`) cut exactly where one at a time
    (:meth:`add_entries`) would."""

    def __init__(
        self,
        store: ObjectStore,
        policy: CompactionPolicy,
        *,
        drop_tombstones: bool,
        block_size: int,
        bloom_bits_per_key: int,
        compression: Compression,
        compression_level: int,
    ) -> None:
        self._store = store
        self._target = policy.target_sst_bytes
        self._drop = drop_tombstones
        self._block_size = block_size
        self._bits = bloom_bits_per_key
        self._compression: Compression = compression
        self._level = compression_level
        self.handles: list[SstHandle] = []
        self.output: _Output | None = None
        self.count = 0
        """Entries added so far."""

    def _open(self) -> _Output:
        self.output = _Output(
            self._store,
            self._block_size,
            self._bits,
            compression=self._compression,
            compression_level=self._level,
        )
        return self.output

    def add_entries(self, entries: Iterable[Entry]) -> None:
        """Add entries in key order, one at a time (tombstones go when dropping them)."""
        count, drop, target = self.count, self._drop, self._target
        try:
            for key, seq, value in entries:
                if count % YIELD_EVERY == 0:
                    # Let the writer's threads have the GIL: a thread back from its WAL PUT
                    # would otherwise wait out the interpreter's 5 ms switch interval (RFC 0006).
                    time.sleep(0)
                    if self.output is not None:
                        self.output.send_if_due()
                count += 1
                if value is None and drop:
                    continue
                output = self.output
                if output is not None and output.builder.estimated_size >= target:
                    self.handles.append(output.finish())
                    self.output = output = None
                if output is None:
                    output = self._open()
                output.builder.add(key, seq, value)
        finally:
            self.count = count

    def add_plain(self, keys: list[bytes], seqs: list[int], values: list[bytes]) -> None:
        """Add plain entries in key order, after those added before, in bulk."""
        time.sleep(0)  # as add_entries does
        output = self.output
        if output is not None:
            output.send_if_due()
        target = self._target
        begin = 0
        while begin < len(keys):
            if output is not None and output.builder.estimated_size >= target:
                self.handles.append(output.finish())
                self.output = output = None
            if output is None:
                output = self._open()
            begin = output.builder.extend_below(keys, seqs, values, begin, target)
        self.count += len(keys)

    def finish(self, range_tombstones: Sequence[RangeTombstone]) -> list[SstHandle]:
        """Finish the last output, with ``range_tombstones`` unless dropping them (an
        output of none but them if need be); return every output's handle."""
        if range_tombstones and not self._drop:
            output = self.output or self._open()
            for tombstone in range_tombstones:
                output.builder.add_range_tombstone(tombstone)
        if self.output is not None:
            self.handles.append(self.output.finish())
            self.output = None
        return self.handles

    def abort(self) -> None:
        """Abort the output being written, if any (nothing once :meth:`finish` ran)."""
        if self.output is not None:
            self.output.abort()
            self.output = None


class _Output:
    """One output SST on its way to ``compacted/`` under a fresh random id: finished data
    blocks are streamed out (``ObjectStore.open_writer``) once ``SEND_BYTES`` of them are
    buffered, so memory holds about one part of the SST, not the whole of it (RFC 0011).

    Written with an overwrite: the id is a fresh uuid4, and the SST becomes part of the
    database only when the manifest update naming it succeeds.
    """

    def __init__(
        self,
        store: ObjectStore,
        block_size: int,
        bloom_bits_per_key: int,
        *,
        compression: Compression = "none",
        compression_level: int = 0,
    ) -> None:
        self.id = uuid.uuid4().hex
        self.builder = SstBuilder(
            writer_epoch=0,
            block_size=block_size,
            bloom_bits_per_key=bloom_bits_per_key,
            compression=compression,
            compression_level=compression_level,
        )
        self._writer = store.open_writer(compacted_path(self.id))

    def send_if_due(self) -> None:
        if self.builder.buffered_bytes >= SEND_BYTES:
            self._writer.write(self.builder.take_data())

    def finish(self) -> SstHandle:
        encoded = self.builder.finish()
        self._writer.write(encoded.data)
        self._writer.commit()
        return handle_of(self.id, encoded)

    def abort(self) -> None:
        self._writer.abort()


def store_sst(store: ObjectStore, encoded: EncodedSst) -> SstHandle:
    """Write ``encoded`` (whole, not empty) under a fresh id in ``compacted/``; return its
    handle."""
    sst_id = uuid.uuid4().hex
    if create_if_absent(store, compacted_path(sst_id), encoded.data) is not None:
        raise RuntimeError(f"compacted SST id collision: {sst_id}")  # a uuid4 collision
    return handle_of(sst_id, encoded)


def handle_of(sst_id: str, encoded: EncodedSst) -> SstHandle:
    """The manifest's handle of the SST ``encoded`` written as ``compacted/{sst_id}``."""
    props = encoded.meta.props
    first, last = props.first_key, props.last_key
    if first is None or last is None:
        # Range tombstones only: the handle needs a key range; the tombstones' first start
        # serves (reads find range tombstones through the handle's list, not by key).
        assert props.range_tombstones, "an SST with neither entries nor range tombstones"
        first = last = props.range_tombstones[0].start
    return SstHandle(
        sst_id,
        encoded.meta.object_size,
        first,
        last,
        props.entry_count,
        props.max_seq,
        range_tombstones=props.range_tombstones,
    )
