"""A shard's state as one process knows it: loaded from a rollup and the consensus diffs after
it, caught up incrementally, and rolled up again when due (RFC 0015 §4.2, §4.3).

:class:`Versions` holds the cached :class:`State`, the consensus entry that produced it (the
next diff's ``prev_digest`` is that entry's digest) and the sizes of the entries since the
latest rollup (what ``gc_rules.rollup_due`` weighs). It does no locking: the
:class:`~slatepy.persist.machine.ShardMachine` that owns it serializes every call.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from slatepy.errors import CorruptionError, NotFound
from slatepy.persist.config import PersistSettings
from slatepy.persist.ids import rollup_key
from slatepy.persist.location.consensus import Consensus, VersionedData
from slatepy.persist.state.diff import apply, check_chain, decode_state_diff
from slatepy.persist.state.gc_rules import rollup_due
from slatepy.persist.state.records import RollupRef, State, decode_rollup, encode_rollup
from slatepy.persist.state.transitions import check_step
from slatepy.store.base import ObjectStore

SCAN_LIMIT = 256
"""Entries read per consensus ``scan`` while catching up."""

SIZE_GROUPS = 512
"""Groups of entry sizes a :class:`Versions` keeps at most (see :class:`_Sizes`)."""

ROLLUP_LOAD_ATTEMPTS = 3
"""Cold loads tried when the rollup a head names is gone (GC raced the load) before the
load fails with ``CorruptionError``."""


def shard_path(shard_id: str, key: str) -> str:
    """The blob path of ``key`` (a part or rollup key relative to the shard, RFC §5.2)."""
    return f"shards/{shard_id}/{key}"


def entry_path(shard_id: str, seqno: int) -> str:
    """How errors name a consensus entry (the object-store log's own path for it)."""
    return f"consensus/{shard_id}/{seqno:020}.diff"


@dataclass(frozen=True, slots=True)
class Applied:
    """A consensus entry this process applied while catching up (its bytes identify it)."""

    seqno: int
    data: bytes


class Versions:
    """The cached state of one shard, and how to move it forward from consensus.

    Invariants: ``entry`` is the consensus entry at ``state.seqno`` (None only at seqno 0);
    every state was reached from a rollup or the initial state by diffs whose digest chain
    was checked; ``sizes`` holds the byte size of every applied entry after the latest
    rollup's seqno.
    """

    def __init__(
        self,
        shard_id: str,
        consensus: Consensus,
        blob: ObjectStore,
        settings: PersistSettings,
        *,
        validate: bool = False,
    ) -> None:
        self.shard_id = shard_id
        self.consensus = consensus
        self.blob = blob
        self.settings = settings
        self.validate = validate
        self.state = State.initial(shard_id)
        self.entry: bytes | None = None
        self.loaded = False
        self.replayed = 0
        """Diffs the last cold load replayed (a rollup is due past ``rollup_replay_limit``)."""
        self._sizes = _Sizes()
        self.seen: list[Applied] | None = None
        """While not None, every entry applied is appended here (the applier sets it for a
        command: an entry it applied before a later page of a catch-up failed may be the
        command's own commit, and must not be forgotten with the failed call's result)."""
        self.confirmed = time.monotonic()
        """When the cached state was last seen to be the log's head or written by us (a
        monotonic time): the applier re-reads a head older than ``consensus_min_age / 2``
        before it CASes from it (RFC §3.2 (b), create-after-truncate)."""

    # -- moving forward ---------------------------------------------------------------

    def refresh(self) -> list[Applied]:
        """Catch up to the consensus head (linearized: one ``head`` call, then the missing
        diffs); a first call, or a cache below the log's truncation point, loads cold.
        Returns the entries applied, oldest first (empty after a cold load).

        Raises:
            CorruptionError: an undecodable entry or rollup, a broken digest chain, or a log
                that lost entries this process had seen.
            StoreUnavailable: consensus or blob could not be reached.
        """
        head = self.consensus.head(self.shard_id)
        self.confirmed = time.monotonic()
        if not self.loaded:
            self._load(head)
            return []
        if head is None:
            if self.state.seqno:
                raise CorruptionError(
                    f"shard {self.shard_id!r}: the consensus log is empty but this process saw "
                    f"seqno {self.state.seqno}",
                    path=entry_path(self.shard_id, self.state.seqno),
                )
            return []
        if head.seqno < self.state.seqno:
            raise CorruptionError(
                f"shard {self.shard_id!r}: the consensus head went back from "
                f"{self.state.seqno} to {head.seqno}",
                path=entry_path(self.shard_id, head.seqno),
            )
        if head.seqno == self.state.seqno:
            if head.data != self.entry:
                raise CorruptionError(
                    f"shard {self.shard_id!r}: the consensus entry at {head.seqno} changed",
                    path=entry_path(self.shard_id, head.seqno),
                )
            return []
        return self.catch_up(head.seqno)

    def catch_up(self, target: int, first: VersionedData | None = None) -> list[Applied]:
        """Apply the entries after the cached state up to at least ``target`` (``first``:
        an entry already read, e.g. a lost CAS's ``Mismatch.current``). A log truncated past
        the cache is loaded cold instead (returning no entries)."""
        applied: list[Applied] = []
        if first is not None and first.seqno == self.state.seqno + 1:
            self.apply_entry(first.seqno, first.data)
            applied.append(Applied(first.seqno, first.data))
        while self.state.seqno < target:
            entries = self.consensus.scan(self.shard_id, self.state.seqno + 1, SCAN_LIMIT)
            if not entries:
                break
            if entries[0].seqno != self.state.seqno + 1:
                # Truncated past our cache: only a rollup can bridge the gap.
                self._load(self.consensus.head(self.shard_id))
                return []
            for entry in entries:
                self.apply_entry(entry.seqno, entry.data)
                applied.append(Applied(entry.seqno, entry.data))
        return applied

    def apply_entry(self, seqno: int, data: bytes) -> None:
        """Apply the consensus entry ``data`` at ``seqno`` (the next one) to the cache.

        Raises:
            CorruptionError: it does not decode, follow the cached state or its digest chain.
        """
        path = entry_path(self.shard_id, seqno)
        diff = decode_state_diff(data, path=path)
        if diff.seqno_to != seqno:
            raise CorruptionError(f"persist diff {diff.seqno_to} found at seqno {seqno}", path=path)
        check_chain(self.entry, diff, path=path)
        try:
            new = apply(self.state, diff)
        except CorruptionError as exc:
            raise CorruptionError(str(exc), path=path) from exc
        self.advance(new, data)
        if self.seen is not None:
            self.seen.append(Applied(seqno, data))

    def advance(self, new: State, data: bytes) -> None:
        """Make ``new`` (the state the entry ``data`` produced) the cached state."""
        if self.validate:
            check_step(self.state, new)
            new.validate()
        before = self.state.latest_rollup()
        self.state, self.entry = new, data
        self.confirmed = time.monotonic()
        self._sizes.add(new.seqno, len(data))
        latest = new.latest_rollup()
        if latest != before and latest is not None:
            self._sizes.drop_through(latest[0])

    # -- cold loads ---------------------------------------------------------------------

    def _load(self, head: VersionedData | None) -> None:
        for attempt in range(1, ROLLUP_LOAD_ATTEMPTS + 1):
            if head is None:
                self.state, self.entry, self._sizes = State.initial(self.shard_id), None, _Sizes()
                self.loaded, self.replayed = True, 0
                return
            diff = decode_state_diff(head.data, path=entry_path(self.shard_id, head.seqno))
            if diff.latest_rollup is None:
                self.state, self.entry, self._sizes = State.initial(self.shard_id), None, _Sizes()
                start = 1
            else:
                seqno, ref = diff.latest_rollup
                try:
                    self._load_rollup(seqno, ref)
                except NotFound:
                    if attempt < ROLLUP_LOAD_ATTEMPTS:  # a newer head names a newer rollup
                        head = self.consensus.head(self.shard_id)
                    continue
                start = seqno + 1
            self.loaded = True
            self._replay_from(start, head.seqno)
            return
        raise CorruptionError(
            f"shard {self.shard_id!r}: the rollup named by the consensus head is missing after "
            f"{ROLLUP_LOAD_ATTEMPTS} tries",
            path=entry_path(self.shard_id, head.seqno) if head else None,
        )

    def _load_rollup(self, seqno: int, ref: RollupRef) -> None:
        path = shard_path(self.shard_id, ref.key)
        state = decode_rollup(self.blob.get(path), path=path)
        if state.seqno != seqno or state.shard_id != self.shard_id:
            raise CorruptionError(
                f"rollup of {state.shard_id}@{state.seqno} registered as {self.shard_id}@{seqno}",
                path=path,
            )
        # The next diff's chain starts at the entry at the rollup's seqno, which GC keeps.
        entries = self.consensus.scan(self.shard_id, seqno, 1)
        if not entries or entries[0].seqno != seqno:
            raise CorruptionError(
                f"shard {self.shard_id!r}: the consensus entry of rollup {seqno} is gone",
                path=entry_path(self.shard_id, seqno),
            )
        self.state, self.entry, self._sizes = state, entries[0].data, _Sizes()

    def _replay_from(self, start: int, head: int) -> None:
        before = self.state.seqno
        if self.state.seqno + 1 != start:
            raise CorruptionError(f"shard {self.shard_id!r}: replay from {start} is not contiguous")
        while self.state.seqno < head:
            entries = self.consensus.scan(self.shard_id, self.state.seqno + 1, SCAN_LIMIT)
            if not entries or entries[0].seqno != self.state.seqno + 1:
                raise CorruptionError(
                    f"shard {self.shard_id!r}: consensus entry {self.state.seqno + 1} is missing "
                    "(truncated without a rollup?)",
                    path=entry_path(self.shard_id, self.state.seqno + 1),
                )
            for entry in entries:
                self.apply_entry(entry.seqno, entry.data)
        self.replayed = self.state.seqno - before

    # -- rollups ------------------------------------------------------------------------

    def rollup_due(self) -> bool:
        """Whether this process should write a rollup of its cached state now: the diff
        bytes since the latest rollup reach its size (RFC §4.3), or the last cold load
        replayed more than ``rollup_replay_limit`` diffs."""
        if not self.state.seqno:
            return False
        if self.replayed > self.settings.rollup_replay_limit:
            return True
        latest = self.state.latest_rollup()
        return rollup_due(
            latest[1].size if latest else 0, self._sizes.bytes, self._sizes.count, self.settings
        )

    def write_rollup(self) -> tuple[int, RollupRef]:
        """Write the cached state as a rollup blob; returns its seqno and reference (to be
        registered with the ``add_rollup`` transition)."""
        self.replayed = 0
        data = encode_rollup(self.state)
        ref = RollupRef(rollup_key(self.state.seqno), len(data))
        self.blob.put(shard_path(self.shard_id, ref.key), data)
        return self.state.seqno, ref


class _Sizes:
    """Byte sizes of the entries applied after the latest rollup, in bounded memory.

    Entries are kept in groups ``[last seqno, bytes, count]``, oldest first; past
    :data:`SIZE_GROUPS` groups the older half is folded into one. A new rollup drops the
    groups whose last seqno it covers (a group straddling it stays whole: the rollup
    heuristic then fires a little early, never late). Before, a process whose rollups kept
    failing (or that never wrote one) kept one dict item per entry for ever (issue 27)."""

    def __init__(self) -> None:
        self._groups: deque[list[int]] = deque()
        self.bytes = 0
        self.count = 0

    def __len__(self) -> int:
        return len(self._groups)

    def add(self, seqno: int, size: int) -> None:
        self._groups.append([seqno, size, 1])
        self.bytes += size
        self.count += 1
        if len(self._groups) > SIZE_GROUPS:
            folded = [0, 0, 0]
            for _ in range(SIZE_GROUPS // 2):
                last, size_, count = self._groups.popleft()
                folded = [last, folded[1] + size_, folded[2] + count]
            self._groups.appendleft(folded)

    def drop_through(self, seqno: int) -> None:
        """Forget the groups of entries at or before ``seqno`` (a rollup's)."""
        while self._groups and self._groups[0][0] <= seqno:
            _, size, count = self._groups.popleft()
            self.bytes -= size
            self.count -= count
