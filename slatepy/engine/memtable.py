"""The in-memory table of writes not yet in compacted SSTs.

A dict gives O(1) point lookups; an ordered key list is maintained lazily for scans: new
keys collect in an unsorted tail and are merged into the sorted list when a scan needs order
(sorting two sorted runs is a linear merge in timsort). Writers (and ``prune``) are
serialised by their caller; :meth:`get` may run concurrently with them.

Batches are all or nothing to :meth:`get` without a lock on the read path: :meth:`apply`
raises ``_batching`` for the duration of a multi-key batch and holds ``_batch_lock``; a get
that sees the flag waits for the batch. A get that missed the flag may see some of the
batch's keys, but then every later get sees the flag or the finished batch: if one get saw a
new value, no later get sees an old one.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Sequence
from functools import partial
from itertools import compress
from operator import is_not, itemgetter, not_

from slatepy.format.block import Entry
from slatepy.format.kinds import Operands, RangeTombstone
from slatepy.table.merge_operator import NO_MERGING, Merging
from slatepy.table.visibility import EMPTY, RangeIndex

Version = tuple[int, bytes | None]
"""``(seq, value)``; ``value`` None is a tombstone."""

ENTRY_OVERHEAD = 168
"""Memory one entry costs beyond its key bytes and its value (CPython 3.11, 64-bit, measured
with ``tracemalloc`` over 20,000-200,000 entries of 16-byte keys): the key's ``bytes`` header
(33, rounded up by the allocator), the ``(seq, value)`` tuple (56 + 16 of GC header), the
``seq`` int (32), the dict slot (its share of the hash table) and the ordered key list's slot
(8). ``size_bytes`` counts it so that ``max_unflushed_bytes`` bounds the memory the memtable
really holds: with 16-byte keys and 100-byte values the old estimate (payload + 64 B) counted
55 % of it (RFC 0011)."""

VALUE_OVERHEAD = 48
"""A value's ``bytes`` header (33) and the allocator's rounding; a tombstone has none."""


_VALUE = itemgetter(1)


def value_cost(value: bytes | None) -> int:
    return 0 if value is None else VALUE_OVERHEAD + len(value)


def entry_cost(key: bytes, value: bytes | None) -> int:
    """The memory one memtable entry holds (see ``ENTRY_OVERHEAD``)."""
    return ENTRY_OVERHEAD + len(key) + value_cost(value)


class Memtable:
    """Latest version per key, with ordered range reads.

    ``size_bytes`` is the memory the entries hold, Python object overhead included
    (``entry_cost``); the writer's backpressure compares it with ``max_unflushed_bytes``.
    """

    __slots__ = (
        "_batch_lock",
        "_batching",
        "_compacted",
        "_data",
        "_floor",
        "_new_keys",
        "_sorted",
        "_stacks",
        "merging",
        "ranges",
        "size_bytes",
    )

    def __init__(self, merging: Merging = NO_MERGING) -> None:
        self._batch_lock = threading.Lock()
        self._batching = False
        self._data: dict[bytes, Version] = {}
        self._sorted: list[bytes] = []
        self._new_keys: list[bytes] = []
        self.size_bytes = 0
        self._compacted = 0  # max_seq of the last prune
        self._floor = 0  # the highest floor_seq a prune applied
        self.ranges: RangeIndex = EMPTY
        """Range tombstones written here (RFC 0019); replaced, never changed in place, so a
        reader that took it holds a consistent set."""
        self.merging = merging
        """How merge operands written over a version here combine with it."""
        self._stacks: dict[bytes, list[tuple[int, bytes]]] = {}
        """Per key whose version is stacked merge operands: each write's operands with its
        seq, so :meth:`prune` can take out exactly those now compacted."""

    def __len__(self) -> int:
        return len(self._data)

    def put(self, key: bytes, seq: int, value: bytes | None) -> None:
        """Record a version; a newer sequence number replaces an older one (merge operands
        stack on it instead: :meth:`Merging.stack`)."""
        old = self._data.get(key)
        if value.__class__ is Operands:
            value = self._stack(key, seq, old, value)
        elif self._stacks:
            self._stacks.pop(key, None)
        if old is None:
            self._new_keys.append(key)
            self.size_bytes += ENTRY_OVERHEAD + len(key)
        else:
            old_value = old[1]
            if old_value is not None:
                self.size_bytes -= VALUE_OVERHEAD + len(old_value)
        self._data[key] = (seq, value)
        if value is not None:  # value_cost, inlined: this runs once per written entry
            self.size_bytes += VALUE_OVERHEAD + len(value)

    def _stack(self, key: bytes, seq: int, old: Version | None, value: Operands) -> bytes:
        """The value that holds ``value`` written over ``old``, the stack of operands kept."""
        if old is None:
            self._stacks[key] = [(seq, value)]
            return value
        ranges = self.ranges
        if ranges is not EMPTY and old[0] < ranges.seq_at(key):
            old = (old[0], None)  # deleted by a range tombstone since: a base of nothing
        stacked = self.merging.stack(key, old[1], value)
        if stacked.__class__ is not Operands:  # a value: the operator merged over a base
            self._stacks.pop(key, None)
            return stacked
        if old[1].__class__ is Operands:  # more operands on this memtable's stack
            self._stacks.setdefault(key, [(old[0], old[1])]).append((seq, value))
            return stacked
        self._stacks[key] = [(seq, value)]  # no operator: over a base, they replace it
        return stacked

    def apply(self, entries: Sequence[Entry], ranges: Sequence[RangeTombstone] = ()) -> None:
        """Record a batch of versions and range tombstones, visible to :meth:`get` all at once
        (see the module)."""
        if len(entries) == 1 and not ranges:
            self.put(*entries[0])
            return
        with self._batch_lock:
            self._batching = True
            try:
                # Range tombstones first: a batch's own puts and merges come after its range
                # deletes (WriteBatch drops those before them), so merges stack on nothing.
                if ranges:
                    self.ranges = RangeIndex((*self.ranges.tombstones, *ranges))
                    self.size_bytes += sum(
                        ENTRY_OVERHEAD + len(t.start) + len(t.end) for t in ranges
                    )
                for key, seq, value in entries:
                    self.put(key, seq, value)
            finally:
                self._batching = False

    def apply_versions(self, versions: dict[bytes, Version]) -> None:
        """Record a batch of versions with values (no tombstones, no merge operands), visible
        to :meth:`get` all at once like :meth:`apply`, by C-level maps and one
        ``dict.update`` rather than a :meth:`put` per entry; the same entries, key order of
        new keys and ``size_bytes`` as :meth:`apply`."""
        data = self._data
        olds = list(map(data.get, versions))
        new_keys = list(compress(versions, map(not_, olds)))  # a version tuple is truthy
        old_values = list(filter(partial(is_not, None), map(_VALUE, filter(None, olds))))
        values = list(map(_VALUE, versions.values()))
        added = (
            ENTRY_OVERHEAD * len(new_keys)
            + sum(map(len, new_keys))
            + VALUE_OVERHEAD * (len(values) - len(old_values))
            + sum(map(len, values))
            - sum(map(len, old_values))
        )
        with self._batch_lock:
            self._batching = True
            try:
                if self._stacks:  # plain values end a key's stack of operands (see put)
                    for key in versions:
                        self._stacks.pop(key, None)
                data.update(versions)
                self._new_keys += new_keys
                self.size_bytes += added
            finally:
                self._batching = False

    def prune(self, max_seq: int, *, retain_bytes: int = 0, floor_seq: int = 0) -> int:
        """Drop versions with ``seq <= max_seq`` (they now live in compacted SSTs), but keep
        the newest of them while the memtable holds at most ``retain_bytes``.

        Kept compacted versions serve reads of recent writes from memory, as a RocksDB or
        SlateDB memtable does until it is flushed (RFC 0011, "Retention"). Only plain values
        and point tombstones newer than ``floor_seq`` (the view's last ingestion, which may
        hold newer versions) are kept, and none once a compacted range tombstone is pruned:
        compaction may then drop the tombstone with what it covers, and a kept version under
        it would come back. Stacked merge operands are always pruned exactly, or a read
        would fold them twice. Over ``retain_bytes``, the oldest compacted versions go until
        a quarter of it is free, so that the next few writes do not pay for another pass.

        Returns how many keys were dropped.
        """
        cutoff = max_seq  # compacted versions at or below it go
        ranges_pruned = any(t.seq <= max_seq for t in self.ranges.tombstones)
        if retain_bytes and not ranges_pruned:
            newest_dropped = self._retention_cutoff(max_seq, retain_bytes)
            floor_applied = floor_seq <= min(self._floor, self._compacted)
            if newest_dropped < 0 and not self._stacks and floor_applied:
                # Nothing to drop, so no pass: an earlier pass applied this floor to the
                # versions compacted before, and those compacted since are above it.
                self._compacted = max_seq
                return 0
            cutoff = max(floor_seq, newest_dropped)
        self._floor, self._compacted = max(self._floor, floor_seq), max_seq
        if cutoff < max_seq:
            kept = {
                k: v
                for k, v in self._data.items()
                if v[0] > max_seq or (v[0] > cutoff and v[1].__class__ is not Operands)
            }
        else:
            kept = {k: v for k, v in self._data.items() if v[0] > max_seq}
        dropped = len(self._data) - len(kept)
        if self._stacks:
            # Stacked operands: those of compacted writes are in the compacted state now.
            stacks: dict[bytes, list[tuple[int, bytes]]] = {}
            for key, chunks in self._stacks.items():
                if key in kept:
                    left = [c for c in chunks if c[0] > max_seq]
                    stacks[key] = left
                    if len(left) < len(chunks):
                        kept[key] = (kept[key][0], Operands(b"".join(c for _, c in left)))
                        dropped += 1  # the sizes below are recounted
            self._stacks = stacks
        if self.ranges:
            ranges = [t for t in self.ranges.tombstones if t.seq > max_seq]
            if len(ranges) < len(self.ranges.tombstones):
                self.ranges = RangeIndex(ranges) if ranges else EMPTY
                dropped += 1  # the sizes below are recounted
        if dropped:
            self._data = kept
            self._sorted = [k for k in self._sorted if k in kept]
            self._new_keys = [k for k in self._new_keys if k in kept]
            self.size_bytes = sum(entry_cost(k, v[1]) for k, v in kept.items()) + sum(
                ENTRY_OVERHEAD + len(t.start) + len(t.end) for t in self.ranges.tombstones
            )
        return dropped

    def _retention_cutoff(self, max_seq: int, retain_bytes: int) -> int:
        """The highest seq of compacted versions to drop so that about three quarters of
        ``retain_bytes`` stay held (-1: drop none). Entries are assumed of equal cost: the
        number dropped is proportional to the bytes over."""
        size = self.size_bytes
        if size <= retain_bytes:
            return -1
        compacted = sorted(v[0] for v in self._data.values() if v[0] <= max_seq)
        if not compacted:
            return -1
        over = size - retain_bytes * 3 // 4
        count = min(len(compacted), -(-len(self._data) * over // size))
        return compacted[count - 1]

    def get(self, key: bytes) -> Version | None:
        if self._batching:
            with self._batch_lock:
                return self._data.get(key)
        return self._data.get(key)

    def range(self, start: bytes, end: bytes | None) -> list[Entry]:
        """Entries with ``start <= key < end`` (``end`` None = unbounded), tombstones included."""
        if self._new_keys:
            self._new_keys.sort()
            self._sorted = sorted(self._sorted + self._new_keys)
            self._new_keys = []
        keys = self._sorted
        lo = bisect_left(keys, start)
        hi = len(keys) if end is None else bisect_left(keys, end, lo)
        data = self._data
        return [(k, *data[k]) for k in keys[lo:hi]]

    def frozen_copy(self) -> Memtable:
        """A copy holding the same versions that later writes and prunes leave unchanged
        (a snapshot's memtable, RFC 0020). Shallow: keys and values are immutable bytes, so
        copying the dict and the key lists is enough (a C-speed copy, no per-entry Python).
        Call it where writers are excluded (the writer's lock)."""
        copy = Memtable(self.merging)
        copy.ranges = self.ranges  # replaced, never changed in place
        copy._stacks = {key: list(chunks) for key, chunks in self._stacks.items()}
        copy._data = dict(self._data)
        copy._sorted = list(self._sorted)
        copy._new_keys = list(self._new_keys)
        copy.size_bytes = self.size_bytes
        return copy
