"""Reads over many overlapping L0 SSTs against the same keys in one sorted run (issue 33),
optionally A/B between source trees, each measurement a fresh process (a reopened reader).

    python -m bench.l0_reads --keys 200000 --l0 20 --repeat 3 [--trees /work/main .]
        [--preload numpy] [--dir DIR] [--overlay 4] [--scans 4]

Builds two ``file://`` databases of the same keys (16-byte keys, 100-byte values): ``l0``,
the keys shuffled into ``--l0`` flushes, each compacted to an L0 SST of its own (so every
SST spans the whole key space); ``run``, the same keys compacted into one sorted run; with
``--overlay``, ``overlay``: the run under that many L0 SSTs of 1% rewrites each. Then,
``--repeat`` rounds, layouts and trees interleaved, a child process per measurement (its
``PYTHONPATH`` the tree) opens a ``DbReader`` and times 10,000 random gets (cold: the first
touch of each block after the open) and a full scan (wall rate and CPU, ``process_time``,
all threads; with ``--scans N``, the median of N scans, each by a new reader: one scan's
CPU varies by a fifth between processes). Prints each figure's median and
[lowest-highest], and l0 / run ratios per tree and round (for ``scan cpu ms``, the merged
scan's cost over one run's: the 1.5x target).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.compactor.planner import CompactionPolicy
from slatepy.store import open_store

VALUE = b"v" * 100
GETS = 10_000
OFF = Settings(compactor="off")

CHILD = """
import json, random, sys, time
url, keys, gets, scans = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for module in sys.argv[5:]:
    __import__(module)  # already loaded by the application (numpy: slatepy merges with it)
import slatepy
from slatepy import DbReader, Settings
sample = random.Random(1).sample([b"key-%012d" % i for i in range(keys)], gets)
started = time.perf_counter()
reader = DbReader.open(url, settings=Settings(compactor="off"))
opened = time.perf_counter()
found = sum(reader.get(k) is not None for k in sample)
got = time.perf_counter()
cpu = time.process_time()
rows = sum(1 for _ in reader.scan())
scanned, scan_cpu = time.perf_counter(), time.process_time() - cpu
reader.close()
assert found == gets and rows == keys, (found, rows)
walls, cpus = [scanned - got], [scan_cpu]
for _ in range(scans - 1):  # each by a new reader: its block cache empty again
    reader = DbReader.open(url, settings=Settings(compactor="off"))
    wall, cpu = time.perf_counter(), time.process_time()
    assert sum(1 for _ in reader.scan()) == keys
    walls.append(time.perf_counter() - wall)
    cpus.append(time.process_time() - cpu)
    reader.close()
walls.sort()
cpus.sort()
print(json.dumps({"open_ms": (opened - started) * 1e3, "gets/s": gets / (got - opened),
                  "scan rows/s": rows / walls[len(walls) // 2],
                  "scan cpu ms": cpus[len(cpus) // 2] * 1e3, "slatepy": slatepy.__file__}))
"""


def build(root: Path, keys: int, l0: int) -> dict[str, str]:
    """The two layouts of the same keys; their URLs by name."""
    names = [b"key-%012d" % i for i in range(keys)]
    shuffled = names[:]
    random.Random(33).shuffle(shuffled)
    urls = {"l0": f"file://{root}/l0", "run": f"file://{root}/run"}
    per = -(-keys // l0)
    for layout, url in urls.items():
        with Db.open(url, settings=OFF) as db:
            for part in range(l0):
                chunk = sorted(shuffled[part * per : (part + 1) * per])
                for first in range(0, len(chunk), 1000):
                    batch = WriteBatch()
                    for key in chunk[first : first + 1000]:
                        batch.put(key, VALUE)
                    db.write(batch, await_durable=False)
                db.flush()
                if layout == "l0":
                    policy = CompactionPolicy(l0_trigger=10_000)
                    Compactor(open_store(url), settings=OFF, policy=policy).run_until_idle()
        policy = CompactionPolicy(l0_trigger=1 if layout == "run" else 10_000)
        Compactor(open_store(url), settings=OFF, policy=policy).run_until_idle()
        with Db.open(url, settings=OFF) as db:
            view = db._view
            print(f"{layout}: L0 {len(view.l0)}, runs {len(view.sorted_runs)}", flush=True)
    return urls


def build_overlay(root: Path, keys: int, count: int) -> str:
    """The ``overlay`` layout: the keys in one sorted run under ``count`` L0 SSTs, each
    rewriting 1% of the keys (random ones): a few fresh flushes over a compacted database."""
    url = f"file://{root}/overlay"
    rng = random.Random(38)
    with Db.open(url, settings=OFF) as db:
        for first in range(0, keys, 1000):
            batch = WriteBatch()
            for i in range(first, min(first + 1000, keys)):
                batch.put(b"key-%012d" % i, VALUE)
            db.write(batch, await_durable=False)
        db.flush()
        policy = CompactionPolicy(l0_trigger=1)
        Compactor(open_store(url), settings=OFF, policy=policy).run_until_idle()
        for _ in range(count):
            batch = WriteBatch()
            for i in rng.sample(range(keys), max(1, keys // 100)):
                batch.put(b"key-%012d" % i, VALUE.upper())
            db.write(batch, await_durable=False)
            db.flush()
            policy = CompactionPolicy(l0_trigger=10_000)
            Compactor(open_store(url), settings=OFF, policy=policy).run_until_idle()
    with Db.open(url, settings=OFF) as db:
        view = db._view
        print(f"overlay: L0 {len(view.l0)}, runs {len(view.sorted_runs)}", flush=True)
    return url


def measure(tree: str, url: str, keys: int, preload: list[str], scans: int = 1) -> dict[str, float]:
    """One child's figures, from ``tree``'s slatepy: ``-P`` keeps ``-c`` from putting the
    working directory (maybe another tree) before ``PYTHONPATH`` on ``sys.path``. With
    ``scans``, the scan figures are the median of that many full scans, each by a new
    reader."""
    tree = os.path.abspath(tree)
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run(
        [
            sys.executable,
            "-P",
            "-c",
            CHILD,
            url,
            str(keys),
            str(min(GETS, keys)),
            str(scans),
            *preload,
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    loaded = result.pop("slatepy")
    if not loaded.startswith(tree + os.sep):
        raise SystemExit(f"the child for {tree} imported slatepy from {loaded}")
    figures: dict[str, float] = result
    return figures


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} [{min(values):,.0f}-{max(values):,.0f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--l0", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--trees", nargs="+", default=["."])
    parser.add_argument("--dir", help="reuse (or build in) this directory")
    parser.add_argument(
        "--overlay",
        type=int,
        default=0,
        help="also measure a run under this many L0 SSTs of 1%% rewrites each",
    )
    parser.add_argument(
        "--scans",
        type=int,
        default=1,
        help="full scans per child, each by a new reader; the scan figures are their median",
    )
    parser.add_argument(
        "--preload",
        nargs="*",
        default=[],
        help="modules each child imports before opening (e.g. numpy, as an application may)",
    )
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="l0-reads-"))
    if (root / "run").exists():
        urls = {"l0": f"file://{root}/l0", "run": f"file://{root}/run"}
    else:
        urls = build(root, args.keys, args.l0)
    if args.overlay:
        overlay = root / "overlay"
        urls["overlay"] = f"file://{overlay}"
        if not overlay.exists():
            build_overlay(root, args.keys, args.overlay)
    samples: dict[tuple[str, str], list[dict[str, float]]] = {}
    for _ in range(args.repeat):
        for tree in args.trees:
            for layout, url in urls.items():
                samples.setdefault((tree, layout), []).append(
                    measure(tree, url, args.keys, args.preload, args.scans)
                )
    figures = ["open_ms", "gets/s", "scan rows/s", "scan cpu ms"]
    print("| tree | layout | " + " | ".join(figures) + " |")
    print("|---|---|" + "---|" * len(figures))
    for (tree, layout), runs in samples.items():
        cells = [spread([r[f] for r in runs]) for f in figures]
        print(f"| {tree} | {layout} | " + " | ".join(cells) + " |")
    for tree in args.trees:
        run = samples[(tree, "run")]
        for layout in (name for name in urls if name != "run"):
            for figure in figures[1:]:
                ratios = [
                    a[figure] / b[figure] for a, b in zip(samples[(tree, layout)], run, strict=True)
                ]
                print(
                    f"{tree}: {figure} {layout}/run per round "
                    + ", ".join(f"{r:.2f}" for r in ratios)
                )


if __name__ == "__main__":
    main()
