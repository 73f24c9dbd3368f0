"""The in-memory table of writes not yet in compacted SSTs.

A dict gives O(1) point lookups; an ordered key list is maintained lazily for scans: new
keys collect in an unsorted tail and are merged into the sorted list when a scan needs order
(sorting two sorted runs is a linear merge in timsort). Writers (and ``prune``) are
serialised by their caller; :meth:`get` may run concurrently with them.

Batches are all or nothing to :meth:`get` without a lock on the read path: :meth:`apply`
raises ``_batching`` for the duration of a multi-key batch and holds ``_batch_lock``; a get
that sees the flag waits for the batch. A get that missed the flag may see some of the
batch's keys, but then every later get sees the flag or the finished batch: if one get saw a
new value, no later get sees an old one. Except for a batch its merge operator fails, which
is undone (RFC 0026, stop 41): a get that missed the flag and read one of its keys between
its put and its undo saw a write that was never made (a window of a few bytecodes, while the
writer holds the GIL; a sequence counter around the read would close it, at a cost on every
get).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
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


_SEQ, _VALUE = itemgetter(0), itemgetter(1)


def value_cost(value: bytes | None) -> int:
    return 0 if value is None else VALUE_OVERHEAD + len(value)


def entry_cost(key: bytes, value: bytes | None) -> int:
    """The memory one memtable entry holds (see ``ENTRY_OVERHEAD``)."""
    return ENTRY_OVERHEAD + len(key) + value_cost(value)


def _overwrite_cost(keys: Iterable[bytes], olds: Iterable[Version]) -> int:
    """What ``Memtable.apply_versions`` counts too much for the keys it overwrites when it
    first counts every key as new: each one's entry overhead and key, and the value of its
    old version in ``olds`` (a tombstone has none)."""
    overwritten = list(keys)
    old_values: list[bytes] = list(filter(partial(is_not, None), map(_VALUE, olds)))
    return (
        ENTRY_OVERHEAD * len(overwritten)
        + sum(map(len, overwritten))
        + VALUE_OVERHEAD * len(old_values)
        + sum(map(len, old_values))
    )


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
        "_folded",
        "_new_keys",
        "_sorted",
        "_stacks",
        "compacted_version",
        "ingest_seq",
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
        self._folded: dict[bytes, tuple[int, Operands]] = {}
        """Per key whose uncompacted version is merge operands folded over a base here: the
        base's seq and the operands, so that an ingestion adopted later that is newer than
        the base becomes the base instead (:meth:`adopt_ingestion`)."""
        self.ingest_seq = 0
        """The newest ingestion's global seq the owner knows of (RFC 0016)."""
        self.compacted_version: Callable[[bytes], Version | None] | None = None
        """The newest compacted version of a key, for merge operands written over a version
        here that is older than an ingestion (see :meth:`ingested_bases`)."""

    def __len__(self) -> int:
        return len(self._data)

    def put(
        self,
        key: bytes,
        seq: int,
        value: bytes | None,
        bases: dict[bytes, Version] | None = None,
    ) -> None:
        """Record a version; a newer sequence number replaces an older one (merge operands
        stack on it instead: :meth:`Merging.stack`). ``bases``: what
        :meth:`ingested_bases` returned for the batch (None: look it up here)."""
        if value.__class__ is not Operands:
            self.put_version(key, (seq, value))
            return
        stacked, folded = self._stack(key, seq, self._data.get(key), value, bases)
        self.put_version(key, (seq, stacked))
        if folded is not None:
            self._folded[key] = folded

    def _ingested_base(self, key: bytes, old: Version | None) -> Version | None:
        """The compacted version of ``key`` newer than ``old``, an uncompacted version here
        older than the newest ingestion: that ingestion may hold the key, and then merge
        operands written now fold over its value, not over ``old`` (issue 29)."""
        lookup = self.compacted_version
        if lookup is None or old is None or old[0] <= self._compacted:
            return None
        if old[0] >= self.ingest_seq:
            return None
        found = lookup(key)
        if found is None or found[0] <= old[0] or found[1].__class__ is Operands:
            return None  # ingestions write values: compacted operands are another story
        return found

    def ingested_bases(self, entries: Iterable[Entry]) -> dict[bytes, Version]:
        """For the merge operands among ``entries``, the ingested versions they fold over
        instead of the version here (:meth:`_ingested_base`), looked up before a write is
        recorded anywhere, so that a failed lookup changes nothing. Empty (no lookup) unless
        an ingestion is newer than some version here."""
        bases: dict[bytes, Version] = {}
        if not self.ingest_seq or self.compacted_version is None:
            return bases
        for key, _, value in entries:
            if value.__class__ is Operands and key not in bases:
                base = self._ingested_base(key, self._data.get(key))
                if base is not None:
                    bases[key] = base
        return bases

    def put_version(self, key: bytes, version: Version) -> None:
        """Record ``version``, ``(seq, value)``, whose value is not merge operands still to
        stack (:meth:`put` stacks them first): the single write's path, given the tuple the
        writer also puts in its WAL buffer."""
        data = self._data
        old = data.get(key)
        value = version[1]
        if self._stacks and value.__class__ is not Operands:
            self._stacks.pop(key, None)  # a value ends the key's stack of operands
        if self._folded:
            self._folded.pop(key, None)  # put() records a fold again after this
        if old is None:
            self._new_keys.append(key)
            added = ENTRY_OVERHEAD + len(key)
        else:
            old_value = old[1]
            added = 0 if old_value is None else -VALUE_OVERHEAD - len(old_value)
        data[key] = version
        if value is not None:  # value_cost, inlined: this runs once per written entry
            added += VALUE_OVERHEAD + len(value)
        self.size_bytes += added

    def _stack(
        self,
        key: bytes,
        seq: int,
        old: Version | None,
        value: Operands,
        bases: dict[bytes, Version] | None = None,
    ) -> tuple[bytes, tuple[int, Operands] | None]:
        """The value that holds ``value`` written over ``old``, the stack of operands kept,
        and, if that value folds the operands over a base here, what :attr:`_folded` keeps
        for it."""
        if old is None or old[0] <= self._compacted:
            # Nothing here, or a version kept after its compaction, which may no longer be
            # the newest (an ingestion may have published a newer one since): the operands
            # stack on nothing here, and reads fold them over the compacted state, which
            # holds the kept version or a newer one.
            self._stacks[key] = [(seq, value)]
            return value, None
        earlier = self._folded.get(key)  # ``old`` is that fold's result
        base = self._ingested_base(key, old) if bases is None else bases.get(key)
        if base is not None and old[0] < base[0] < seq:
            old, earlier = base, None  # an ingestion published a newer version: over it
        ranges = self.ranges
        base_seq = old[0] if earlier is None else earlier[0]
        if ranges is not EMPTY and old[0] < ranges.seq_at(key):
            # Deleted by a range tombstone since: a base of nothing.
            old, earlier, base_seq = (old[0], None), None, ranges.seq_at(key)
        stacked = self.merging.stack(key, old[1], value)
        if stacked.__class__ is not Operands:  # a value: the operator merged over a base
            self._stacks.pop(key, None)
            operands = value if earlier is None else earlier[1].under(value)
            return stacked, (base_seq, operands)
        if old[1].__class__ is Operands:  # more operands on this memtable's stack
            self._stacks.setdefault(key, [(old[0], old[1])]).append((seq, value))
            return stacked, None
        self._stacks[key] = [(seq, value)]  # no operator: over a base, they replace it
        return stacked, None

    def adopt_ingestion(self, ingest_seq: int) -> int:
        """The owner adopted a view whose newest ingestion is ``ingest_seq``: operands folded
        here over a base older than an ingestion that holds their key are folded over the
        ingested value instead, as compaction and WAL replay fold them (issue 29). Looks up
        the keys of such folds only (one point read each). Returns how many changed."""
        known, self.ingest_seq = self.ingest_seq, max(self.ingest_seq, ingest_seq)
        lookup = self.compacted_version
        if ingest_seq <= known or not (self._folded or self._stacks) or lookup is None:
            return 0
        changed = self._refold_stacks(ingest_seq, lookup, known)
        for key, (base_seq, operands) in list(self._folded.items()):
            version = self._data.get(key)
            if version is None or not base_seq < ingest_seq or version[1] is None:
                continue
            if version[0] <= self._compacted:
                continue  # compacted: what compaction wrote (over_ingestions) stands
            try:
                found = lookup(key)
            except BaseException:
                self.ingest_seq = known  # the next adoption of this view tries again
                raise
            if found is None or not base_seq < found[0] < version[0]:
                continue
            if found[1].__class__ is Operands:
                continue  # ingestions write values: compacted operands are another story
            value = self.merging.stack(key, found[1], operands)
            self._folded[key] = (found[0], operands)
            self._data[key] = (version[0], value)
            self.size_bytes += len(value) - len(version[1])
            changed += 1
        return changed

    def _refold_stacks(
        self, ingest_seq: int, lookup: Callable[[bytes], Version | None], known: int
    ) -> int:
        """:meth:`adopt_ingestion` for stacks of operands written by several writes, the
        oldest older than the ingestion and the newest newer: those older than an ingested
        version of their key are dropped, and the rest fold over it."""
        changed = 0
        for key, chunks in list(self._stacks.items()):
            version = self._data.get(key)
            if version is None or len(chunks) < 2 or not chunks[0][0] < ingest_seq:
                continue
            if version[0] <= self._compacted:
                continue  # compacted: what compaction wrote (over_ingestions) stands
            try:
                found = lookup(key)
            except BaseException:
                self.ingest_seq = known  # the next adoption of this view tries again
                raise
            if found is None or found[1].__class__ is Operands:
                continue
            if not chunks[0][0] < found[0] < version[0]:
                continue
            operands = Operands(b"".join(c for s, c in chunks if s > found[0]))
            value = self.merging.stack(key, found[1], operands)
            if value.__class__ is Operands:
                continue  # no operator: they cannot be read anyway
            del self._stacks[key]
            self._folded[key] = (found[0], operands)
            self._data[key] = (version[0], value)
            self.size_bytes += len(value) - len(version[1] or b"")
            changed += 1
        return changed

    def apply(
        self,
        entries: Sequence[Entry],
        ranges: Sequence[RangeTombstone] = (),
        bases: dict[bytes, Version] | None = None,
    ) -> None:
        """Record a batch of versions and range tombstones, visible to :meth:`get` all at once
        (see the module); ``bases`` as :meth:`put` takes them."""
        if len(entries) == 1 and not ranges:
            self.put(*entries[0], bases)
            return
        with self._batch_lock:
            self._batching = True
            # A merge operator (user code) may raise midway: then the batch is taken back
            # before a get can see part of it (RFC 0026, stop 41). Only batches that merge pay.
            undo = self._undo(entries) if self.merging.operator is not None else None
            try:
                # Range tombstones first: a batch's own puts and merges come after its range
                # deletes (WriteBatch drops those before them), so merges stack on nothing.
                if ranges:
                    self.ranges = RangeIndex((*self.ranges.tombstones, *ranges))
                    self.size_bytes += sum(
                        ENTRY_OVERHEAD + len(t.start) + len(t.end) for t in ranges
                    )
                for key, seq, value in entries:
                    self.put(key, seq, value, bases)
            except BaseException:
                if undo is not None:
                    undo()
                raise
            finally:
                self._batching = False

    def _undo(self, entries: Sequence[Entry]) -> Callable[[], None] | None:
        """For a batch with merge operands, a function that puts back what applying it
        changes (its keys' versions, stacks and folds, the range tombstones and the counts);
        None for a batch without (nothing in it can raise)."""
        keys = {key for key, _, value in entries if value.__class__ is Operands}
        if not keys:
            return None
        keys = {key for key, _, _ in entries}
        data, stacks, folded = self._data, self._stacks, self._folded
        kept = [(k, data.get(k), list(stacks.get(k) or ()), folded.get(k)) for k in keys]
        ranges, size, new_keys = self.ranges, self.size_bytes, len(self._new_keys)

        def undo() -> None:
            for key, version, stack, fold in kept:
                if version is None:
                    data.pop(key, None)
                else:
                    data[key] = version
                if fold is None:
                    folded.pop(key, None)
                else:
                    folded[key] = fold
                if stack:
                    stacks[key] = stack
                else:
                    stacks.pop(key, None)
            del self._new_keys[new_keys:]  # a new key is appended once (put_version)
            self.ranges, self.size_bytes = ranges, size

        return undo

    def apply_versions(self, versions: dict[bytes, Version], payload: int | None = None) -> None:
        """Record a batch of versions with values (no tombstones, no merge operands), visible
        to :meth:`get` all at once like :meth:`apply`, by C-level maps rather than a
        :meth:`put` per entry; the same entries, key order of new keys and ``size_bytes`` as
        :meth:`apply`.

        Every version must be a new tuple with a seq above those held here (as a write's
        are): it then cannot be the object already held for its key, which is how the keys
        a batch adds are told from the ones it overwrites. ``payload`` is the length of the
        keys and values in ``versions`` when the caller knows it (else counted here).
        """
        if not versions:
            return
        data = self._data
        values = versions.values()
        if payload is None:
            payload = sum(map(len, versions)) + sum(map(len, map(_VALUE, values)))
        added = (ENTRY_OVERHEAD + VALUE_OVERHEAD) * len(versions) + payload  # all keys new
        with self._batch_lock:
            self._batching = True
            try:
                if self._stacks:  # plain values end a key's stack of operands (see put)
                    for key in versions:
                        self._stacks.pop(key, None)
                if self._folded:
                    for key in versions:
                        self._folded.pop(key, None)
                if next(iter(versions)) in data:
                    # The first key is here already, so likely most are: a pass to look the
                    # old versions up, then one to write over them.
                    olds: list[Version | None] = list(map(data.get, versions))
                    data.update(versions)
                    self._new_keys += compress(versions, map(not_, olds))  # a tuple is truthy
                    added -= _overwrite_cost(compress(versions, olds), filter(None, olds))
                else:
                    # Likely all new: one pass over the (large) dict inserts the new keys and
                    # returns the versions of the others (two passes for the batch above).
                    before = len(data)
                    held = list(map(data.setdefault, versions, values))
                    if len(data) - before == len(versions):  # all new (the common case)
                        self._new_keys += versions
                    else:
                        there = list(map(is_not, held, values))
                        self._new_keys += compress(versions, map(not_, there))
                        overwritten = list(compress(versions, there))
                        data.update(zip(overwritten, compress(values, there), strict=True))
                        added -= _overwrite_cost(overwritten, compress(held, there))
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
        half of it is held, so that passes stay rare; ``retain_bytes`` 0 drops every
        compacted version, those kept by earlier prunes included.

        The passes over the memtable are C-level maps and filters: this runs under the
        writer's lock.

        Returns how many keys were dropped or had compacted operands taken out.
        """
        max_seq = max(max_seq, self._compacted)  # kept versions are compacted too
        ranges_pruned = any(t.seq <= max_seq for t in self.ranges.tombstones)
        cutoff = max_seq  # compacted versions at or below it go
        if retain_bytes and not ranges_pruned:
            newest_dropped = self._retention_cutoff(max_seq, retain_bytes)
            floor_applied = floor_seq <= min(self._floor, self._compacted)
            if newest_dropped < 0 and not self._stacks and floor_applied:
                # Nothing to drop, so no pass: an earlier pass applied this floor to the
                # versions compacted before, and those compacted since are above it.
                self._compacted = max_seq
                return 0
            cutoff = min(max(floor_seq, newest_dropped), max_seq)
        self._floor, self._compacted = max(self._floor, floor_seq), max_seq
        data = self._data
        drop = list(compress(data, map(cutoff.__ge__, map(_SEQ, data.values()))))
        changed = 0
        if self._stacks:
            # Stacked operands: those of compacted writes are in the compacted state now,
            # so a compacted stack goes whole (kept, it would fold twice) and a newer one
            # loses its compacted chunks.
            stacks: dict[bytes, list[tuple[int, bytes]]] = {}
            for key, chunks in self._stacks.items():
                seq, value = data[key]
                if seq <= max_seq:
                    if seq > cutoff:
                        drop.append(key)
                    continue
                left = [c for c in chunks if c[0] > max_seq]
                stacks[key] = left
                if len(left) < len(chunks):
                    trimmed = Operands(b"".join(c for _, c in left))
                    data[key] = (seq, trimmed)
                    self.size_bytes += len(trimmed) - len(value)  # type: ignore[arg-type]
                    changed += 1
            self._stacks = stacks
        if ranges_pruned:
            gone = [t for t in self.ranges.tombstones if t.seq <= max_seq]
            ranges = [t for t in self.ranges.tombstones if t.seq > max_seq]
            self.ranges = RangeIndex(ranges) if ranges else EMPTY
            self.size_bytes -= sum(ENTRY_OVERHEAD + len(t.start) + len(t.end) for t in gone)
            changed += 1
        if drop:
            values = list(map(_VALUE, map(data.pop, drop)))
            self.size_bytes -= (
                ENTRY_OVERHEAD * len(drop)
                + sum(map(len, drop))
                + VALUE_OVERHEAD * (len(values) - values.count(None))
                + sum(map(len, filter(None, values)))  # None and b"" add nothing
            )
            self._sorted = list(filter(data.__contains__, self._sorted))
            self._new_keys = list(filter(data.__contains__, self._new_keys))
        if self._folded:  # a compacted fold is compaction's to get right (over_ingestions)
            self._folded = {
                k: r for k, r in self._folded.items() if k in data and data[k][0] > max_seq
            }
        if retain_bytes and self.size_bytes > retain_bytes and cutoff < max_seq:
            # Newer versions cost more than the older ones dropped: drop the rest.
            return len(drop) + changed + self.prune(max_seq)
        return len(drop) + changed

    def _retention_cutoff(self, max_seq: int, retain_bytes: int) -> int:
        """The highest seq of compacted versions to drop so that about half of
        ``retain_bytes`` stays held (-1: drop none). Entries are taken to cost the same:
        the number dropped is proportional to the bytes over (:meth:`prune` drops the rest
        if that was not enough)."""
        size = self.size_bytes
        if size <= retain_bytes:
            return -1
        seqs = sorted(map(_SEQ, self._data.values()))  # in C; nearly sorted already
        count = min(len(seqs), -(-len(seqs) * (size - retain_bytes // 2) // size))
        return min(seqs[count - 1], max_seq) if count else -1

    def get(self, key: bytes) -> Version | None:
        if self._batching:
            with self._batch_lock:
                return self._data.get(key)
        return self._data.get(key)

    def get_many(self, keys: list[bytes]) -> list[Version | None]:
        """:meth:`get` of each of ``keys``, all seeing a batch whole."""
        with self._batch_lock:
            return list(map(self._data.get, keys))

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
