"""The upstream source interface (RFC 0027 §2).

An upstream's *offsets* are totally ordered per partition: a Kafka-style source has several
partitions, PostgreSQL one (the LSN). An **offset frontier** is a tuple with one int per
partition, the next offset not yet seen in each: "every update at an offset below it". Offset
frontiers are ordered element-wise; the ingest only ever moves them forward.

A reader opened at a frontier yields :class:`Chunk` s (updates at one offset of one
partition, for one output) and :class:`Progress` (every update below this frontier has been
yielded); :meth:`SourceReader.commit` tells the upstream it may discard everything below a
frontier. The snapshot of a source that starts with one (PostgreSQL) is yielded at offset
:data:`SNAPSHOT_OFFSET` (``0``), before any progress.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

OffsetFrontier = tuple[int, ...]
"""One offset per partition: the next offset not yet seen."""

Row = tuple[bytes, bytes, int]
"""``(key, value, diff)`` of one update (its time comes from reclocking)."""

SNAPSHOT_OFFSET = 0
"""The offset of a source's initial snapshot: below every offset it streams."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """Updates of ``output`` at ``offset`` of ``partition``."""

    output: int
    partition: int
    offset: int
    rows: list[Row]


@dataclass(frozen=True, slots=True)
class Progress:
    """Every update at an offset below ``frontier`` has been yielded."""

    frontier: OffsetFrontier


Event = Chunk | Progress


def frontier_le(a: OffsetFrontier, b: OffsetFrontier) -> bool:
    """``a <= b`` element-wise (the order of offset frontiers)."""
    return all(x <= y for x, y in zip(a, b, strict=True))


def frontier_join(a: OffsetFrontier, b: OffsetFrontier) -> OffsetFrontier:
    """The element-wise maximum."""
    return tuple(max(x, y) for x, y in zip(a, b, strict=True))


def zero(partitions: int) -> OffsetFrontier:
    """The least frontier (nothing seen) of a source with ``partitions`` partitions."""
    return (0,) * partitions


class SourceReader(Protocol):
    """A live read of an upstream, opened at a frontier."""

    def poll(self, timeout: float) -> list[Event]:
        """The events available now, waiting at most ``timeout`` seconds for the first."""
        ...

    def commit(self, frontier: OffsetFrontier) -> None:
        """Tell the upstream it may discard everything below ``frontier`` (which must be
        durable downstream). Never moves backwards."""
        ...

    def lag(self) -> int | None:
        """How far (in offsets) the upstream's head is ahead of the reader, if known."""
        ...

    def close(self) -> None:
        """Release the connection (and, for PostgreSQL, the slot)."""
        ...


class Source(Protocol):
    """An upstream service: its outputs (one data shard each) and partitions."""

    @property
    def outputs(self) -> Sequence[str]:
        """Names of the outputs (tables); each goes to its own data shard."""
        ...

    @property
    def partitions(self) -> int:
        """The width of the offset frontier."""
        ...

    def shapes(self) -> Sequence[bytes]:
        """Each output's shape (its columns and their types, encoded): recorded in the remap
        shard when the shards are made, and compared at every start."""
        ...

    def open(self, resume: OffsetFrontier) -> SourceReader:
        """Start reading at ``resume``: every update at an offset at or beyond it.

        Raises:
            OffsetOutOfRange / SlotLost: the upstream discarded offsets below ``resume``'s.
            SourceConfigError / SourceUnavailable: see :mod:`slatepy.sources.errors`.
        """
        ...
