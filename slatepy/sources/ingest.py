"""The in-process ingest: a source reclocked into a remap shard and written into data shards,
resumed and committed upstream at the resumption frontier (RFC 0027).

One step (:meth:`Ingest.step`) polls the source and then, in this order:

1. **mint**: when the source's progress passed the newest binding, bind it at a new time
   ``ts`` (``max(remap upper, now in ms)``) with one ``compare_and_append`` on the remap
   shard: ``[R, ts + 1)``;
2. **data**: for each data shard whose upper is behind the newest time whose offsets have all
   been read, append the buffered updates at their bound times with one
   ``compare_and_append``: ``[D, U)``;
3. every ``commit_interval`` seconds, **commit**: the timestamp resumption frontier ``T`` is
   the meet of the uppers of every data shard and the remap shard; it inverts to the offset
   resumption frontier ``O(T - 1)``, which the source commits upstream; the remap shard's
   since (a critical since hold) follows to ``T - 1``.

A restart loads the bindings from the remap shard and reads the source from ``O(T - 1)``:
what is re-read gets the times the remap shard already binds, so each data shard is written
exactly once per time whatever step a crash interrupted (the RFC's crash-point table).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from slatepy.errors import SlatepyError
from slatepy.persist import PersistClient, SinceHandle, Update, UpperMismatch, WriteHandle
from slatepy.persist.frontier import meet
from slatepy.sources import remap
from slatepy.sources.base import (
    Chunk,
    OffsetFrontier,
    Progress,
    Source,
    SourceReader,
    frontier_join,
    frontier_le,
    zero,
)
from slatepy.sources.errors import (
    IngestConflict,
    OffsetOutOfRange,
    SchemaChanged,
    SlotLost,
    SourceError,
    SourceUnavailable,
)

log = logging.getLogger(__name__)

Hook = Callable[[str], None]
"""Called with ``"remap-appended"``, ``"data-appended"`` and ``"committed"`` after each such
step (the crash tests kill the process there)."""

SINCE_HOLDER = "ingest"
"""The critical reader id of the ingest's since hold on its remap shard."""


@dataclass
class Stats:
    """What :meth:`Ingest.stats` reports."""

    rows: int
    remap_upper: int
    data_uppers: list[int]
    resumption: int
    offsets: OffsetFrontier
    committed: OffsetFrontier
    lag: int | None


def remap_shard_of(shard: str) -> str:
    """The remap shard of an ingest into ``shard``."""
    return f"{shard}.remap"


def data_shards_of(shard: str, outputs: Sequence[str]) -> list[str]:
    """The data shard of each output: ``shard`` itself for a single output, else
    ``shard.<output>`` (a table ``public.orders`` is ``shard.public.orders``)."""
    if len(outputs) == 1:
        return [shard]
    return [f"{shard}.{name}" for name in outputs]


def holders(client: PersistClient, handle: WriteHandle) -> str:
    """The other writers of ``handle``'s shard, as their handles describe themselves
    (``host:pid purpose``), for an :class:`IngestConflict` message: best effort, as it is
    read while that error is raised (a failing read must not replace it)."""
    try:
        state = client.machine(handle.shard_id).fetch()
    except SlatepyError:
        return "holders unknown"
    others = [w.debug or wid for wid, w in state.writers.items() if wid != handle.writer_id]
    return "writers: " + ", ".join(sorted(others)) if others else "its writer has expired"


def conflict(
    client: PersistClient,
    handle: WriteHandle,
    *,
    kind: str,
    current: int | None,
    expected: int,
    when: str,
) -> IngestConflict:
    """The :class:`IngestConflict` of ``handle``'s shard (the ``kind`` one: remap or data),
    found at ``current`` where this ingest expected ``expected``."""
    return IngestConflict(
        f"{kind} shard {handle.shard_id!r} moved to {current} {when} (expected {expected}): "
        f"another ingest of the same shards is running ({holders(client, handle)}); "
        "this one stops"
    )


def fetch_upper(handle: WriteHandle, cause: BaseException | None = None) -> int:
    """``handle``'s shard's upper; :class:`IngestConflict` (caused by ``cause``) if the shard
    is closed."""
    upper = handle.fetch_recent_upper()
    if upper is None:
        raise IngestConflict(f"shard {handle.shard_id!r} is closed") from cause
    return upper


def check_unmoved(
    client: PersistClient,
    expected: Sequence[tuple[str, WriteHandle, int]],
    when: str,
    cause: BaseException | None = None,
) -> None:
    """Raise :class:`IngestConflict` (caused by ``cause``) if a shard's upper is not the
    expected one of its ``(kind, handle, upper)``: another ingest of the same shards wrote.
    Whoever opens a source after reading the uppers asks this when the source says offsets
    are gone (``SlotLost``, ``OffsetOutOfRange``): opening may wait (a PostgreSQL slot
    another session holds: 5 s), and another ingest may commit upstream meanwhile beyond
    what was read. That is its progress, not lost data."""
    for kind, handle, then in expected:
        now = fetch_upper(handle, cause)
        if now != then:
            raise conflict(
                client, handle, kind=kind, current=now, expected=then, when=when
            ) from cause


def _now_ms() -> int:
    return int(time.time() * 1000)


class Ingest:
    """Ingest ``source`` into ``data_shards`` (one per output) through ``remap_shard``."""

    def __init__(
        self,
        client: PersistClient,
        source: Source,
        *,
        data_shards: Sequence[str],
        remap_shard: str,
        hook: Hook | None = None,
        tick: float = 0.1,
        commit_interval: float = 1.0,
        idle_interval: float = 1.0,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        if len(data_shards) != len(source.outputs):
            raise ValueError(f"{len(source.outputs)} outputs but {len(data_shards)} data shards")
        self.source = source
        self.data_shards = list(data_shards)
        self.remap_shard = remap_shard
        self._client = client
        self._hook = hook or (lambda point: None)
        self._tick = tick
        self._commit_interval = commit_interval
        self._idle_interval = idle_interval
        self._clock = clock
        self._remap: WriteHandle = client.open_writer(remap_shard, purpose="ingest remap")
        self._data = [client.open_writer(s, purpose="ingest data") for s in data_shards]
        self._since: SinceHandle | None = None
        self._reader: SourceReader | None = None
        self.rows = 0
        self.committed: OffsetFrontier = zero(source.partitions)
        self.resumption = 0

    # -- resumption -----------------------------------------------------------------------

    def start(self) -> None:
        """Load the bindings and open the source at the offset resumption frontier (closing
        the reader of an earlier start first)."""
        self._close_reader()
        parts = self.source.partitions
        upper = self._remap.fetch_recent_upper()
        if upper == 0:
            # UpperMismatch: another ingest (or our own earlier attempt) initialised it.
            with contextlib.suppress(UpperMismatch):
                shapes = self.source.shapes()
                self._remap.compare_and_append(remap.initial_updates(parts, shapes), 0, 1)
            upper = self._remap.fetch_recent_upper()
        assert upper is not None, "the remap shard is closed"
        self._since = self._client.open_critical_since(self.remap_shard, SINCE_HOLDER)
        self._uppers = [fetch_upper(w) for w in self._data]
        reader = self._client.open_leased_reader(self.remap_shard, purpose="ingest resume")
        try:
            self.bindings = remap.load(reader, parts, upper)
        finally:
            reader.expire()
        self._check_shapes()
        self.resumption = self._resumption_frontier()
        self._pending: list[Chunk] = []
        resume = self.bindings.before(self.resumption)
        self.progress = resume
        # Not known to be committed upstream (a crash may have come first): the first
        # commit() sends it, whether or not the frontier moved since.
        self.committed = zero(parts)
        self._last_mint = 0.0
        self._last_idle = time.monotonic()
        self._last_commit = time.monotonic()
        log.info(
            "ingest %s resumes at time %d, offsets %s", self.remap_shard, self.resumption, resume
        )
        try:
            self._reader = self.source.open(resume)
        except (OffsetOutOfRange, SlotLost) as exc:
            # Opening may wait (a PostgreSQL slot another session holds: 5 s), and another
            # ingest may commit upstream beyond what this one read meanwhile.
            self._check_unmoved("while this ingest opened the source", exc)
            raise

    def _check_unmoved(self, when: str, cause: SourceError | None = None) -> None:
        """Raise :class:`IngestConflict` if a shard's upper is not where this ingest's own
        appends left it (or :meth:`start` read it): another ingest of the same shards wrote.
        Never adopt such an upper: this ingest would bind again, at later times, the offsets
        the other one wrote (every row twice)."""
        expected = [("remap", self._remap, self.bindings.upper)]
        expected += [("data", h, u) for h, u in zip(self._data, self._uppers, strict=True)]
        check_unmoved(self._client, expected, when, cause)

    def _conflict(
        self, handle: WriteHandle, current: int | None, expected: int, when: str
    ) -> IngestConflict:
        kind = "remap" if handle is self._remap else "data"
        return conflict(
            self._client, handle, kind=kind, current=current, expected=expected, when=when
        )

    def _check_shapes(self) -> None:
        for i, shape in enumerate(self.source.shapes()):
            recorded = self.bindings.shapes.get(i)
            if recorded is not None and recorded != shape:
                name = self.source.outputs[i]
                raise SchemaChanged(
                    f"{name} changed shape since its shards were made (ALTER TABLE?): "
                    f"recorded {recorded.decode(errors='replace')}, now "
                    f"{shape.decode(errors='replace')}; re-create the source"
                )

    def _resumption_frontier(self) -> int:
        found = meet([self.bindings.upper, *self._uppers])
        assert found is not None
        return found

    # -- the loop -------------------------------------------------------------------------

    def step(self, timeout: float = 0.1) -> None:
        """Poll the source once, then mint, append and (when due) commit."""
        assert self._reader is not None, "start() first"
        for event in self._reader.poll(timeout):
            if isinstance(event, Progress):
                self.progress = frontier_join(self.progress, event.frontier)
            else:
                self._pending.append(event)
        now = time.monotonic()
        if now - self._last_mint >= self._tick:
            self._mint()
            self._last_mint = now
        self._append()
        if now - self._last_commit >= self._commit_interval:
            self.commit()
            self._last_commit = now

    def _mint(self) -> None:
        latest = self.bindings.latest
        if latest == self.progress:
            self._idle()
            return
        if not frontier_le(latest, self.progress):
            return  # still catching up with bindings made before a restart
        upper = self.bindings.upper
        ts = max(upper, self._clock())
        self._append_remap(remap.bind_updates(ts, latest, self.progress), upper, ts + 1)
        self.bindings.mint(ts, self.progress)
        self._hook("remap-appended")

    def _idle(self) -> None:
        """Nothing new upstream: every ``idle_interval`` seconds, close the times up to now
        with no new binding (progress without data, as Materialize's sources do), so the
        data shards' uppers, and their readers' frontiers, follow the clock."""
        now = time.monotonic()
        ts = self._clock()
        upper = self.bindings.upper
        if now - self._last_idle < self._idle_interval or ts < upper:
            return
        self._append_remap([], upper, ts + 1)
        self.bindings.advance(ts + 1)
        self._last_idle = now

    def _append_remap(self, updates: list[Update], upper: int, new_upper: int) -> None:
        try:
            self._remap.compare_and_append(updates, upper, new_upper)
        except UpperMismatch as exc:
            raise self._conflict(self._remap, exc.current, upper, "under this ingest") from exc

    def _append(self) -> None:
        target = self.bindings.complete_upper(self.progress)
        if target is None or all(u >= target for u in self._uppers):
            return
        timed: list[tuple[int, Chunk]] = []
        keep: list[Chunk] = []
        for chunk in self._pending:
            t = self.bindings.time_of(chunk.partition, chunk.offset)
            if t is not None and t < target:
                timed.append((t, chunk))
            else:
                keep.append(chunk)
        for i, handle in enumerate(self._data):
            lower = self._uppers[i]
            if lower >= target:
                continue
            updates: list[Update] = [
                ((k, v), t, d)
                for t, chunk in timed
                if chunk.output == i and t >= lower
                for k, v, d in chunk.rows
            ]
            try:
                handle.compare_and_append(updates, lower, target)
            except UpperMismatch as exc:
                raise self._conflict(handle, exc.current, lower, "under this ingest") from exc
            self._uppers[i] = target
            self.rows += len(updates)
            self._hook("data-appended")
        self._pending = keep

    def commit(self) -> None:
        """Commit the offset resumption frontier upstream and move the remap since."""
        assert self._reader is not None and self._since is not None
        self._check_unmoved("under this ingest")
        t = self._resumption_frontier()
        if t <= 0:
            return
        offsets = self.bindings.before(t)
        held = self._since.since
        if held is None or held < t - 1:  # an idle source writes no state change
            opaque = self._since.opaque
            self._since.compare_and_downgrade_since(opaque, opaque, t - 1)
        self.bindings.compact(t - 1)
        self.resumption = t
        if offsets != self.committed:
            self._reader.commit(offsets)
            self.committed = offsets
            self._hook("committed")

    def stats(self) -> Stats:
        """Counters for progress reports."""
        return Stats(
            rows=self.rows,
            remap_upper=self.bindings.upper,
            data_uppers=list(self._uppers),
            resumption=self.resumption,
            offsets=self.progress,
            committed=self.committed,
            lag=self._reader.lag() if self._reader is not None else None,
        )

    def run(
        self,
        stop: threading.Event,
        *,
        report: Callable[[Stats], None] | None = None,
        report_interval: float = 5.0,
        retry_for: float = 60.0,
    ) -> None:
        """Step until ``stop`` is set, then commit once more and close. A transient source
        failure (:class:`SourceUnavailable`) resumes from the shards, as after a crash,
        until the source has failed for ``retry_for`` seconds in a row."""
        failing: float | None = None
        last = time.monotonic()
        try:
            while not stop.is_set():
                try:
                    self.start()
                    while not stop.is_set():
                        self.step()
                        failing = None
                        if report is not None and time.monotonic() - last >= report_interval:
                            report(self.stats())
                            last = time.monotonic()
                    self.commit()
                except SourceUnavailable as exc:
                    self._close_reader()
                    failing = time.monotonic() if failing is None else failing
                    if time.monotonic() - failing > retry_for:
                        raise
                    log.warning("%s; resuming from the shards", exc)
                    stop.wait(1.0)
        finally:
            self.close()

    def _close_reader(self) -> None:
        if self._reader is not None:
            try:
                self._reader.close()
            except SourceError:
                log.warning("closing the source failed", exc_info=True)
            self._reader = None

    def close(self) -> None:
        """Close the source reader and release the shard handles (not the since hold)."""
        self._close_reader()
        for handle in (self._remap, *self._data):
            handle.expire()
