"""The remap shard: which offsets each timestamp binds (RFC 0027 §3).

The remap shard is a persist shard of updates ``((partition, offset upper), time, diff)``. At
every time ``t`` it accumulates to one offset per partition: the source frontier ``O(t)``,
"every update at an offset below ``O(t)[p]`` in partition ``p`` has a time ``<= t``". It
starts with ``O(0) = (0, ..., 0)``; binding a new frontier at ``ts`` writes, per partition that
moved, the retraction of the old offset and the insertion of the new one at ``ts`` (as
Materialize's ``ReclockOperator::mint``). Times are totally ordered, frontiers only grow, so
an update at ``(p, o)`` has the unique time ``min {t : o < O(t)[p]}``, and a timestamp
frontier ``T`` inverts to the offset frontier ``O(T - 1)``: everything below it is at times
before ``T``.

:class:`Bindings` is the in-memory trace of the bindings from some time on, loaded from the
shard at a restart and extended by each mint of the running ingest.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from slatepy.persist import Listen, ReadHandle, Update, Updates
from slatepy.sources.base import OffsetFrontier, frontier_le, zero

_OFFSET = struct.Struct(">Q")


_SHAPE = b"shape/"


def partition_key(partition: int) -> bytes:
    """The remap key of ``partition``."""
    return b"partition/%08d" % partition


def _partition_of(key: bytes) -> int:
    return int(key.rpartition(b"/")[2])


def initial_updates(partitions: int, shapes: Sequence[bytes] = ()) -> list[Update]:
    """The remap shard's first batch: ``O(0)`` is zero in every partition, and the shape of
    each output (``shape/<output>``, never retracted), so a restart notices a change."""
    out = [((partition_key(p), _OFFSET.pack(0)), 0, 1) for p in range(partitions)]
    out += [((_SHAPE + b"%08d" % i, shape), 0, 1) for i, shape in enumerate(shapes)]
    return out


def bind_updates(ts: int, old: OffsetFrontier, new: OffsetFrontier) -> list[Update]:
    """The remap updates that move ``O`` from ``old`` to ``new`` at ``ts``."""
    out: list[Update] = []
    for p, (a, b) in enumerate(zip(old, new, strict=True)):
        if a != b:
            out.append(((partition_key(p), _OFFSET.pack(a)), ts, -1))
            out.append(((partition_key(p), _OFFSET.pack(b)), ts, 1))
    return out


@dataclass
class Bindings:
    """``O(t)`` for every ``t`` from ``times[0]`` up to the remap ``upper``: ``O(t)`` is
    ``frontiers[i]`` for ``times[i] <= t < times[i + 1]`` (or ``< upper`` for the last)."""

    partitions: int
    times: list[int] = field(default_factory=list)
    frontiers: list[OffsetFrontier] = field(default_factory=list)
    upper: int = 0
    shapes: dict[int, bytes] = field(default_factory=dict)
    """The outputs' shapes recorded when the shards were made (output -> shape)."""
    # Per partition, the offsets of `frontiers` (non-decreasing), for bisecting.
    _columns: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._columns = [[f[p] for f in self.frontiers] for p in range(self.partitions)]

    @property
    def latest(self) -> OffsetFrontier:
        """``O(upper - 1)``: the frontier bound at the newest time."""
        return self.frontiers[-1] if self.frontiers else zero(self.partitions)

    def mint(self, ts: int, frontier: OffsetFrontier) -> None:
        """Record a binding appended to the shard at ``ts`` (upper becomes ``ts + 1``)."""
        assert ts >= self.upper and frontier_le(self.latest, frontier)
        self.times.append(ts)
        self.frontiers.append(frontier)
        for p in range(self.partitions):
            self._columns[p].append(frontier[p])
        self.upper = ts + 1

    def advance(self, upper: int) -> None:
        """The shard's upper moved to ``upper`` with no new binding."""
        self.upper = max(self.upper, upper)

    def before(self, t: int) -> OffsetFrontier:
        """The offset frontier of the timestamp frontier ``t``: ``O(t - 1)`` (zero for
        ``t == 0``). ``t - 1`` must be at or after ``times[0]``."""
        if t <= 0 or not self.times:
            return zero(self.partitions)
        i = bisect.bisect_right(self.times, t - 1) - 1
        assert i >= 0, f"time {t - 1} is before the loaded bindings ({self.times[0]})"
        return self.frontiers[i]

    def time_of(self, partition: int, offset: int) -> int | None:
        """The time bound to ``(partition, offset)``, or None if no binding covers it yet."""
        column = self._columns[partition]
        i = bisect.bisect_right(column, offset)
        return self.times[i] if i < len(column) else None

    def complete_upper(self, progress: OffsetFrontier) -> int | None:
        """The largest timestamp frontier whose data is all below ``progress`` (None when
        not even the first loaded binding is)."""
        best: int | None = None
        for i, f in enumerate(self.frontiers):
            if not frontier_le(f, progress):
                break
            best = self.times[i + 1] if i + 1 < len(self.times) else self.upper
        return best

    def aligned(self, start: OffsetFrontier, candidate: OffsetFrontier) -> OffsetFrontier | None:
        """An end for a batch of a reader at ``start`` that wants to read up to
        ``candidate``, when bindings beyond ``start`` exist already (a restart): the largest
        bound frontier beyond ``start`` at most ``candidate``, else the least one beyond
        ``start``; None when no binding is beyond ``start``. A batch that ends on a bound
        frontier holds every update of its last time, so no later batch adds to a time a
        sink has already closed."""
        beyond = [f for f in self.frontiers if frontier_le(start, f) and f != start]
        if not beyond:
            return None
        fitting = [f for f in beyond if frontier_le(f, candidate)]
        return fitting[-1] if fitting else beyond[0]

    def compact(self, since: int) -> None:
        """Forget bindings no time at or after ``since`` needs (keeps ``O(since)``)."""
        i = bisect.bisect_right(self.times, since) - 1
        if i > 0:
            del self.times[:i]
            del self.frontiers[:i]
            for column in self._columns:
                del column[:i]


def load(reader: ReadHandle, partitions: int, upper: int) -> Bindings:
    """The bindings from the shard's since up to ``upper`` (the remap shard's upper), read
    through ``reader`` (a subscribe at the since: its snapshot, then the listen)."""
    as_of = reader.since
    assert as_of is not None
    bindings = Bindings(partitions)
    listen: Listen = reader.subscribe(as_of)
    try:
        current = dict.fromkeys(range(partitions), 0)
        by_time: dict[int, list[Update]] = {}
        events = listen.fetch_next()  # the snapshot at as_of
        while listen.frontier is not None and listen.frontier < upper:
            events.extend(listen.fetch_next(timeout=30.0))
        for event in events:
            if isinstance(event, Updates):
                for update in event.updates:
                    by_time.setdefault(update[1], []).append(update)
        for t in sorted(by_time):
            for (key, value), _, diff in by_time[t]:
                if diff > 0 and key.startswith(_SHAPE):
                    bindings.shapes[int(key[len(_SHAPE) :])] = value
                elif diff > 0:
                    current[_partition_of(key)] = _OFFSET.unpack(value)[0]
            bindings.mint(t, tuple(current[p] for p in range(partitions)))
    finally:
        listen.close()
    bindings.advance(upper)
    return bindings
