"""The compactor process's loop: compaction every interval, garbage collection every other.

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
from slatepy.gc import GarbageCollector
from slatepy.manifest.record import Manifest

log = logging.getLogger(__name__)

MAX_ROUNDS_PER_PASS = 16
"""Compactions in one pass before GC gets its turn and the interval sleep."""


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
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._woken_at = 0.0
        self.fenced = False
        self.superseded = 0
        self.taken_back = 0
        self.passes = 0
        self._thread = threading.Thread(target=self._run, name="slatepy-compactor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        settings = self.compactor.settings
        next_gc = time.monotonic() + settings.gc_interval
        while True:
            self._wake.wait(settings.compaction_interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                if self.fenced and self.compactor.standby_check():
                    self.fenced = False
                    self.taken_back += 1
                if not self.fenced:
                    self._compact()
                if self.gc is not None and time.monotonic() >= next_gc:
                    next_gc = time.monotonic() + settings.gc_interval
                    self.gc.collect()
            except FencedError as exc:
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
                log.warning("compactor pass failed, retrying next interval: %s", exc)
            self.passes += 1

    def _compact(self) -> None:
        # Hand each published manifest to the writer at once: it prunes its memtable then,
        # which keeps the writer under max_unflushed_bytes while writes go on.
        for _ in range(MAX_ROUNDS_PER_PASS):
            if self._stop.is_set() or self.compactor.run_once() is None:
                break
            if self._on_publish:
                self._on_publish(self.compactor.last_published.manifest)

    def wake(self, *, min_interval: float = 0.0) -> None:
        """Run the next pass now rather than at the end of the interval (the writer calls
        this when its unflushed memory passes half of ``max_unflushed_bytes``); ignored if
        the last wake was less than ``min_interval`` seconds ago."""
        now = time.monotonic()
        if now - self._woken_at >= min_interval:
            self._woken_at = now
            self._wake.set()

    def run_forever(self) -> None:
        """Block until the process is interrupted (a superseded loop stands by, it does not
        end)."""
        try:
            while self._thread.is_alive():
                self._thread.join(1.0)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the loop; a compaction in progress is abandoned (its outputs go to GC), so
        this returns in moments however much was written before. Then release the lease
        (best effort), so a standby or ``slatepy compact`` takes over without waiting."""
        self._stop.set()
        self._wake.set()
        self.compactor.cancel()
        self._thread.join()
        if not self.fenced:
            try:
                self.compactor.release()
            except SlatepyError as exc:
                log.info("compactor lease not released (it lapses on its own): %s", exc)
