"""Compaction outputs: the SSTs one compaction writes, cut at ``target_sst_bytes`` and
streamed to the store while they are built (``slatepy.compactor.executor`` feeds them).

Each output is a :class:`~slatepy.table.sst_output.StreamedSst`: it holds about
``SEND_BYTES`` of finished blocks before they are sent, so memory holds about one part of an
SST, not the whole of it (RFC 0011). Outputs are written under ``compacted/`` with fresh
random ids; they become part of the database only when the manifest update publishing them
succeeds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from slatepy.compactor.planner import CompactionPolicy
from slatepy.format.block import Entry
from slatepy.format.compression import Compression
from slatepy.format.kinds import RangeTombstone
from slatepy.format.sst import EncodedSst
from slatepy.manifest.record import SstHandle, handle_of
from slatepy.store.base import ObjectStore
from slatepy.table.priority import FOREGROUND
from slatepy.table.sst_output import StreamedSst, put_new_sst

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
        lookup_index: bool = True,
        hand_off: Callable[[], bool] = lambda: True,
    ) -> None:
        self._store = store
        self._target = policy.target_sst_bytes
        self._drop = drop_tombstones
        self._block_size = block_size
        self._bits = bloom_bits_per_key
        self._compression: Compression = compression
        self._level = compression_level
        self._lookup = lookup_index
        self._hand_off = hand_off
        """Whether yield points hand the GIL off now (``Foreground.yield_to``)."""
        self.handles: list[SstHandle] = []
        self.output: StreamedSst | None = None
        self.count = 0
        """Entries added so far."""

    def _open(self) -> StreamedSst:
        self.output = StreamedSst(
            self._store,
            block_size=self._block_size,
            bloom_bits_per_key=self._bits,
            compression=self._compression,
            compression_level=self._level,
            lookup_index=self._lookup,
        )
        return self.output

    def add_entries(self, entries: Iterable[Entry]) -> None:
        """Add entries in key order, one at a time (tombstones go when dropping them)."""
        count, drop, target = self.count, self._drop, self._target
        try:
            for key, seq, value in entries:
                if count % YIELD_EVERY == 0:
                    # Let the writer's threads have the GIL: a thread back from its WAL PUT
                    # would otherwise wait out the interpreter's 5 ms switch interval (RFC 0006),
                    # and a durable write in progress goes first (table/priority.py).
                    FOREGROUND.yield_to(hand_off=self._hand_off())
                    if self.output is not None:
                        self.output.send_if_due()
                count += 1
                if value is None and drop:
                    continue
                output = self.output
                if output is not None and output.builder.estimated_size >= target:
                    self.handles.append(_handle(output))
                    self.output = output = None
                if output is None:
                    output = self._open()
                output.builder.add(key, seq, value)
        finally:
            self.count = count

    def add_plain(self, keys: list[bytes], seqs: list[int], values: list[bytes]) -> None:
        """Add plain entries in key order, after those added before, in bulk."""
        FOREGROUND.yield_to(hand_off=self._hand_off())  # as add_entries does
        output = self.output
        if output is not None:
            output.send_if_due()
        target = self._target
        begin = 0
        while begin < len(keys):
            if output is not None and output.builder.estimated_size >= target:
                self.handles.append(_handle(output))
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
            self.handles.append(_handle(self.output))
            self.output = None
        return self.handles

    def abort(self) -> None:
        """Abort the output being written, if any (nothing once :meth:`finish` ran)."""
        if self.output is not None:
            self.output.abort()
            self.output = None


def store_sst(store: ObjectStore, encoded: EncodedSst) -> SstHandle:
    """Write ``encoded`` (whole, not empty) under a fresh id in ``compacted/``; return its
    handle."""
    return handle_of(put_new_sst(store, encoded.data), encoded)


def _handle(output: StreamedSst) -> SstHandle:
    return handle_of(output.id, output.finish())
