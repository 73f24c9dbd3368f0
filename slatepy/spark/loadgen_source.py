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

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from slatepy.errors import InvalidArgument
from slatepy.sources.base import OffsetFrontier
from slatepy.sources.loadgen import LoadGen, event
from slatepy.spark.reclocked import SCHEMA, Reclocked, arrow_batches, offsets_of

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


def _rows(partition: LoadGenPartition) -> Iterator[tuple[bytes, bytes, int, int]]:
    i = 0
    for o in range(partition.lo, partition.hi):
        while partition.uppers[i] <= o:
            i += 1
        t = partition.times[i]
        for key, value, diff in event(partition.partition, o):
            yield key, value, t, diff


class LoadGenDataSource(DataSource):
    """``format("slatepy.loadgen")`` (a stream only)."""

    @classmethod
    def name(cls) -> str:
        return "slatepy.loadgen"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return LoadGenStreamReader(loadgen_config(self.options))


class LoadGenStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The driver side: offsets, minting bindings, planning, committing."""

    def __init__(self, config: LoadGenConfig) -> None:
        self.config = config
        self._gen = LoadGen(config.partitions, config.rate)
        self._state = Reclocked(config.url, config.consensus, config.shard)
        self._until: OffsetFrontier | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Spark pickles the reader (to its driver-side worker and with each task): only
        the options travel; clients, handles and the generator's lock are made again."""
        return {"config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"])  # type: ignore[misc]

    def _open(self) -> Reclocked:
        self._state.open(self.config.partitions, self._gen.shapes())
        return self._state

    def _target(self) -> OffsetFrontier:
        head = self._gen.head()
        if self.config.end is not None:
            head = tuple(min(h, self.config.end) for h in head)
        return head

    def initialOffset(self) -> dict[str, Any]:
        state = self._open()
        return {"offsets": list(state.bindings.before(state.resumption()))}

    def prepareForTriggerAvailableNow(self) -> None:
        self._until = self._target()

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, Any]:
        state = self._open()
        lo = offsets_of(start) if start else state.bindings.before(state.resumption())
        target = self._until if self._until is not None else self._target()
        step = self.config.per_trigger
        candidate = tuple(max(a, min(t, a + step)) for a, t in zip(lo, target, strict=True))
        return {"offsets": list(state.end(lo, candidate))}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        b = self._open().bindings
        lo, hi = offsets_of(start), offsets_of(end)
        self._gen._check(lo)  # retention: a replay below the committed offsets fails
        return [
            LoadGenPartition(p, lo[p], hi[p], tuple(b.times), tuple(f[p] for f in b.frontiers))
            for p in range(self.config.partitions)
            if hi[p] > lo[p]
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, LoadGenPartition)
        return arrow_batches(_rows(partition))

    def commit(self, end: dict[str, Any]) -> None:
        offsets = self._open().commit()
        if offsets is not None:
            self._gen._commit(offsets)

    def stop(self) -> None:
        self._state.close()
