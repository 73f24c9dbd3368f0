"""``spark.readStream.format("slatepy.loadgen")`` into ``slatepy.persist`` (RFC 0027 §9):
every row lands at the time the remap shard binds to its offset, and the remap since and the
generator's retention follow the shards' uppers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slatepy.persist import PersistClient
from slatepy.persist.consolidation import consolidate
from slatepy.sources import remap
from slatepy.sources.loadgen import contents


def test_loadgen_stream_into_persist(spark: Any, tmp_path: Path) -> None:
    store = f"file://{tmp_path / 'store'}"
    (tmp_path / "store").mkdir()
    df = (
        spark.readStream.format("slatepy.loadgen")
        .option("url", store)
        .option("shard", "gen")
        .option("partitions", "2")
        .option("end", "300")
        .option("maxOffsetsPerTrigger", "150")
        .load()
    )
    query = (
        df.writeStream.format("slatepy.persist")
        .option("url", store)
        .option("shard", "gen")
        .option("timeColumn", "time")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None
    with PersistClient.open(store) as client:
        data_upper = client.open_writer("gen").fetch_recent_upper()
        remap_upper = client.open_writer("gen.remap").fetch_recent_upper()
        assert data_upper is not None and remap_upper is not None
        reader = client.open_leased_reader("gen.remap")
        bindings = remap.load(reader, 2, remap_upper)
        reader.expire()
        assert bindings.latest == (300, 300)
        assert data_upper == remap_upper
        data = client.open_leased_reader("gen")
        for t, offsets in zip(bindings.times, bindings.frontiers, strict=True):
            if t < data.since:  # type: ignore[operator]
                continue
            got = {kv: d for kv, _, d in consolidate(data.snapshot(t), since=t)}
            assert got == contents(offsets), f"time {t}, offsets {offsets}"
        data.expire()
        # Commits followed the shards: the remap since moved past the first batches.
        assert client.machine("gen.remap").fetch().since > 0


def test_the_ingest_command_on_spark(spark: Any, tmp_path: Path) -> None:
    """``slatepy ingest loadgen … --spark`` (in this process's Spark session): runs until
    stopped; the data shard holds exactly the events below the frontier bound at its last
    time."""
    import threading
    import time

    from slatepy.cli.ingest import run_spark
    from slatepy.cli.main import build_parser

    (tmp_path / "s").mkdir()
    store = f"file://{tmp_path / 's'}"
    command = ["ingest", "loadgen", "--partitions", "2", "--rate", "400", "--into", store]
    args = build_parser().parse_args([*command, "--shard", "g", "--spark"])
    stop = threading.Event()
    status: list[int] = []
    thread = threading.Thread(target=lambda: status.append(run_spark(args, stop, spark)))
    thread.start()
    deadline = time.monotonic() + 120
    with PersistClient.open(store) as client:
        while time.monotonic() < deadline and thread.is_alive():
            if "g" in client.list_shards() and (client.machine("g").fetch().upper or 0) > 1:
                break
            time.sleep(0.5)
        stop.set()
        thread.join(timeout=120)
        assert status == [0]
        upper = client.open_writer("g").fetch_recent_upper()
        assert upper is not None and upper > 1
        reader = client.open_leased_reader("g.remap")
        bindings = remap.load(reader, 2, client.open_writer("g.remap").fetch_recent_upper() or 0)
        reader.expire()
        data = client.open_leased_reader("g")
        got = {kv: d for kv, _, d in consolidate(data.snapshot(upper - 1), since=upper - 1)}
        data.expire()
        assert got == contents(bindings.before(upper)) != {}
