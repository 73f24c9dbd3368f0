"""A deterministic load generator: order events over ``partitions`` partitions (RFC 0027 §4).

The event at offset ``o`` of partition ``p`` is a pure function of ``(p, o)``: most offsets
insert order ``p-o``; every fifth deletes (retracts) the order inserted two offsets before, so
the collection has retractions as a real change stream has. The log is endless; with a
``rate`` (events per second over all partitions) the head of each partition advances with
the wall clock from where a reader was opened, as a live topic's would (so a restarted
process resumes producing at once, at the same rate).

Retention is Kafka-like: :meth:`LoadGenReader.commit` raises each partition's *low
watermark*, and reading from below it fails with :class:`OffsetOutOfRange`. One
:class:`LoadGen` object is the upstream; readers opened from it share its watermarks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import msgspec

from slatepy.errors import InvalidArgument
from slatepy.sources.base import Chunk, Event, OffsetFrontier, Progress, Row, frontier_join, zero
from slatepy.sources.errors import OffsetOutOfRange

_PRODUCTS = ("apple", "pear", "plum", "fig", "kiwi", "lime", "date")


def order(partition: int, offset: int) -> tuple[bytes, bytes]:
    """The ``(key, value)`` of the order inserted at ``(partition, offset)``."""
    h = (partition * 1_000_003 + offset * 7_919) % 1_000_000_007
    value = {
        "id": f"{partition}-{offset}",
        "customer": h % 997,
        "product": _PRODUCTS[h % len(_PRODUCTS)],
        "quantity": 1 + h % 9,
    }
    return f"order-{partition}-{offset:012d}".encode(), msgspec.json.encode(value)


def event(partition: int, offset: int) -> list[Row]:
    """The updates of the event at ``(partition, offset)``."""
    if offset % 5 == 4:
        key, value = order(partition, offset - 2)
        return [(key, value, -1)]
    key, value = order(partition, offset)
    return [(key, value, 1)]


def contents(frontier: OffsetFrontier) -> dict[tuple[bytes, bytes], int]:
    """The consolidated collection of every event below ``frontier`` (for tests)."""
    out: dict[tuple[bytes, bytes], int] = {}
    for p, upper in enumerate(frontier):
        for o in range(upper):
            for key, value, diff in event(p, o):
                out[(key, value)] = out.get((key, value), 0) + diff
    return {kv: d for kv, d in out.items() if d}


class LoadGen:
    """The upstream: ``partitions`` endless logs, produced at ``rate`` events/s (None: as
    fast as they are read), each read in steps of at most ``batch`` events a partition."""

    def __init__(self, partitions: int, rate: float | None = None, *, batch: int = 1000) -> None:
        if partitions < 1:
            raise InvalidArgument(f"loadgen needs at least one partition, not {partitions}")
        if rate is not None and rate <= 0:
            raise InvalidArgument(f"loadgen rate must be positive, not {rate}")
        self._partitions = partitions
        self.rate = rate
        self.batch = batch
        self._base: tuple[float, OffsetFrontier] = (time.monotonic(), zero(partitions))
        self._lock = threading.Lock()
        self._committed = zero(partitions)

    @property
    def outputs(self) -> Sequence[str]:
        return ("orders",)

    @property
    def partitions(self) -> int:
        return self._partitions

    def shapes(self) -> Sequence[bytes]:
        return (b"loadgen orders v1",)

    @property
    def committed(self) -> OffsetFrontier:
        """The low watermarks: offsets below them are discarded."""
        with self._lock:
            return self._committed

    def head(self) -> OffsetFrontier:
        """The offsets produced so far in each partition (unbounded without a rate)."""
        if self.rate is None:
            return (2**62,) * self._partitions
        started, base = self._base
        per = int(self.rate * (time.monotonic() - started) / self._partitions)
        return tuple(b + per for b in base)

    def open(self, resume: OffsetFrontier) -> LoadGenReader:
        """A reader at ``resume``.

        Raises:
            OffsetOutOfRange: a partition's ``resume`` is below its low watermark.
        """
        if len(resume) != self._partitions:
            raise InvalidArgument(
                f"loadgen has {self._partitions} partitions, the frontier {len(resume)}"
            )
        self._check(resume)
        self._base = (time.monotonic(), resume)
        return LoadGenReader(self, resume)

    def _check(self, at: OffsetFrontier) -> None:
        committed = self.committed
        for p, (o, low) in enumerate(zip(at, committed, strict=True)):
            if o < low:
                raise OffsetOutOfRange(
                    f"loadgen partition {p}: offset {o} is below the retained offset {low} "
                    "(committed upstream, discarded)"
                )

    def _commit(self, frontier: OffsetFrontier) -> None:
        with self._lock:
            self._committed = frontier_join(self._committed, frontier)


class LoadGenReader:
    """Reads the generator from a frontier (see :class:`slatepy.sources.base.SourceReader`)."""

    def __init__(self, gen: LoadGen, at: OffsetFrontier) -> None:
        self._gen = gen
        self._at = at

    def poll(self, timeout: float) -> list[Event]:
        head = self._gen.head()
        if all(h <= a for h, a in zip(head, self._at, strict=True)):
            time.sleep(min(timeout, 0.05))
            head = self._gen.head()
        self._gen._check(self._at)  # retention: the reader must not fall behind it
        events: list[Event] = []
        new = list(self._at)
        for p, (a, h) in enumerate(zip(self._at, head, strict=True)):
            end = min(h, a + self._gen.batch)
            for o in range(a, end):
                events.append(Chunk(0, p, o, event(p, o)))
            new[p] = max(a, end)
        if tuple(new) != self._at:
            self._at = tuple(new)
            events.append(Progress(self._at))
        return events

    def commit(self, frontier: OffsetFrontier) -> None:
        self._gen._commit(frontier)

    def lag(self) -> int | None:
        if self._gen.rate is None:
            return None
        return sum(max(0, h - a) for h, a in zip(self._gen.head(), self._at, strict=True))

    def close(self) -> None:
        pass
