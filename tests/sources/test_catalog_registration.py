"""``slatepy ingest --catalog URL`` records its source, remap and data shards before writing
(RFC 0028 Addendum C): idempotently on a rerun, never with a password, and a bad catalog
fails the ingest before anything is written."""

from __future__ import annotations

import io
import json
import os
import signal
import threading
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from slatepy.catalog import Source, open_catalog
from slatepy.catalog.register import register
from slatepy.cli.main import main


def _catalog(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/catalog.db"
    with open_catalog(url) as state:
        state.open()
    return url


def _ingest(args: list[str], seconds: float) -> tuple[int, str]:
    """Run ``slatepy ingest`` in this process until SIGTERM after ``seconds``."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    err = io.StringIO()
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(err):
            status = main(["ingest", *args])
    finally:
        timer.cancel()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return status, err.getvalue()


def _dump(url: str) -> dict[str, list[dict[str, dict[str, object]]]]:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["catalog", "dump", url, "--ignore-large-collections"]) == 0
    collections: dict[str, list[dict[str, dict[str, object]]]] = json.loads(out.getvalue())[
        "collections"
    ]
    return collections


def test_ingest_registers_its_source_and_shards_once(tmp_path: Path) -> None:
    catalog = _catalog(tmp_path)
    store = f"file://{tmp_path}/data"
    args = ["loadgen", "--partitions", "2", "--rate", "2000", "--into", store, "--shard", "gen"]
    args += ["--report-interval", "0.5", "--catalog", catalog]
    for _ in range(2):  # the rerun finds its objects: no duplicates, no uniqueness error
        status, err = _ingest(args, 1.5)
        assert status == 0, err
    dump = _dump(catalog)
    [source] = dump["sources"]
    assert source["value"] == {
        "name": f"gen@{store}",
        "kind": "loadgen",
        "connection": "",
        "location": store,
        "data_shard": "gen",
        "remap_shard": "gen.remap",
        "options": {"partitions": "2", "rate": "2000.0"},
    }
    shards = {(s["key"]["shard"], s["value"]["purpose"]) for s in dump["shards"]}
    assert shards == {("gen", "data"), ("gen.remap", "remap")}
    assert {s["value"]["owner"] for s in dump["shards"]} == {f"gen@{store}"}


def test_a_bad_catalog_fails_the_ingest_before_anything_is_written(tmp_path: Path) -> None:
    store = tmp_path / "data"
    for bad, spark in (
        (f"sqlite:///{tmp_path}/never-initialized.db", []),
        (f"file://{tmp_path}/nothing", []),
        (f"file://{tmp_path}/nothing", ["--spark"]),  # fails before Spark even starts
    ):
        args = ["loadgen", "--into", f"file://{store}", "--shard", "g", "--catalog", bad]
        status, err = _ingest(args + spark, 30)
        assert status == 1 and "UninitializedCatalog" in err, err
        assert err.strip().count("\n") == 0
        assert not store.exists()


def test_registration_drops_the_password_and_updates_in_place(tmp_path: Path) -> None:
    catalog = _catalog(tmp_path)
    for slot in ("s1", "s2"):
        source = Source(
            name="orders",
            kind="postgres",
            connection="postgresql://u:hunter2@127.0.0.1:5432/db?password=hunter2",
            location="file:///x",
            data_shard="o",
            remap_shard="o.remap",
            options={"slot": slot},
        )
        register(catalog, user="test", source=source, shards=[("file:///x", "o", "data")])
    dump = _dump(catalog)
    assert "hunter2" not in json.dumps(dump)
    [row] = dump["sources"]
    assert row["value"]["options"] == {"slot": "s2"} and row["key"] == {"id": 1}
    with open_catalog(catalog) as state:
        state.open_read_only()
        changes = [e for _, e in state.audit_log() if "sources" in str(e)]
    assert len(changes) == 2  # created once, updated once: the rerun with s2 is no duplicate
