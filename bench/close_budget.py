"""A/B of what a close merges when size-tiering would take a large run along (issue 33, stop 38).

    python bench/close_budget.py OLD_TREE NEW_TREE [ROUNDS]

Builds one database on ``file://`` (a sorted run of ``RUN_KEYS`` keys and two L0 SSTs of
``L0_KEYS`` keys each, interleaved with it: size-tiering merges the run along with them),
then, round by round and tree by tree (interleaved), copies it and opens and closes a
writer on the copy twice, each in a new process with the tree first on ``PYTHONPATH``
(``close_compaction_wait`` = ``WAIT``, a compaction interval of an hour so only the close
compacts). Per close: wall and process CPU seconds, the bytes of compacted SSTs it wrote
(kept or left for GC), and the layout after it (L0 SSTs, sorted runs). Run by path, not as
``-m bench...``: the old tree has no copy of this file. A benchmark, not a test.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUN_KEYS = 800_000  # a run of 96 MB; L0 2 x 13 MB: size-tiering takes the run along
L0_KEYS = 100_000
WAIT = 1.0
VALUE = b"v" * 100


def build(path: Path) -> None:
    from slatepy import Db, Settings, WriteBatch
    from slatepy.compactor import CompactionPolicy, Compactor
    from slatepy.store import open_store

    url = f"file://{path}"
    with Db.open(url, settings=Settings(compactor="off")) as db:
        compactor = Compactor(open_store(url), policy=CompactionPolicy(l0_trigger=1))

        def write(keys: range) -> None:
            for n, first in enumerate(range(keys.start, keys.stop, 1000 * keys.step), 1):
                batch = WriteBatch()
                for i in range(first, min(first + 1000 * keys.step, keys.stop), keys.step):
                    batch.put(b"%016d" % i, VALUE)
                db.write(batch)
                if n % 100 == 0 and first + 1000 * keys.step < keys.stop:
                    compactor.run_once()  # the WAL into L0, under max_unflushed_bytes
            assert type(compactor.run_once()).__name__ == "WalToL0"

        write(range(RUN_KEYS))
        compactor.run_once()  # L0 into the run
        step = RUN_KEYS // L0_KEYS
        write(range(0, RUN_KEYS, step))
        write(range(step // 2, RUN_KEYS, step))
        compactor.release()


def compacted(path: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in (path / "compacted").iterdir()}


def close_once(path: Path) -> dict[str, object]:
    from slatepy import Db, Settings

    settings = Settings(
        compaction_interval=3600, compactor_lease=3 * 3600, close_compaction_wait=WAIT
    )
    before = compacted(path)
    db = Db.open(f"file://{path}", settings=settings)
    wall, cpu = time.monotonic(), time.process_time()
    db.close()
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    written = sum(size for name, size in compacted(path).items() if name not in before)
    with Db.open(f"file://{path}", settings=Settings(compactor="off")) as reader:
        layout = (len(reader._view.l0), len(reader._view.sorted_runs))
    return {"wall": wall, "cpu": cpu, "written": written, "layout": layout}


def main() -> None:
    if sys.argv[1] == "--close":
        print(json.dumps([close_once(Path(sys.argv[2])) for _ in range(2)]))
        return
    trees = {"old": sys.argv[1], "new": sys.argv[2]}
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    results: dict[str, list[list[dict[str, object]]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        build(base)
        for r in range(rounds):
            for name, tree in trees.items():
                copy = Path(tmp) / f"{name}-{r}"
                shutil.copytree(base, copy)
                env = {**os.environ, "PYTHONPATH": tree}
                out = subprocess.run(
                    [sys.executable, __file__, "--close", str(copy)],
                    env=env,
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                closes = json.loads(out.splitlines()[-1])
                results[name].append(closes)
                shutil.rmtree(copy)
                for i, c in enumerate(closes):
                    print(
                        f"round {r + 1} {name} close {i + 1}: {c['wall']:.2f} s wall, "
                        f"{c['cpu']:.2f} s CPU, {c['written'] / 1e6:.1f} MB written, "
                        f"L0/runs after {c['layout']}",
                        flush=True,
                    )
    for name, per_round in results.items():
        for i in range(2):
            walls = [float(str(closes[i]["wall"])) for closes in per_round]
            cpus = [float(str(closes[i]["cpu"])) for closes in per_round]
            print(
                f"{name} close {i + 1}: wall median {statistics.median(walls):.2f} s "
                f"[{min(walls):.2f}-{max(walls):.2f}], CPU median {statistics.median(cpus):.2f} s"
                f" [{min(cpus):.2f}-{max(cpus):.2f}]"
            )


if __name__ == "__main__":
    main()
