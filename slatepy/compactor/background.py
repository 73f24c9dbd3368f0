"""The compactor process's loop: compaction every interval, garbage collection every other.

Both back off while idle (``slatepy.store.polling``): a compaction pass that finds nothing to
do doubles the interval up to ``compaction_max_interval`` (a writer's next write brings it
back at once), a GC pass that deletes nothing doubles the GC interval up to
``gc_max_interval``. An idle writer so costs a few requests a minute, not two LISTs a second.

It runs as a thread inside the writer (``Settings(compactor="in-process")``) or alone
(``slatepy compactor URL``); the seed puts GC in the compactor process, and so do we.

Superseded by another compactor (``slatepy compact`` against a live writer, a second
``slatepy compactor``), the loop does not end: it logs a WARNING, stands by, and takes the
compactor epoch back once the holder has left pending work untouched for its lease
(RFC 0013). A writer is therefore never left without compaction. Garbage collection goes on
while standing by: collectors need no epoch (each deletion is safe on its own, RFC 0003).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from slatepy.compactor.compactor import Compactor
from slatepy.errors import FencedError, SlatepyError
from slatepy.gc import GarbageCollector, GcReport
from slatepy.manifest.record import Manifest
from slatepy.store.polling import IdleBackoff

log = logging.getLogger(__name__)

MAX_ROUNDS_PER_PASS = 16
"""Compactions in one pass before GC gets its turn and the interval sleep."""
IDLE_MANIFEST_LOOK = 4
"""While idle, every this many passes looks for a newer manifest (a GET); the others only
HEAD the next WAL SST: new WAL is what a writer's compactor waits for, and what changes the
work without WAL (an ingestion, another compactor) can wait a few ceilings."""


class BackgroundCompactor:
    """Runs ``compactor.run_until_idle`` every ``compaction_interval`` and ``gc.collect`` every
    ``gc_interval`` (from the compactor's settings) until closed.

    ``on_publish`` receives each manifest the compactor published (the writer uses it to
    adopt the new view and release memtable memory). Store errors are logged and retried on
    the next pass. Being fenced by a newer compactor makes it a standby (``fenced`` is True
    meanwhile): each pass then only checks the holder's lease and collects garbage, until
    :meth:`Compactor.standby_check` takes the epoch back.

    Attributes:
        fenced: Another compactor holds the epoch; this one stands by.
        superseded: How many times this loop lost the epoch.
        taken_back: How many times it took the epoch back.
    """

    def __init__(
        self,
        compactor: Compactor,
        *,
        gc: GarbageCollector | None = None,
        on_publish: Callable[[Manifest], None] | None = None,
    ) -> None:
        self.compactor = compactor
        self.gc = gc
        self._on_publish = on_publish
        settings = compactor.settings
        self.backoff = IdleBackoff(
            settings.compaction_interval,
            min(settings.compaction_max_interval, settings.compactor_lease / 2),
        )
        self._idle_passes = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._draining = False
        self._drain_until = 0.0
        self._drained = threading.Event()
        self._woken_at = 0.0
        self.fenced = False
        self.last_error: Exception | None = None
        """The error of the last pass, if it failed (None once a pass succeeds): what a
        writer stalled on this compactor reports."""
        self.superseded = 0
        self.taken_back = 0
        self.passes = 0
        self._thread = threading.Thread(target=self._run, name="slatepy-compactor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        settings = self.compactor.settings
        gc_backoff = IdleBackoff(settings.gc_interval, settings.gc_max_interval)
        next_gc = time.monotonic() + gc_backoff.current
        while True:
            if not self._draining:
                self._wake.wait(min(self.backoff.current, max(0.0, next_gc - time.monotonic())))
            self._wake.clear()
            if self._stop.is_set():
                return
            # Only a pass that began after close() asked to drain can say it is drained: one
            # already running may have missed the WAL the close has just flushed.
            close_by = self._drain_until if self._draining else None
            worked = False
            try:
                if self.fenced and self.compactor.standby_check():
                    self.fenced = False
                    self.taken_back += 1
                if not self.fenced:
                    recheck = self._idle_passes % IDLE_MANIFEST_LOOK == 0
                    worked = self._compact(recheck, close_by) > 0
                if self.gc is not None and time.monotonic() >= next_gc:
                    next_gc = time.monotonic() + _gc_wait(self.gc.collect(), gc_backoff)
                self.last_error = None
            except FencedError as exc:
                self._drained.set()  # nothing more for this compactor to finish
                if not self.fenced:
                    self.fenced = True
                    self.superseded += 1
                    log.warning(
                        "compactor epoch %d (%s) stops compacting: %s. It stands by, checking "
                        "every %g s, and takes compaction back once the new compactor leaves "
                        "work pending for its lease",
                        self.compactor.epoch,
                        self.compactor.holder,
                        exc,
                        settings.compaction_interval,
                    )
            except SlatepyError as exc:
                if self._stop.is_set():
                    return  # cancelled by close()
                if self._draining and self.compactor.preempted:
                    log.info("%s", exc)  # close() cannot wait for it: it plans its own
                    continue
                self._drained.set()  # closing: a failing store is not retried
                self.last_error = exc
                log.warning("compactor pass failed, retrying next interval: %s", exc)
                worked = True  # retry at the base interval, not after an idle back-off
            except Exception as exc:
                # A bug, not the store: the loop must not die of it (a writer would stall on
                # a thread that is gone, and GC would stop); it is logged whole and retried.
                if self._stop.is_set():
                    return
                self._drained.set()
                self.last_error = exc
                log.exception("compactor pass failed, retrying next interval")
                worked = True
            # A standby keeps to the base interval: it must see the holder's lease lapse.
            if close_by is not None and not worked:
                self._drained.set()  # caught up: what close() waits for (``drain``)
            self.backoff.polled(changed=worked or self.fenced)
            self._idle_passes = self._idle_passes + 1 if self.backoff.idle else 0
            self.passes += 1

    def _compact(self, recheck_manifest: bool = True, close_by: float | None = None) -> int:
        """Up to ``MAX_ROUNDS_PER_PASS`` compactions; returns how many ran (``close_by``: see
        :meth:`Compactor.run_once`)."""
        # Hand each published manifest to the writer at once: it prunes its memtable then,
        # which keeps the writer under max_unflushed_bytes while writes go on.
        for done in range(MAX_ROUNDS_PER_PASS):
            if self._stop.is_set():
                return done
            recheck = recheck_manifest or done > 0
            if self.compactor.run_once(recheck_manifest=recheck, close_by=close_by) is None:
                return done
            if self._on_publish:
                self._on_publish(self.compactor.last_published.manifest)
        return MAX_ROUNDS_PER_PASS

    def wake(self, *, min_interval: float = 0.0) -> None:
        """Run the next pass now rather than at the end of the interval (the writer calls
        this when its unflushed memory passes half of ``max_unflushed_bytes``); ignored if
        the last wake was less than ``min_interval`` seconds ago."""
        now = time.monotonic()
        if now - self._woken_at >= min_interval:
            self._woken_at = now
            self._wake.set()

    def note_activity(self) -> None:
        """The writer wrote: if passes were backing off (nothing to do), go back to the base
        interval, starting now. Cheap enough to call on every write."""
        if self.backoff.idle and self.backoff.activity():
            self._wake.set()

    def run_forever(self) -> None:
        """Block until the process is interrupted (a superseded loop stands by, it does not
        end)."""
        try:
            while self._thread.is_alive():
                self._thread.join(1.0)
        finally:
            self.close()

    def close(self, *, drain: float = 0.0) -> None:
        """Stop the loop; a compaction in progress is abandoned (its outputs go to GC). Then
        release the lease (best effort), so a standby or ``slatepy compact`` takes over
        without waiting.

        With ``drain`` seconds (``Settings.close_compaction_wait``), passes first run back
        to back until one finds nothing to do (what the writer flushed last is compacted,
        and L0 merged into a sorted run once it holds two SSTs: ``CLOSE_L0_TRIGGER``, with
        only the runs that can be merged in the time left), for at most that long: the
        next open then reads sorted runs, not a WAL to replay and overlapping L0 SSTs.
        Without it (or past it), close returns in moments however much was written
        before."""
        if drain > 0 and not self.fenced and self._thread.is_alive():
            self._drained.clear()
            self._drain_until = time.monotonic() + drain
            self.compactor.closing(self._drain_until)
            self._draining = True
            self._wake.set()
            self._drained.wait(drain)
        self._stop.set()
        self._wake.set()
        self.compactor.cancel()
        self._thread.join()
        if not self.fenced:
            try:
                self.compactor.release()
            except SlatepyError as exc:
                log.info("compactor lease not released (it lapses on its own): %s", exc)


def _gc_wait(report: GcReport, backoff: IdleBackoff) -> float:
    """Seconds to the next GC pass: the back-off's interval (doubling while passes delete
    nothing), but no later than when the first object held back only by time becomes
    collectable (and no sooner than ``gc_interval``), so space comes back when it can."""
    wait = backoff.polled(changed=bool(report.deletions))
    due = [h.collectable_at for h in report.holds if h.collectable_at is not None]
    if due and report.now is not None:
        soonest = (min(due) - report.now).total_seconds()
        wait = min(wait, max(backoff.base, soonest))
    return wait
