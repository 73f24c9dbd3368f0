"""Change data capture: the committed writes of a database, in commit order, from its WAL.

``WalReader(url).iter(from_seq=...)`` reads the WAL SSTs (``wal/{id:020}.sst``) in id order
and yields each write as a :class:`WalRecord` ``(seq, key, value, wal_id, kind, ...)``, for
replication and change feeds. With ``follow=True`` it then polls for new WAL SSTs until
closed. It writes nothing to the store (read-only credentials suffice) and needs no writer
running.

What the feed holds (RFC 0018, "Change data capture"):

* **Every kind of write, decoded.** Puts (with their expiry if written with a TTL), deletes,
  merges (their operands) and range deletes (RFC 0019), each saying which it is
  (``WalRecord.kind``); :meth:`WalRecord.add_to` applies one to a ``WriteBatch``.
* **Committed writes only, in commit order.** A WAL SST exists only once its writes are
  acknowledged as durable; the reader follows the contiguous run of SSTs and waits at a gap
  (an SST still in flight under ``max_parallel_writes``). Seqs increase with WAL ids (one
  writer assigns them under a lock; a new writer starts above everything it replayed), and
  within one SST the records are sorted by seq, a seq's range deletes first, then its point
  writes by key: a batch (one seq) is yielded contiguously and whole (it always lands in one
  SST), in the order its writes apply.
* **Net changes per WAL SST.** The WAL keeps one entry per key within one SST (one group
  commit): the last write, with later merge operands stacked on it (combined with a value
  beneath them by the merge operator). An earlier write to the same key, superseded before
  its SST was written, is not in the feed (nor in the database). Range deletes are all kept.
  Applying the feed record by record in order reproduces the database at every SST boundary
  (``wal_id`` changes), which is what a replica needs; it is not an audit log of every call.
  A batch one of whose keys was overwritten in the same SST shows up without that key.
* **Writes through the WAL only.** Bulk loads (RFC 0016: ``publish_ingest``; odd seqs)
  bypass the WAL and are not in the feed.
* **History is bounded by GC.** WAL SSTs below the manifest's ``wal_id_last_compacted`` are
  deleted by the garbage collector once no active manifest needs them (at least
  ``gc_min_age``, an hour by default, after compaction). Asking for writes older than what
  is left raises :class:`WalHistoryGone`, as does a follower that falls that far behind.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Generator, Iterator
from operator import attrgetter
from pathlib import Path
from typing import Literal, Self

import msgspec

from slatepy.closing import Closing
from slatepy.config import SettingsLike, resolve_settings
from slatepy.engine.batch import WriteBatch
from slatepy.engine.startup import decode_wal_sst
from slatepy.errors import ClosedError, InvalidArgument, NotFound, SlatepyError
from slatepy.format.kinds import Expiring, Operands, RangeTombstone
from slatepy.format.sst_index import SstProperties
from slatepy.manifest.store import ManifestStore
from slatepy.store.base import ObjectStore
from slatepy.store.metrics import MetricsStore
from slatepy.store.numbered import NumberedObjects, contiguous_end
from slatepy.store.retry import with_retries
from slatepy.store.url import open_store
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX
from slatepy.table.reader import TableReader

FIRST_WAL_ID = 1
"""The id of a database's first WAL SST (its first writer's fence)."""
MAX_POLL_INTERVAL = 60.0
"""Longest poll interval a follower accepts (seconds)."""

StartAt = int | Literal["oldest", "end"]
"""Where a feed starts: records with ``seq >= n``; ``"oldest"``: the oldest write the WAL
still holds (so no :class:`WalHistoryGone` at the start); ``"end"``: only writes committed
from now on."""

_by_seq = attrgetter("seq")


Kind = Literal["put", "delete", "merge", "delete_range"]
"""What a :class:`WalRecord` records (RFC 0019's kinds of writes)."""


class WalRecord(msgspec.Struct, frozen=True, gc=False):
    """One committed write. Records of one batch share ``seq``; ``wal_id`` is the WAL SST that
    holds it (records of one SST are one unit of the feed).

    ``kind`` says what to do with it (see :meth:`add_to`, which does it):

    * ``"put"``: set ``key`` to ``value``; ``expire_at_ms`` (wall clock, ms since the epoch)
      when it was written with a TTL, else None. ``value`` is the value as written (the
      expiry is not in it).
    * ``"delete"``: remove ``key``; ``value`` is None.
    * ``"merge"``: add ``operands`` to ``key``, oldest first (several when merges to the key
      shared a WAL SST); ``value`` is the newest of them.
    * ``"delete_range"``: remove every key ``key <= k < end``; ``value`` is None. It applies
      before the point writes of its own seq (its batch's), which the feed yields after it.

    A record built from the first four fields alone is a put, or a delete if ``value`` is
    None, as every record was before the other kinds existed. (A frozen msgspec Struct, not
    persisted: C-level construction, which is most of the feed's cost per record.)
    """

    seq: int
    key: bytes
    value: bytes | None
    wal_id: int
    kind: Kind = "put"
    expire_at_ms: int | None = None
    operands: tuple[bytes, ...] = ()
    end: bytes | None = None

    def __post_init__(self) -> None:
        if self.value is None and self.kind == "put":
            msgspec.structs.force_setattr(self, "kind", "delete")

    def add_to(self, batch: WriteBatch, *, now_ms: int) -> WriteBatch:
        """Add the write this record holds to ``batch`` (returned): applying a feed's records
        in order this way, one batch per record or per :meth:`WalReader.iter_ssts` list,
        reproduces the database it came from.

        Args:
            now_ms: The clock (ms since the epoch) of the database ``batch`` will be written
                to, as its ``write`` will read it: a TTL put is added with the ttl that
                expires at ``expire_at_ms`` from then (exactly when the clock has not moved;
                later by the ms it moved otherwise), or as a delete once ``expire_at_ms`` has
                passed (both read as absent, and a merge over either applies to nothing). The
                target must have no ``default_ttl`` and, for merges, the same merge operator.
        """
        kind, key = self.kind, self.key
        if kind == "put":
            assert self.value is not None
            expire = self.expire_at_ms
            if expire is None:
                return batch.put(key, self.value)
            if expire <= now_ms:
                return batch.delete(key)
            # Db.put's expiry is now + ceil(ttl * 1000) ms; half a ms below the exact ttl
            # survives the float round trip (the exact one overshoots by 1 ms for ~0.6% of
            # values).
            return batch.put(key, self.value, ttl=(expire - now_ms - 0.5) / 1000)
        if kind == "delete":
            return batch.delete(key)
        if kind == "merge":
            for operand in self.operands:
                batch.merge(key, operand)
            return batch
        assert self.end is not None
        return batch.delete_range(key, self.end)


def _record(key: bytes, seq: int, value: bytes | None, wal_id: int) -> WalRecord:
    """The record of a WAL entry, its kind decoded from the value's class
    (``slatepy.format.kinds``)."""
    if value is None or value.__class__ is bytes:
        return WalRecord(seq, key, value, wal_id)
    if isinstance(value, Expiring):
        return WalRecord(seq, key, value.value, wal_id, expire_at_ms=value.expire_at_ms)
    if isinstance(value, Operands):
        operands = tuple(value.operands())
        newest = operands[-1] if operands else b""
        return WalRecord(seq, key, newest, wal_id, "merge", operands=operands)
    return WalRecord(seq, key, bytes(value), wal_id)


def _range_record(tombstone: RangeTombstone, wal_id: int) -> WalRecord:
    return WalRecord(
        tombstone.seq, tombstone.start, None, wal_id, "delete_range", end=tombstone.end
    )


def _order(record: WalRecord) -> tuple[int, int]:
    """Sort key: by seq, a seq's range deletes (rank 0) before its point writes (rank 1)."""
    return record.seq, 0 if record.kind == "delete_range" else 1


def _holds_writes(props: SstProperties) -> bool:
    """True if a WAL SST holds a write: an entry or a range tombstone (a fence holds none)."""
    return bool(props.entry_count or props.range_tombstones)


def _min_seq(props: SstProperties) -> int:
    """The lowest seq of a WAL SST that holds writes (``min_seq`` counts entries only)."""
    seqs = [t.seq for t in props.range_tombstones]
    if props.entry_count:
        seqs.append(props.min_seq)
    return min(seqs)


class WalHistoryGone(SlatepyError):
    """The WAL no longer holds the writes asked for: the garbage collector deleted the WAL
    SSTs that held them (after compacting them into the database).

    Attributes:
        from_seq: The seq asked for.
        first_wal_id: The oldest WAL SST still there.
        first_seq: The oldest seq it holds (None: it holds no write yet).
    """

    def __init__(
        self, message: str, *, from_seq: int, first_wal_id: int, first_seq: int | None
    ) -> None:
        super().__init__(message)
        self.from_seq = from_seq
        self.first_wal_id = first_wal_id
        self.first_seq = first_seq


class WalReader(Closing):
    """Reads a database's committed writes from its WAL; see the module docstring.

    Safe to use from one thread at a time per iterator; :meth:`close` may be called from any
    thread and ends every following iterator at its next poll (within ``poll_interval``).

    Args:
        url: The database's location, or a store instance.
        settings: Store options and ``reader_poll_interval`` (the default poll interval): a
            ``Settings``, a dict or a TOML path, resolved as ``Db.open`` does.

    Raises:
        NotFound: no database at ``url``.
    """

    def __init__(self, url: str | ObjectStore, *, settings: SettingsLike = None) -> None:
        self._settings = resolve_settings(settings)
        inner = url if isinstance(url, ObjectStore) else open_store(url, self._settings)
        # No disk cache: a feed reads each WAL SST once.
        self.store = MetricsStore(
            with_retries(
                inner, self._settings.request_attempts, give_up_after=self._settings.store_timeout
            )
        )
        self._wal = NumberedObjects(self.store, WAL_DIR, WAL_SUFFIX)
        self._manifests = ManifestStore(self.store)
        self._closed = threading.Event()
        if self._manifests.latest_id() is None:
            raise NotFound(f"no slatepy database at {self.store.url}", path="manifest/")

    @classmethod
    def open(
        cls, url: str | os.PathLike[str] | ObjectStore, *, settings: SettingsLike = None
    ) -> Self:
        """Open a feed of the database at ``url`` (a path-like names a local directory), as
        ``Db.open`` and ``DbReader.open`` do; the preferred form of ``WalReader(url)``.

        Raises:
            NotFound: no database at ``url``.
        """
        location = Path(url).resolve().as_uri() if isinstance(url, os.PathLike) else url
        return cls(location, settings=settings)

    def close(self) -> None:
        """Stop every following iterator (at its next poll); idempotent."""
        self._closed.set()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def last_seq(self) -> int:
        """The seq of the newest write in the WAL's contiguous run now (0: none).

        To start a replica: note ``last_seq()``, copy the database (a ``DbReader`` scan),
        then apply ``iter(last_seq + 1, follow=True)``: every write the copy missed is
        after that seq, and the ones it also holds are applied again in order (an in-order
        replay of puts, deletes and range deletes converges on the same state; merges do
        not: one the copy holds would be applied twice, so with merges copy while no merge
        is written).
        """
        ids = self._wal.ids()
        if not ids:
            return 0
        tables = TableReader(self.store, cache_bytes=1 << 20)
        first, end = self._live_run(ids)
        for wal_id in range(end - 1, first - 1, -1):
            props = tables.top(self._wal.path(wal_id)).props
            if _holds_writes(props):
                return props.max_seq
        return 0

    def iter(
        self,
        from_seq: StartAt = "oldest",
        *,
        follow: bool = False,
        poll_interval: float | None = None,
    ) -> Iterator[WalRecord]:
        """The committed writes with ``seq >= from_seq``, in commit order.

        Args:
            from_seq: Where to start (:data:`StartAt`). A consumer resuming after the last
                record it applied passes that record's ``seq + 1``.
            follow: After the WAL's current end, keep polling for new WAL SSTs (and wait at
                a gap) until :meth:`close`; otherwise stop at the end (or the first gap).
            poll_interval: Seconds between polls (default ``reader_poll_interval``; at most
                :data:`MAX_POLL_INTERVAL`).

        Raises:
            WalHistoryGone: ``from_seq`` is older than what the WAL still holds (checked
                before the first record), or a follower fell behind the garbage collector.
            CorruptionError: a WAL SST is damaged (naming it).
            InvalidArgument: a bad ``from_seq`` or ``poll_interval``.
            ClosedError: the reader was closed before the iteration started (closing it
                later ends the iteration quietly).
        """
        for batch in self.iter_ssts(from_seq, follow=follow, poll_interval=poll_interval):
            yield from batch

    def iter_ssts(
        self,
        from_seq: StartAt = "oldest",
        *,
        follow: bool = False,
        poll_interval: float | None = None,
    ) -> Generator[list[WalRecord], None, None]:
        """:meth:`iter`, one list per WAL SST (empty SSTs skipped): a consumer that applies
        each list atomically never exposes part of a batch, nor a state the database never
        had at an SST boundary."""
        # The setting is only the default (a DbReader's, often longer): capped, not refused.
        interval = (
            min(self._settings.reader_poll_interval, MAX_POLL_INTERVAL)
            if poll_interval is None
            else poll_interval
        )
        if not 0 < interval <= MAX_POLL_INTERVAL:
            raise InvalidArgument(f"poll_interval must be in (0, {MAX_POLL_INTERVAL}] seconds")
        if not (from_seq in ("oldest", "end") or (type(from_seq) is int and from_seq >= 0)):
            raise InvalidArgument(f"from_seq must be a seq >= 0, 'oldest' or 'end': {from_seq!r}")
        if self._closed.is_set():
            raise ClosedError("the WAL reader is closed; open another one")
        next_id, min_seq = self._start(from_seq)
        while not self._closed.is_set():
            ids = self._wal.ids(after=next_id - 1)
            end = contiguous_end(ids, next_id)
            for wal_id in range(next_id, end):
                records = self._read(wal_id, min_seq)
                next_id = wal_id + 1
                if records:
                    yield records
            if ids and ids[-1] > end:  # a gap at ``end``: still being written, or deleted?
                self._check_not_collected(end, min_seq)
            if not follow:
                return
            self._closed.wait(interval)

    def _start(self, from_seq: StartAt) -> tuple[int, int]:
        """``(first WAL id to read, lowest seq to yield)``; raises :class:`WalHistoryGone`."""
        ids = self._wal.ids()
        if not ids:  # a database whose first writer has not fenced yet
            return FIRST_WAL_ID, 0 if from_seq in ("oldest", "end") else int(from_seq)
        first, end = self._live_run(ids)
        if from_seq == "oldest":
            return first, 0
        if from_seq == "end":
            return end, 0
        assert isinstance(from_seq, int)
        start = self._first_holding(from_seq, first, end)
        if first > FIRST_WAL_ID:
            first_seq = self._first_seq(first, end)
            # Deleted SSTs held seqs below first_seq, and at most the compacted seq: from a
            # seq at or above either bound nothing is missing. Writers' seqs are even, so an
            # odd from_seq (a consumer's last seq + 1) means the even seq after it.
            wanted = from_seq + (from_seq & 1)
            if (first_seq is None or wanted < first_seq) and wanted <= self._compacted_seq():
                raise _gone(from_seq, first, first_seq)
        return start, from_seq

    def _live_run(self, ids: list[int]) -> tuple[int, int]:
        """``(first, end)`` of the contiguous run of WAL SSTs the feed follows, of the listed
        ``ids``: the run through the manifest's ``wal_id_last_compacted`` (the writer never
        deletes the WAL from there on). Below it GC may have left islands: a checkpoint keeps
        the WAL from its manifest's ``wal_id_last_compacted`` to its ``wal_id`` only (RFC
        0017), so older SSTs may survive below a hole; the feed starts above the hole."""
        listed = set(ids)
        stored = self._manifests.load()
        floor = 0 if stored is None else stored.manifest.wal_id_last_compacted
        if floor not in listed:  # a new database, or GC raced the listing: the first run
            return ids[0], contiguous_end(ids, ids[0])
        first = floor
        while first - 1 in listed:
            first -= 1
        return first, contiguous_end(ids, first)

    def _first_holding(self, seq: int, lo: int, hi: int) -> int:
        """The first WAL id in ``[lo, hi)`` from which on the SSTs hold seqs >= ``seq``
        (``hi`` if none does): a binary search reading O(log n) SST tails, as max seqs grow
        with ids. An empty (fencing) SST counts as its next non-empty neighbour."""
        tables = TableReader(self.store, cache_bytes=1 << 20)

        def max_seq_from(wal_id: int) -> int | None:
            for probe in range(wal_id, hi):
                props = tables.top(self._wal.path(probe)).props
                if _holds_writes(props):
                    return props.max_seq
            return None

        while lo < hi:
            mid = (lo + hi) // 2
            found = max_seq_from(mid)
            if found is None or found >= seq:  # None: nothing from mid on, so not after it
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _first_seq(self, first: int, end: int) -> int | None:
        """The lowest seq in the first non-empty SST of ``[first, end)``."""
        tables = TableReader(self.store, cache_bytes=1 << 20)
        for wal_id in range(first, end):
            props = tables.top(self._wal.path(wal_id)).props
            if _holds_writes(props):
                return _min_seq(props)
        return None

    def _compacted_seq(self) -> int:
        stored = self._manifests.load()
        return 0 if stored is None else stored.manifest.max_compacted_seq()

    def _read(self, wal_id: int, min_seq: int) -> list[WalRecord]:
        """WAL SST ``wal_id``'s records with seq >= ``min_seq``, in seq order: within a seq
        (a batch) its range deletes (by start), then its point writes (by key), as replay and
        a live write apply them (``Memtable.apply``)."""
        path = self._wal.path(wal_id)
        try:
            data = self._wal.read(wal_id)
        except NotFound:
            # Listed a moment ago: only the garbage collector deletes WAL SSTs.
            self._check_not_collected(wal_id, min_seq)
            raise
        meta, entries = decode_wal_sst(path, data)
        records = [
            _record(key, seq, value, wal_id) for key, seq, value in entries if seq >= min_seq
        ]
        ranges = [_range_record(t, wal_id) for t in meta.props.range_tombstones if t.seq >= min_seq]
        if not ranges:
            records.sort(key=_by_seq)  # stable: a batch's entries stay in key order
            return records
        # Stable: ranges come sorted by start, entries by key. A range tombstone deletes the
        # versions below its seq, so an entry of this SST with a lower seq is deleted by it
        # (it was written before), one with its seq or above is not: seq order says exactly
        # that to a consumer applying records one by one.
        return sorted(ranges + records, key=_order)

    def _check_not_collected(self, wal_id: int, from_seq: int) -> None:
        """Raise :class:`WalHistoryGone` if WAL SST ``wal_id`` is missing because it was
        compacted and collected (rather than still being written)."""
        stored = self._manifests.load()
        if stored is not None and wal_id <= stored.manifest.wal_id_last_compacted:
            ids = self._wal.ids(after=wal_id)
            first = ids[0] if ids else wal_id + 1
            end = contiguous_end(ids, first)
            raise _gone(from_seq, first, self._first_seq(first, end), behind=wal_id)


def _gone(
    from_seq: int, first_wal_id: int, first_seq: int | None, *, behind: int | None = None
) -> WalHistoryGone:
    where = (
        f"WAL SST {behind} was garbage collected before this reader got to it"
        if behind is not None
        else f"the WAL SSTs before {first_wal_id} were garbage collected (after compaction)"
    )
    oldest = f"seq {first_seq}" if first_seq is not None else "no write yet"
    return WalHistoryGone(
        f"{where}, so writes from seq {from_seq} on may be gone; the oldest WAL SST left is "
        f"{first_wal_id}, holding {oldest}. If the last write you applied came from WAL SST "
        f"{first_wal_id - 1} or later, nothing is missing: resume with from_seq="
        f"{first_seq if first_seq is not None else 'end'}. Otherwise copy the database again "
        "(a scan) and then follow from the seq the WAL held before the copy started; keep "
        "a consumer within gc_min_age of the writer to avoid this.",
        from_seq=from_seq,
        first_wal_id=first_wal_id,
        first_seq=first_seq,
    )
