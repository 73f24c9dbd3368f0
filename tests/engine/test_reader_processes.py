"""A reader in another process: lag, consistency under compaction and GC, snapshot protection."""

from __future__ import annotations

import datetime as dt
import json
import queue
import signal
import statistics
import subprocess
import threading
from pathlib import Path

import pytest

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.engine.view import compacted_ids
from slatepy.gc import GarbageCollector
from slatepy.manifest.store import ManifestStore
from tests.conftest import Backend, make_backend
from tests.engine.test_processes import settings_dict
from tests.processes import spawn

POLL = 0.05
TTL = 30.0
SMALL = CompactionPolicy(l0_trigger=2, size_ratio=2.0, max_wal_ssts=4, target_sst_bytes=4000)


class ReaderProcess:
    """``tests.engine.child_reader`` driven line by line, every answer awaited with a timeout."""

    def __init__(self, url: str, settings: Settings) -> None:
        config = {"url": url, "settings": settings_dict(settings)}
        self.proc = spawn(
            "tests.engine.child_reader",
            json.dumps(config),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.opened = self.answer(60)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.strip())

    def answer(self, timeout: float = 30) -> str:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            pytest.fail(f"reader process gave no answer in {timeout} s")

    def ask(self, command: str, timeout: float = 30) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.answer(timeout)

    def kill(self) -> None:
        """SIGKILL (no close, so the snapshot stays behind) and release the pipes."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def all_keys(round_no: int) -> WriteBatch:
    batch = WriteBatch()
    for i in range(100):
        batch.put(b"key%03d" % i, b"round-%03d" % round_no * 10)
    return batch


@pytest.mark.slow
@pytest.mark.parametrize("name", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_reader_in_another_process(
    name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    backend: Backend = make_backend(name, request, tmp_path)
    store = backend.store()
    fields = settings_dict(backend.settings)
    reader_settings = Settings.from_dict(
        {**fields, "reader_poll_interval": POLL, "reader_snapshot_ttl": TTL}
    )
    with Db.open(backend.url, settings=backend.settings) as db:
        db.write(all_keys(0))
        child = ReaderProcess(backend.url, reader_settings)
        try:
            assert child.opened.startswith("OPEN"), child.opened
            assert child.ask("SCAN") == "SCAN 100 1"

            # Lag: a durable write is visible within a poll interval plus one WAL read.
            lags = []
            for i in range(10):
                db.put(b"lag", b"%d" % i)
                seen = child.ask(f"WAIT lag {i} 10")
                assert seen.startswith("SEEN"), seen
                lags.append(float(seen.split()[1]))
            assert statistics.median(lags) < POLL + 0.5, lags

            # A consistent view (batches are atomic) while compaction and GC run under it.
            compactor = Compactor(store, settings=backend.settings, policy=SMALL)
            gc = GarbageCollector(store, min_age=1.0)
            for r in range(1, 9):
                db.write(all_keys(r))
                compactor.run_until_idle()
                gc.collect()
                assert child.ask("SCAN") == "SCAN 101 2"  # 100 keys of one round, and "lag"
                used = set(child.ask("VIEW").split()[1:])
                present = {m.path for m in store.list("compacted/")}
                assert {f"compacted/{i}.sst" for i in used} <= present
            last = b"round-008" * 10
            assert child.ask(f"WAIT key042 {last.decode()} 10").startswith("SEEN")

            # A reader that dies keeps the SSTs of its snapshot until the snapshot expires.
            child.kill()
            manifests = ManifestStore(store)
            current = manifests.load()
            assert current is not None
            (snapshot,) = current.manifest.snapshots  # the dead reader's
            used = compacted_ids(manifests.read(snapshot.manifest_id))
            assert used
            for r in range(9, 13):
                db.write(all_keys(r))
            compactor.run_until_idle()
            GarbageCollector(store, min_age=0).collect()
            present = {m.path for m in store.list("compacted/")}
            assert {f"compacted/{i}.sst" for i in used} <= present
            expired = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=TTL + 5)
            GarbageCollector(store, min_age=0, clock=lambda: expired).collect()
            present = {m.path for m in store.list("compacted/")}
            assert not {f"compacted/{i}.sst" for i in used} & present
            assert dict(db.scan())[b"key007"] == b"round-012" * 10
        finally:
            child.kill()
