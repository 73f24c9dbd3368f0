"""``spark.readStream.format("slatepy.loadgen")``: the load generator as a Spark stream,
reclocked through a remap shard so that it feeds ``slatepy.persist`` with bounded input
reliance (RFC 0027 §9)::

    df = spark.readStream.format("slatepy.loadgen").option("url", URL).option("shard", S) \
        .option("partitions", 4).load()
    df.writeStream.format("slatepy.persist").option("url", URL).option("shard", S) \
        .option("timeColumn", "time").option("checkpointLocation", CKPT).start()

Columns ``key``, ``value`` (binary), ``time``, ``diff`` (long). Spark's offsets are the
generator's offset frontiers (``{"offsets": [...]}``). The driver binds each micro-batch's end
frontier at a new time in the remap shard ``S.remap`` before Spark plans the batch, so every
row's ``time`` is the one the remap shard binds to its offset, and a batch Spark replays after
a crash gets the same times (the sink's idempotency keys drop the replay). ``commit`` ignores
Spark's end offset: it commits upstream (the generator's retention) and moves the remap since
at the resumption frontier read from the shards' uppers, as the in-process ingest does.

Options: ``url``, ``shard``, ``consensus``, ``partitions`` (4), ``rate`` (events/s; unset:
as fast as Spark reads), ``end`` (offsets per partition after which the log ends: a bounded
run, e.g. ``trigger(availableNow=True)``), ``maxOffsetsPerTrigger`` (per partition, 10,000).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from slatepy.errors import InvalidArgument
from slatepy.persist import PersistClient, SinceHandle, UpperMismatch, WriteHandle
from slatepy.persist.frontier import meet
from slatepy.sources import remap
from slatepy.sources.base import OffsetFrontier, frontier_join
from slatepy.sources.errors import IngestConflict
from slatepy.sources.ingest import SINCE_HOLDER, remap_shard_of
from slatepy.sources.loadgen import LoadGen, event

OPTIONS = frozenset(
    {"url", "path", "shard", "consensus", "partitions", "rate", "end", "maxoffsetspertrigger"}
)


@dataclass(frozen=True)
class LoadGenConfig:
    url: str
    shard: str
    consensus: str | None
    partitions: int
    rate: float | None
    end: int | None
    per_trigger: int


def loadgen_config(options: Mapping[str, str]) -> LoadGenConfig:
    """The checked options.

    Raises:
        InvalidArgument: naming the unknown, missing or malformed option.
    """
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    unknown = sorted(set(opts) - OPTIONS)
    if unknown:
        raise InvalidArgument(f"slatepy.loadgen: unknown option(s) {unknown}")
    url, shard = opts.get("url") or opts.get("path"), opts.get("shard")
    if not url or not shard:
        raise InvalidArgument('slatepy.loadgen: options "url" and "shard" are required')
    try:
        return LoadGenConfig(
            url=url,
            shard=shard,
            consensus=opts.get("consensus"),
            partitions=int(opts.get("partitions", "4")),
            rate=float(opts["rate"]) if "rate" in opts else None,
            end=int(opts["end"]) if "end" in opts else None,
            per_trigger=int(opts.get("maxoffsetspertrigger", "10000")),
        )
    except ValueError as exc:
        raise InvalidArgument(f"slatepy.loadgen: a malformed option: {exc}") from exc


@dataclass(frozen=True)
class LoadGenPartition(InputPartition):
    """Offsets ``[lo, hi)`` of one generator partition and the bindings covering them."""

    partition: int
    lo: int
    hi: int
    times: tuple[int, ...]
    uppers: tuple[int, ...]  # the bound offset of this partition at each time


class LoadGenDataSource(DataSource):
    """``format("slatepy.loadgen")`` (a stream only)."""

    @classmethod
    def name(cls) -> str:
        return "slatepy.loadgen"

    def schema(self) -> str:
        return "key binary, value binary, time long, diff long"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return LoadGenStreamReader(loadgen_config(self.options))


class LoadGenStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The driver side: offsets, minting bindings, planning, committing."""

    def __init__(self, config: LoadGenConfig) -> None:
        self.config = config
        self._gen = LoadGen(config.partitions, config.rate)
        self._client: PersistClient | None = None
        self._until: OffsetFrontier | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Spark pickles the reader (to its driver-side worker and with each task): only
        the options travel; clients, handles and the generator's lock are made again."""
        return {"config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"])  # type: ignore[misc]

    def _open(self) -> tuple[WriteHandle, WriteHandle, SinceHandle]:
        if self._client is None:
            cfg = self.config
            self._client = PersistClient.open(cfg.url, consensus=cfg.consensus)
            self._remap_shard = remap_shard_of(cfg.shard)
            self._remap = self._client.open_writer(self._remap_shard, purpose="spark remap")
            self._data = self._client.open_writer(cfg.shard, purpose="spark resumption")
            upper = self._remap.fetch_recent_upper()
            if upper == 0:
                initial = remap.initial_updates(cfg.partitions, self._gen.shapes())
                with contextlib.suppress(UpperMismatch):  # made by a concurrent start
                    self._remap.compare_and_append(initial, 0, 1)
                upper = self._remap.fetch_recent_upper()
            assert upper is not None
            self._since = self._client.open_critical_since(self._remap_shard, SINCE_HOLDER)
            reader = self._client.open_leased_reader(self._remap_shard, purpose="spark resume")
            try:
                self.bindings = remap.load(reader, cfg.partitions, upper)
            finally:
                reader.expire()
        return self._remap, self._data, self._since

    def _resumption(self) -> int:
        remap_w, data, _ = self._open()
        t = meet([data.fetch_recent_upper(), remap_w.fetch_recent_upper()])
        assert t is not None
        return t

    def _target(self) -> OffsetFrontier:
        head = self._gen.head()
        if self.config.end is not None:
            head = tuple(min(h, self.config.end) for h in head)
        return head

    def initialOffset(self) -> dict[str, Any]:
        t = self._resumption()
        return {"offsets": list(self.bindings.before(t))}

    def prepareForTriggerAvailableNow(self) -> None:
        self._until = self._target()

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, Any]:
        remap_w, _, _ = self._open()
        lo = tuple(start["offsets"]) if start else self.bindings.before(self._resumption())
        target = self._until if self._until is not None else self._target()
        end = tuple(
            max(a, min(t, a + self.config.per_trigger)) for a, t in zip(lo, target, strict=True)
        )
        bound = self.bindings.aligned(lo, end)
        if bound is not None:  # catching up with bindings made before a restart
            return {"offsets": list(bound)}
        if end == lo:
            return {"offsets": list(lo)}
        latest = self.bindings.latest
        end = frontier_join(end, latest)
        upper = self.bindings.upper
        ts = max(upper, int(time.time() * 1000))
        try:
            remap_w.compare_and_append(remap.bind_updates(ts, latest, end), upper, ts + 1)
        except UpperMismatch as exc:
            raise IngestConflict(
                f"remap shard {self._remap_shard!r} moved under this stream: another ingest "
                "of the same shards is running"
            ) from exc
        self.bindings.mint(ts, end)
        return {"offsets": list(end)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        self._open()
        lo, hi = tuple(start["offsets"]), tuple(end["offsets"])
        self._gen._check(lo)  # retention: a replay below the committed offsets fails
        b = self.bindings
        return [
            LoadGenPartition(p, lo[p], hi[p], tuple(b.times), tuple(f[p] for f in b.frontiers))
            for p in range(self.config.partitions)
            if hi[p] > lo[p]
        ]

    def read(self, partition: InputPartition) -> Iterator[tuple[bytes, bytes, int, int]]:
        assert isinstance(partition, LoadGenPartition)
        i = 0
        for o in range(partition.lo, partition.hi):
            while partition.uppers[i] <= o:
                i += 1
            t = partition.times[i]
            for key, value, diff in event(partition.partition, o):
                yield key, value, t, diff

    def commit(self, end: dict[str, Any]) -> None:
        _, _, since = self._open()
        t = self._resumption()
        if t <= 0:
            return
        offsets = self.bindings.before(t)
        since.compare_and_downgrade_since(since.opaque, since.opaque, t - 1)
        self.bindings.compact(t - 1)
        self._gen._commit(offsets)

    def stop(self) -> None:
        if self._client is not None:
            self._remap.expire()
            self._data.expire()
            self._client.close()
            self._client = None
