"""Where a process's memory is, sampled while it runs (issue 33 item 4's attribution).

A :class:`Sampler` thread reads, every ``interval`` seconds: ``VmRSS``; glibc's
``mallinfo2`` (bytes its heaps hand out, bytes free inside them, bytes of its own mmapped
chunks); what ``tracemalloc`` traces when it is on (Python's allocations, pymalloc's and the
raw ones, numpy's); and the engine's own gauges (memtable, caches) through callables the
caller registers. Per phase it keeps the sample with the largest RSS, and with ``snapshots``
a ``tracemalloc`` snapshot taken near that peak (the top allocation sites then say which
code holds the memory). What RSS holds beyond the traced and malloc figures is the
interpreter, the shared libraries, pymalloc arenas kept for fragmentation, and native
allocations of extensions that bypass both (obstore's Rust buffers).

Used by ``python -m bench.growth --trace``.
"""

from __future__ import annotations

import ctypes
import threading
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

MB = 1024 * 1024


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mallinfo2() -> Callable[[], dict[str, float]] | None:
    try:
        libc = ctypes.CDLL(None)
        call = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    call.restype = _Mallinfo2

    def read() -> dict[str, float]:
        info = call()
        return {
            "malloc_used_mb": info.uordblks / MB,  # handed out from the heaps (brk + arenas)
            "malloc_free_mb": info.fordblks / MB,  # free inside the heaps: retention
            "malloc_mmap_mb": info.hblkhd / MB,  # glibc's own mmapped chunks (large buffers)
        }

    return read


MALLINFO = _mallinfo2()


def status_mb(field: str) -> float:
    """A ``/proc/self/status`` field (``VmRSS``, ``VmHWM``) in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


class Sampler:
    """Samples memory every ``interval`` seconds in a daemon thread (see the module)."""

    def __init__(self, *, interval: float = 0.05, snapshots: bool = False) -> None:
        self.interval = interval
        self.snapshots = snapshots and tracemalloc.is_tracing()
        self.gauges: dict[str, Callable[[], float]] = {}
        self.phase = "start"
        self.peaks: dict[str, dict[str, Any]] = {}
        self.series: list[tuple[str, float, float]] = []
        self._snap_rss: dict[str, float] = {}
        self._snaps: dict[str, tracemalloc.Snapshot] = {}
        self._stop = threading.Event()
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def enter(self, phase: str) -> None:
        self.sample()
        self.phase = phase

    def sample(self) -> dict[str, Any]:
        row: dict[str, Any] = {"rss_mb": status_mb("VmRSS")}
        if MALLINFO is not None:
            row.update(MALLINFO())
        if tracemalloc.is_tracing():
            row["traced_mb"] = tracemalloc.get_traced_memory()[0] / MB
        for name, gauge in list(self.gauges.items()):
            try:
                row[name] = gauge() / MB
            except Exception:  # a gauge of a closed object: skip it
                continue
        phase = self.phase
        self.series.append((phase, time.perf_counter() - self._started, row["rss_mb"]))
        best = self.peaks.get(phase)
        if best is None or row["rss_mb"] > best["rss_mb"]:
            self.peaks[phase] = row
            if self.snapshots and row["rss_mb"] > self._snap_rss.get(phase, 0.0) + 4:
                self._snap_rss[phase] = row["rss_mb"]
                self._snaps[phase] = tracemalloc.take_snapshot()
        return row

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def top(self, phase: str, limit: int = 15) -> list[str]:
        """The allocation sites holding most traced memory near the phase's RSS peak."""
        snap = self._snaps.get(phase)
        if snap is None:
            return []
        snap = snap.filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        return [
            f"{stat.size / MB:7.1f} MB {stat.count:>9,} blocks  {stat.traceback}"
            for stat in snap.statistics("lineno")[:limit]
        ]

    def report(self) -> dict[str, Any]:
        return {
            "peaks": {
                phase: {name: round(value, 1) for name, value in row.items()}
                for phase, row in self.peaks.items()
            },
            "top": {phase: self.top(phase) for phase in self._snaps},
        }
