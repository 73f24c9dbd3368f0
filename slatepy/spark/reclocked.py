"""What the Spark stream readers of sources share (RFC 0027 §9): the remap shard ``S.remap``
beside the data shard ``S`` that ``slatepy.persist`` writes, offsets that are the source's
offset frontiers (``{"offsets": [...]}``), minting a binding for each batch's end on the
driver before Spark plans it, and a ``commit`` that follows the shards' uppers rather than
Spark's checkpoint."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from slatepy.persist import PersistClient, SinceHandle, UpperMismatch, WriteHandle
from slatepy.persist.frontier import meet
from slatepy.sources import remap
from slatepy.sources.base import OffsetFrontier
from slatepy.sources.ingest import SINCE_HOLDER, check_unmoved, conflict, remap_shard_of


class Reclocked:
    """Driver-side state of one stream: persist handles and the loaded bindings."""

    def __init__(self, url: str, consensus: str | None, shard: str) -> None:
        self.url, self.consensus, self.shard = url, consensus, shard
        self.remap_shard = remap_shard_of(shard)
        self.client: PersistClient | None = None

    def open(self, partitions: int, shapes: Sequence[bytes]) -> None:
        """Open the handles and load the bindings (once)."""
        if self.client is not None:
            return
        self.client = PersistClient.open(self.url, consensus=self.consensus)
        self.remap: WriteHandle = self.client.open_writer(self.remap_shard, purpose="spark")
        self.data: WriteHandle = self.client.open_writer(self.shard, purpose="spark resume")
        upper = self.remap.fetch_recent_upper()
        if upper == 0:
            with contextlib.suppress(UpperMismatch):  # made by a concurrent start
                self.remap.compare_and_append(remap.initial_updates(partitions, shapes), 0, 1)
            upper = self.remap.fetch_recent_upper()
        assert upper is not None
        self.since: SinceHandle = self.client.open_critical_since(self.remap_shard, SINCE_HOLDER)
        reader = self.client.open_leased_reader(self.remap_shard, purpose="spark resume")
        try:
            self.bindings = remap.load(reader, partitions, upper)
        finally:
            reader.expire()

    def resumption(self) -> int:
        """The timestamp resumption frontier: the meet of the two shards' uppers."""
        t = meet([self.data.fetch_recent_upper(), self.remap.fetch_recent_upper()])
        assert t is not None
        return t

    def end(self, start: OffsetFrontier, candidate: OffsetFrontier) -> OffsetFrontier:
        """The end of the next batch from ``start`` reading up to ``candidate``: a frontier
        bound already (catching up after a restart), else ``candidate`` bound now at a new
        time (one remap ``compare_and_append``)."""
        bound = self.bindings.aligned(start, candidate)
        if bound is not None or candidate == start:
            return bound if bound is not None else start
        latest = self.bindings.latest
        upper = self.bindings.upper
        ts = max(upper, int(time.time() * 1000))
        try:
            self.remap.compare_and_append(remap.bind_updates(ts, latest, candidate), upper, ts + 1)
        except UpperMismatch as exc:
            assert self.client is not None
            raise conflict(
                self.client,
                self.remap,
                kind="remap",
                current=exc.current,
                expected=upper,
                when="under this stream",
            ) from exc
        self.bindings.mint(ts, candidate)
        return candidate

    def check_unmoved(self, when: str) -> None:
        """Raise :class:`IngestConflict` if another ingest wrote the remap shard; asked when
        the source said offsets this stream needs are gone. Only this stream binds in the
        remap shard, so its upper moved beyond the loaded bindings' means another writer,
        whose upstream commits explain what the source said. The conflict is raised without
        that cause (``from None``): its text ("that WAL may be gone") is not true then, and a
        Spark user reads the traceback's first exception first. (The data shard is not
        compared: this stream's own sink moves it.)"""
        assert self.client is not None
        check_unmoved(self.client, [("remap", self.remap, self.bindings.upper)], when)

    def commit(self) -> OffsetFrontier | None:
        """Move the remap since to the resumption frontier; the offsets to commit upstream
        (None before anything is durable)."""
        t = self.resumption()
        if t <= 0:
            return None
        held = self.since.since
        if held is None or held < t - 1:
            self.since.compare_and_downgrade_since(self.since.opaque, self.since.opaque, t - 1)
        self.bindings.compact(t - 1)
        return self.bindings.before(t)

    def close(self) -> None:
        if self.client is not None:
            self.remap.expire()
            self.data.expire()
            self.client.close()
            self.client = None


SCHEMA = "key binary, value binary, time long, diff long"
"""The columns of a reclocked source's stream."""

_BATCH = 8192


def arrow_batches(rows: Iterable[tuple[bytes, bytes, int, int]]) -> Iterator[Any]:
    """``rows`` as Arrow record batches of :data:`SCHEMA` (Spark moves Arrow batches from a
    Python reader far faster than tuples)."""
    import pyarrow as pa

    schema = pa.schema(
        [("key", pa.binary()), ("value", pa.binary()), ("time", pa.int64()), ("diff", pa.int64())]
    )
    chunk: list[tuple[bytes, bytes, int, int]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= _BATCH:
            yield pa.RecordBatch.from_arrays(
                [list(c) for c in zip(*chunk, strict=True)], schema=schema
            )
            chunk = []
    if chunk:
        yield pa.RecordBatch.from_arrays([list(c) for c in zip(*chunk, strict=True)], schema=schema)


def offsets_of(offset: dict[str, Any]) -> OffsetFrontier:
    """The frontier of a Spark offset."""
    return tuple(int(o) for o in offset["offsets"])
