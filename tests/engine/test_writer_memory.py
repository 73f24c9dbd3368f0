"""A writer's memory stays within its budgets (issue 33 item 4, docs/performance.md "Memory").

The in-process compactor writes through the writer's store stack, whose clone-routing layer
(``ExternalSsts``) used to fall back to ``ObjectStore.open_writer``'s buffered writer: every
compaction output was held whole in memory (up to ``target_sst_bytes``, 64 MiB) and copied
again by the store's ``put``, although the compactor streams it part by part. These tests pin
the stream through the writer's stack, and a writer's peak RSS in a child process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.store import ObjectStore, open_store
from slatepy.store.base import ObjectWriter, PutData, WrappingStore
from slatepy.table import sst_output

MB = 1024 * 1024


class Streams(WrappingStore):
    """Records, per path, the size of every piece streamed to it and every whole put."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.pieces: dict[str, list[int]] = {}
        self.puts: dict[str, int] = {}

    def put(self, path: str, data: PutData, *, mode: str = "overwrite") -> str | None:  # type: ignore[override]
        self.puts[path] = len(data)
        return self.inner.put(path, data, mode=mode)  # type: ignore[arg-type]

    def open_writer(self, path: str) -> ObjectWriter:
        return _Recording(self.pieces.setdefault(path, []), self.inner.open_writer(path))


class _Recording(ObjectWriter):
    def __init__(self, sizes: list[int], inner: ObjectWriter) -> None:
        self.sizes, self.inner = sizes, inner

    def write(self, data: PutData) -> None:
        self.sizes.append(len(data))
        self.inner.write(data)

    def commit(self) -> None:
        self.inner.commit()

    def abort(self) -> None:
        self.inner.abort()

    @property
    def requests(self) -> int:
        return self.inner.requests


def test_a_writers_own_compactor_streams_its_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Failed before the fix: the outputs reached the store as one ``put`` each."""
    monkeypatch.setattr(sst_output, "SEND_BYTES", 16 * 1024)
    store = Streams(open_store("memory://"))
    settings = Settings(block_size=512, flush_interval=60, compaction_interval=0.05)
    with Db.open(store, settings=settings) as db:
        for first in range(0, 8000, 500):
            batch = WriteBatch()
            for i in range(first, first + 500):
                batch.put(b"k%05d" % i, b"a" * 20)
            db.write(batch)
        deadline = time.monotonic() + 30
        while not db._view.l0 and time.monotonic() < deadline:  # the WAL compacted, in-process
            time.sleep(0.02)
        assert db._view.l0
    outputs = {p: s for p, s in store.pieces.items() if p.startswith("compacted/")}
    assert not [p for p in store.puts if p.startswith("compacted/")]
    # Whole data blocks, sent once 16 KiB are buffered, then the tail (index, filters, footer).
    assert outputs and all(max(sizes[:-1], default=0) < 2 * 16 * 1024 for sizes in outputs.values())
    assert any(len(sizes) >= 5 for sizes in outputs.values())  # streamed while built
    with Db.open(store, settings=Settings(compactor="off")) as db:
        assert list(db.scan()) == [(b"k%05d" % i, b"a" * 20) for i in range(8000)]


CHILD = """
import json, sys, time
from slatepy import Db

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024

start = status("VmRSS")
with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")
with Db.open(sys.argv[1]) as db:  # default settings: the in-process compactor merges L0
    deadline = time.monotonic() + 60
    while db._view.l0 and time.monotonic() < deadline:
        time.sleep(0.05)
    merged = not db._view.l0 and len(db._view.sorted_runs) == 1
print(json.dumps({"added_mb": status("VmHWM") - start, "merged": merged}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux VmHWM")
def test_a_writer_merging_l0_holds_parts_of_its_outputs_not_whole_outputs(
    tmp_path: Path,
) -> None:
    """A writer opened over four L0 SSTs of 32 MiB merges them into outputs of 64 MiB in its
    own compactor. Its peak RSS above its start is the compaction's read-ahead (16 MiB),
    output parts (8 MiB buffered, a few in the store's stream), one value per decoded
    column and the allocator's slack: about 95 MB here. Before the fix each 64 MiB output was
    buffered whole and copied by ``put``: +132 MB."""
    url = f"file://{tmp_path}/db"
    quiet = Settings(compactor="off", flush_interval=60)
    value = b"v" * (64 * 1024)
    keep_l0 = CompactionPolicy(l0_trigger=100, l0_max=100)
    with Db.open(url, settings=quiet) as db:
        compactor = Compactor(db._store, settings=quiet, policy=keep_l0)
        for sst in range(4):  # disjoint keys: each WalToL0 is one L0 SST of 32 MiB
            for i in range(512):
                db.put(b"k%02d%06d" % (sst, i), value, await_durable=False)
            db.flush()
            compactor.run_until_idle()
        assert len(compactor.last_published.manifest.l0) == 4
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, url],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["merged"], result
    assert result["added_mb"] < 115, result
