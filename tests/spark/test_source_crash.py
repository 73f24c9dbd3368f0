"""SIGKILL of an ingest running on Spark at each step (RFC 0027 §5 and §9), as
``tests/sources/test_crash.py`` does in-process: a driver process reading
``slatepy.postgres`` into ``slatepy.persist`` kills its whole process group (driver, JVM,
workers) right after the remap append (the first: before the snapshot is durable), after a
data append and after an upstream commit (``crashing_sources.py``), while transactions
commit concurrently; each restart resumes from Spark's checkpoint and the shards. Then, at
every time the remap shard binds, the data shard holds exactly the table's contents at the
bound LSN, no row twice, none missing, and the slot never confirmed beyond the shards'
offset resumption frontier."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from slatepy.persist import PersistClient
from tests.processes import ROOT
from tests.sources.conftest import logical_postgres, pg_url  # noqa: F401 - fixtures
from tests.sources.crashkit import (
    Txn,
    assert_bounded_reliance,
    check_bound_times,
    table_contents,
    workload,
)
from tests.sources.pgkit import setup_orders
from tests.spark.conftest import _missing
from tests.spark.crashing_sources import ENV

SLOT = "slatepy_orders"


def drive(store: str, pg: str, checkpoint: Path, mode: str, crash: str) -> tuple[int, str]:
    """Run the driver to its end (killed or done): its status and output."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.spark.ingest_spark_driver",
            store,
            pg,
            str(checkpoint),
            mode,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), ENV: crash},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: the kill takes JVM and workers
    )
    try:
        out, _ = child.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        out, _ = child.communicate()
        raise AssertionError(f"the driver did not end: {out[-3000:]}") from None
    return child.returncode, out


@pytest.mark.slow  # four Spark drivers (a JVM each): 1-4 minutes on a 2-core machine
def test_sigkill_of_a_spark_ingest_at_every_step(pg_url: str, tmp_path: Path) -> None:  # noqa: F811
    reason = _missing()
    if reason is not None:
        pytest.skip(reason)
    setup_orders(pg_url, rows=20)
    (tmp_path / "store").mkdir()
    store, checkpoint = f"file://{tmp_path / 'store'}", tmp_path / "ckpt"
    with PersistClient.open(store) as client:
        hold = client.open_critical_since("orders.remap", "test")  # keep the remap history
        initial = table_contents(pg_url)
        log: list[Txn] = []
        stop = threading.Event()
        writer = threading.Thread(
            target=workload,
            args=(pg_url, 3000, log, stop),
            kwargs={"pause": 0.1, "updated": 20},
        )
        writer.start()
        try:
            for point, n in (("remap-appended", 1), ("data-appended", 2), ("committed", 2)):
                seen = tmp_path / f"{point}.log"
                status, out = drive(store, pg_url, checkpoint, "stream", f"{point}:{n}:{seen}")
                assert status == -signal.SIGKILL, f"{point}: {status} {out[-3000:]}"
                assert len(seen.read_text().splitlines()) == n
                assert_bounded_reliance(client, "orders", pg_url, SLOT)
        finally:
            stop.set()
            writer.join(timeout=60)
        assert len(log) >= 10
        status, out = drive(store, pg_url, checkpoint, "drain", "")
        assert status == 0 and "DONE" in out, out[-3000:]
        assert_bounded_reliance(client, "orders", pg_url, SLOT)
        assert hold.since == 0
        assert check_bound_times(client, "orders", pg_url, log, initial) >= 3
