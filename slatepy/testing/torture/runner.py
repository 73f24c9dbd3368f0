"""The seeded runner of the torture workload: the operation mix, a run of steps or seconds
with progress lines, and the final verification with faults off."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from slatepy.engine import checkpoint as checkpoints
from slatepy.engine.reader import DbReader
from slatepy.errors import (
    NotFound,
)
from slatepy.testing.torture.model import (
    PROGRESS_INTERVAL,
    Report,
    concat,
)
from slatepy.testing.torture.ops_maintenance import MaintenanceOps
from slatepy.testing.torture.ops_views import ViewOps


class Torture(ViewOps, MaintenanceOps):
    """The workload over ``store`` (faults are added here) with ``seed``.

    Args:
        settings: Also opens the clones' locations, and the database by URL from them.
        clone_root: A URL under which clones are made (``clone_root/clone-<uuid>``), on a
            backend that can reopen ``store`` by its URL; None: no clones.
    """

    WEIGHTS: tuple[tuple[str, int], ...] = (
        ("put", 30),
        ("delete", 8),
        ("put_ttl", 6),
        ("delete_range", 3),
        ("merge", 8),
        ("tick", 4),
        ("batch", 10),
        ("flush", 6),
        ("get", 15),
        ("scan", 5),
        ("reader", 8),
        ("compact", 5),
        ("gc", 3),
        ("crash", 2),
        ("reopen", 2),
        ("iterate", 3),
        ("transaction", 4),
        ("snapshot", 2),
        ("snapshot_read", 3),
        ("checkpoint", 2),
        ("checkpoint_read", 2),
        ("checkpoint_drop", 1),
        ("clone", 1),
        ("clone_read", 1),
        ("cdc", 2),
        ("ingest", 2),
        ("range_batch", 2),
    )

    def step(self) -> None:
        names, weights = zip(*self.WEIGHTS, strict=True)
        name = self.rng.choices(names, weights)[0]
        self.report.operations[name] += 1
        getattr(self, f"op_{name}")()

    def progress_line(self, elapsed: float, seconds: float | None) -> str:
        """How far the run is: time, operations, acknowledged writes, crashes, faults."""
        of = f" of {seconds:g}" if seconds is not None else ""
        return (
            f"{elapsed:.0f}{of} s: {sum(self.report.operations.values())} operations, "
            f"{self.report.acknowledged_writes} acknowledged writes, "
            f"{self.report.crashes} crashes, {sum(self.faulty.counts.values())} faults "
            f"injected, {sum(self.report.failed.values())} failures surfaced"
        )

    def verify(self) -> None:
        """With faults off: every checkpoint and clone reads its model and the change feed
        holds what it must; then, with every checkpoint deleted and the database compacted
        and collected, a crash, then a fresh writer and a fresh reader must agree with the
        model and the clones still read theirs. Counts acknowledged writes that are gone."""
        self.faulty.enabled = False
        for held_clone in self.clones:
            held_clone.store.enabled = False
        try:
            self.release_snapshots()
            for held in list(self.checkpoints):
                self._read_checkpoint(held)
            for held_clone in self.clones:
                self._read_clone(held_clone)
            self.op_cdc()
            for held in self.checkpoints:
                try:
                    checkpoints.delete_checkpoint(self.faulty, self.settings, held.id)
                except NotFound:
                    if not held.may_be_gone():
                        raise
            self.checkpoints.clear()
            self.op_compact()
            self.op_gc()
            self.op_gc()  # the second pass collects what the first one's manifest let go
            self.crash()
            if self.reader is not None:
                self.reader.close()
                self.reader = None
            db = self.writer()
            rows = dict(db.scan())
            for key in self.model.acked:
                if rows.get(key) not in self.model.allowed(key):
                    self.report.lost_acknowledged_writes += 1
            self._check_view(rows, "fresh writer")
            with DbReader.open(
                self.faulty, settings=self.settings, clock=self.clock, merge_operator=concat
            ) as reader:
                self._check_view(dict(reader.scan()), "fresh reader")
            for held_clone in self.clones:
                self._read_clone(held_clone)
        finally:
            self.faulty.enabled = True
            for held_clone in self.clones:
                held_clone.store.enabled = True

    def run(
        self,
        *,
        steps: int | None = None,
        seconds: float | None = None,
        progress: Callable[[str], None] | None = None,
        progress_interval: float = PROGRESS_INTERVAL,
    ) -> Report:
        """Run ``steps`` operations or for ``seconds``, then verify with faults off.

        Args:
            progress: Called with a line about the run so far every ``progress_interval``
                seconds, and once before the final verification (a soak of minutes should
                show it is alive and how it is going).

        Raises:
            Violation: the database returned something the model says it must not.
        """
        started = time.monotonic()
        deadline = started + seconds if seconds is not None else None
        next_progress = started + progress_interval
        done = 0
        while (steps is None or done < steps) and (deadline is None or time.monotonic() < deadline):
            self.step()
            done += 1
            if progress is not None and time.monotonic() >= next_progress:
                next_progress = time.monotonic() + progress_interval
                progress(self.progress_line(time.monotonic() - started, seconds))
        if progress is not None:
            progress(self.progress_line(time.monotonic() - started, seconds) + "; verifying")
        self.verify()
        self.close_writer()
        self.report.faults = Counter(self.faulty.counts)
        for held_clone in self.clones:
            self.report.faults.update(held_clone.store.counts)
        return self.report
