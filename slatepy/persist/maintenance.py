"""The client's maintenance thread: merges and GC passes, off every caller's path (RFC 0015
§8.3).

Work reaches the runner two ways. :meth:`MaintenanceRunner.submit` takes the
``Maintenance`` record a committed transition returned (its merge requests, whether GC is
due) and queues it without blocking. And every ``poll_interval`` the thread looks at the
cached state of each watched ``(shard, writer)`` (no I/O): merge claims held by that writer
that are not running, and GC when ``gc_due``. The scan is what makes work survive failures:
a claim stays in the state until its merge is applied or taken over, so a merge that failed
(logged at WARNING) is found again and retried after ``retry_after`` seconds, and requests
dropped because the queue was full come back the same way. A scan that finds a watched
writer's trace full (appends refused with ``WriteStalled``) also claims, for that writer,
what the spine rule finds, taking over claims that expired: a refused append commits
nothing, so nothing else would (issue 27).

One thread per runner (one runner per client), started with the first work, stopped by
:meth:`close`, which asks a running merge to stop at its next check (its outputs are
deleted) and joins the thread. Nothing here raises into a writer.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from slatepy.persist.compactor import compact
from slatepy.persist.gc import collect
from slatepy.persist.machine import ShardMachine, rerun_as_is
from slatepy.persist.state.gc_rules import gc_due
from slatepy.persist.state.outcome import Maintenance, MergeReq
from slatepy.persist.state.records import State
from slatepy.persist.state.spine import ClaimMerges, claim_merges
from slatepy.table.reader import TableReader

log = logging.getLogger(__name__)

QUEUE_LIMIT = 20
"""Jobs waiting at most; more are dropped (the state keeps their claims: a scan finds them)."""

JobKey = tuple[str, str, int]
"""``(shard, "merge", merge_id)`` or ``(shard, "gc", 0)``: one queued job per key."""


@dataclass(frozen=True, slots=True)
class _Job:
    machine: ShardMachine
    claimant: str
    merge: MergeReq | None
    """None: a GC pass."""


@dataclass(slots=True)
class _Watch:
    machine: ShardMachine
    claimant: str
    owner: weakref.ref[object]


class MaintenanceRunner:
    """Runs merges and GC passes of one client's shards on one background thread.

    Args:
        tables: Reads input parts of merges (the client's ``TableReader``).
        queue_limit: Jobs waiting at most (excess dropped; found again by the scan).
        poll_interval: Seconds between scans of the watched shards' cached states.
        retry_after: Seconds before a failed job (or a GC pass that found another pass
            running) is tried again.
        clock: Monotonic seconds (tests).
    """

    def __init__(
        self,
        tables: TableReader,
        *,
        queue_limit: int = QUEUE_LIMIT,
        poll_interval: float = 1.0,
        retry_after: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tables = tables
        self.queue_limit = queue_limit
        self.poll_interval = poll_interval
        self.retry_after = retry_after
        self.clock = clock
        self.gc_claimant = "g" + uuid.uuid4().hex
        self._queue: OrderedDict[JobKey, _Job] = OrderedDict()
        self._watches: dict[tuple[str, str], _Watch] = {}
        self._running: JobKey | None = None
        self._not_before: dict[JobKey, float] = {}
        self._claim_after: dict[tuple[str, str], float] = {}
        self._wake = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- feeding work ---------------------------------------------------------------------

    def submit(self, machine: ShardMachine, claimant: str, maintenance: Maintenance) -> None:
        """Queue what a committed change made due (never blocks, never raises)."""
        for request in maintenance.merges:
            self._put(_Job(machine, claimant, request))
        if maintenance.gc:
            self._put(_Job(machine, claimant, None))

    def watch(self, machine: ShardMachine, claimant: str, owner: object) -> None:
        """Scan ``machine``'s cached state for ``claimant``'s merge claims and for due GC,
        as long as ``owner`` (the write handle, held weakly) lives."""
        with self._wake:
            if self._stop.is_set():
                return
            self._watches[(machine.shard_id, claimant)] = _Watch(
                machine, claimant, weakref.ref(owner)
            )
            self._start()

    def _put(self, job: _Job) -> None:
        key = _key(job)
        with self._wake:
            if self._stop.is_set() or key in self._queue or key == self._running:
                return
            if len(self._queue) >= self.queue_limit:
                log.debug("persist maintenance queue full: dropped %s", key)
                return
            self._queue[key] = job
            self._start()
            self._wake.notify_all()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="slatepy-persist-maintenance", daemon=True
            )
            self._thread.start()

    # -- the thread -----------------------------------------------------------------------

    def _loop(self) -> None:
        next_scan = self.clock()
        while not self._stop.is_set():
            if self.clock() >= next_scan:
                self._scan()
                next_scan = self.clock() + self.poll_interval
            with self._wake:
                if self._stop.is_set():  # close() notified before we got here: no wait
                    return
                job = self._take()
                if job is None:
                    self._wake.wait(max(0.0, next_scan - self.clock()))
                    continue
                self._running = _key(job)
            try:
                self._run(job)
            finally:
                with self._wake:
                    self._running = None
                    if not self._queue:  # claims beyond the queue's limit: find them now
                        next_scan = self.clock()
                    self._wake.notify_all()

    def _take(self) -> _Job | None:
        """The first job due, merges before GC passes (a pass replays many states; the
        trace grows while merges wait, and every append costs more with it)."""
        now = self.clock()
        due = [key for key in self._queue if self._not_before.get(key, 0.0) <= now]
        if not due:
            return None
        key = next((key for key in due if key[1] == "merge"), due[0])
        return self._queue.pop(key)

    def _run(self, job: _Job) -> None:
        key = _key(job)
        self._not_before.pop(key, None)
        try:
            if job.merge is not None:
                status = compact(
                    job.machine, self.tables, job.claimant, job.merge, stop=self._stop
                ).status
                again = status in ("abandoned", "unknown", "skipped")
            else:
                again = collect(job.machine, claimant=self.gc_claimant).status == "skipped"
        except Exception:  # logged and retried: maintenance must never reach a writer
            log.warning("persist maintenance %s failed; retrying later", key, exc_info=True)
            again = True
        if again:
            # The claim (or the due GC) is still in the state: the scan queues it again.
            self._not_before[key] = self.clock() + self.retry_after

    def _scan(self) -> None:
        """Queue the claims of watched writers that are not running, and due GC passes."""
        now = self.clock()
        with self._wake:
            watches = list(self._watches.items())
            # A retry time that passed says nothing (absent means "due" too): without this,
            # every merge that ever failed or was skipped kept an entry (issue 27).
            self._not_before = {k: t for k, t in self._not_before.items() if t > now}
        for ident, watch in watches:
            if watch.owner() is None:
                with self._wake:
                    self._watches.pop(ident, None)
                self._claim_after.pop(ident, None)
                continue
            try:
                state = watch.machine.state
            except Exception:  # a closed client's machine: nothing left to do there
                with self._wake:
                    self._watches.pop(ident, None)
                continue
            state = self._unstall(ident, watch, state, now)
            jobs = [
                _Job(watch.machine, watch.claimant, r) for r in _claims_of(state, watch.claimant)
            ]
            if gc_due(state, watch.machine.settings):
                jobs.append(_Job(watch.machine, watch.claimant, None))
            now = self.clock()
            for job in jobs:  # a job waiting to be retried stays out of the queue till then
                if self._not_before.get(_key(job), 0.0) <= now:
                    self._put(job)

    def _unstall(self, ident: tuple[str, str], watch: _Watch, state: State, now: float) -> State:
        """When the trace is full (appends refused with ``WriteStalled``), claim for the
        watched writer what the spine rule finds: unclaimed spans, and spans whose claims
        expired (their claimant died). A refused append commits nothing, so without this a
        full trace whose every span a dead writer claimed stalled writes for ever (issue
        27). At most once per ``merge_lease / 8`` (and scan) per writer while full."""
        machine = watch.machine
        settings = machine.settings
        if len(state.trace) < settings.max_trace_batches:
            self._claim_after.pop(ident, None)
            return state
        if self._claim_after.get(ident, 0.0) > now:
            return state
        self._claim_after[ident] = now + settings.merge_lease / 8
        try:
            machine.run(claim_merges, ClaimMerges(watch.claimant), on_uncertain=rerun_as_is)
        except Exception:  # retried at the next scan; never raised into a writer
            log.warning("shard %r: claiming merges failed", machine.shard_id, exc_info=True)
            return state
        return machine.state

    # -- stopping ---------------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """Stop: a running merge stops at its next check (outputs deleted, claim left to
        expire), queued jobs are dropped, the thread is joined (up to ``timeout`` seconds).
        Idempotent."""
        with self._wake:
            self._stop.set()
            self._queue.clear()
            thread, self._thread = self._thread, None
            self._wake.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def idle(self) -> bool:
        """Whether nothing is queued or running (tests and shutdown diagnostics)."""
        with self._wake:
            return not self._queue and self._running is None


def _key(job: _Job) -> JobKey:
    shard = job.machine.shard_id
    return (shard, "merge", job.merge.merge_id) if job.merge else (shard, "gc", 0)


def _claims_of(state: State, claimant: str) -> list[MergeReq]:
    """The merges ``claimant`` holds in ``state``, as requests."""
    index = state.batch_index()
    requests = []
    for merge_id, claim in state.merges.items():
        if claim.claimant == claimant:
            inputs = tuple(state.trace[index[batch_id]] for batch_id in claim.inputs)
            requests.append(MergeReq(merge_id, inputs))
    return requests
