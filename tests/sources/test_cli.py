"""``slatepy ingest`` (RFC 0027 §7): runs until stopped, resumes after SIGKILL, prints
progress, exits 1 with a one-line cause on a definite error; ``persist inspect`` shows the
data and remap shards' frontiers."""

from __future__ import annotations

import io
import json
import queue
import signal
import subprocess
import sys
import threading
from contextlib import redirect_stdout
from pathlib import Path

from slatepy.cli.main import main
from slatepy.persist import PersistClient
from slatepy.sources import remap
from slatepy.sources.loadgen import contents
from tests.processes import ROOT, spawn
from tests.sources.pgkit import expected, setup_orders, snapshot


class Running:
    """A ``slatepy`` child whose stdout lines are collected by a thread."""

    def __init__(self, *args: str) -> None:
        self.proc = spawn("slatepy.cli.main", *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                self.lines.put(line)
        except ValueError:  # stop()'s communicate() closed the pipe under us
            pass

    def progress(self, count: int = 1, timeout: float = 30.0) -> list[str]:
        got = []
        while len(got) < count:
            line = self.lines.get(timeout=timeout)
            if line.startswith("ingest "):
                got.append(line)
        return got

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str]:
        self.proc.send_signal(sig)
        _, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, err


def frontiers(client: PersistClient, shard: str, partitions: int) -> tuple[int, remap.Bindings]:
    uppers = [client.open_writer(s).fetch_recent_upper() for s in (shard, f"{shard}.remap")]
    t = min(u for u in uppers if u is not None)
    reader = client.open_leased_reader(f"{shard}.remap")
    try:
        return t, remap.load(reader, partitions, uppers[1] or 0)
    finally:
        reader.expire()


def test_loadgen_runs_resumes_after_sigkill_and_stops(tmp_path: Path) -> None:
    store = f"file://{tmp_path}"
    args = ("ingest", "loadgen", "--partitions", "2", "--rate", "4000", "--into", store)
    args += ("--shard", "gen", "--report-interval", "0.5")
    first = Running(*args)
    first.progress(2)
    assert first.stop(signal.SIGKILL)[0] == -9
    second = Running(*args)
    lines = second.progress(2)
    status, err = second.stop()
    assert status == 0, err
    assert "updates (" in lines[-1] and "remap upper" in lines[-1]
    with PersistClient.open(store) as client:
        t, bindings = frontiers(client, "gen", 2)
        offsets = bindings.before(t)
        assert min(offsets) > 0
        got = snapshot(client, "gen", t - 1)
        assert got == contents(offsets)
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["persist", "inspect", store]) == 0
    shards = {s["shard"]: s for s in json.loads(out.getvalue())}
    assert shards["gen"]["upper"] >= t and shards["gen.remap"]["since"] == t - 1


def test_postgres_ingest_and_a_definite_error(pg_url: str, tmp_path: Path) -> None:
    store = f"file://{tmp_path}"
    setup_orders(pg_url, rows=10)
    bad = Running("ingest", pg_url, "--publication", "nope", "--into", store, "--shard", "o")
    _, err = bad.proc.communicate(timeout=30)
    assert bad.proc.returncode == 1
    assert err.strip().count("\n") == 0 and "publication 'nope' does not exist" in err
    run = Running(
        "ingest",
        pg_url,
        "--publication",
        "pub",
        "--into",
        store,
        "--shard",
        "o",
        "--report-interval",
        "1",
    )
    line = run.progress(1)[0]
    assert "LSN" in line and "lag" in line
    status, err = run.stop()
    assert status == 0, err
    with PersistClient.open(store) as client:
        t, _ = frontiers(client, "o", 1)
        assert snapshot(client, "o", t - 1) == expected(pg_url)["public.orders"]


def test_postgres_without_psycopg2_names_the_extra(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['psycopg2'] = None\n"
        "from slatepy.cli.main import main\n"
        "sys.exit(main(['ingest', 'postgresql://u@127.0.0.1:1/db', '--publication', 'p',"
        f" '--into', 'file://{tmp_path}', '--shard', 's']))\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert child.returncode == 1
    err = child.stderr
    assert 'pip install "slatepy[sources]"' in err and err.strip().count("\n") == 0


# A Spark query's failure as StreamingQueryException says it (trimmed): the error the stream
# raised is the last traceback line that names a slatepy error; the first line names none.
SPARK_FAILURE = """\
[STREAM_FAILED] Query [id = 63396dd7, runId = d8e2561e] terminated with exception: \
[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source \
perform planPartitions: Traceback (most recent call last):
  File "/work/main/slatepy/sources/postgres.py", line 276, in _start
    raise SlotLost(
slatepy.sources.errors.SlotLost: replication slot 'slatepy_orders' confirmed 0/1925478, \
beyond the shards' resumption LSN 0/1924F58: that WAL may be gone

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/work/main/slatepy/sources/ingest.py", line 137, in check_unmoved
    raise conflict(
slatepy.sources.errors.IngestConflict: remap shard 'orders.remap' moved to 17959 while \
this stream opened the source (expected 17958): another ingest of the same shards is \
running (writers: vm:23062 ingest remap); this one stops
 SQLSTATE: 38000 SQLSTATE: XXKST
=== Streaming Query ===
Current State: ACTIVE
"""


def test_a_failed_spark_query_is_reported_by_the_slatepy_error_that_stopped_it() -> None:
    """``slatepy ingest --spark`` prints what stopped the query, typed (it printed
    "SlatepyError: [STREAM_FAILED] Query [...] terminated with exception: ...")."""
    from slatepy.cli.ingest import query_failure

    assert query_failure(SPARK_FAILURE) == (
        "IngestConflict: remap shard 'orders.remap' moved to 17959 while this stream opened "
        "the source (expected 17958): another ingest of the same shards is running (writers: "
        "vm:23062 ingest remap); this one stops"
    )
    assert query_failure("[STREAM_FAILED] Query [id = 1] terminated\n  at Java frames") == (
        "SlatepyError: [STREAM_FAILED] Query [id = 1] terminated"
    )
