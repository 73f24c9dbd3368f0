"""Awaited batches of 1,000 on ``file://``: rate, CPU, fsyncs and PUTs per batch (issue 33).

    python -m bench.durable_batches --batches 100 --file-sync fsync fsync-file
    python -m bench.durable_batches --sequence --repeat 5 --trees /work/main .

Compactor off; 16-byte keys, 100-byte values. fsyncs are counted by wrapping ``os.fsync``
(every fsync slatepy issues goes through it), PUTs by the store's metrics. To compare two
trees, run it alternately with each tree first on ``PYTHONPATH`` (RFC 0006, issue 33).

``--sequence`` runs ``python -m bench --workload reopen``'s write phases instead, with the
in-process compactor at its defaults: 200,000 unawaited puts, then the same keys rewritten in
awaited batches of 1,000, then ``close()``; a fresh process per run, ``--trees`` interleaved
(each tree first on ``PYTHONPATH``). It reports the batch phase's rate, the median and p90
of one ``Db.write``, CPU per batch (the process, and the writer's thread alone), the
compactor thread's CPU during the phase (from ``/proc``, so Linux only), the close's time,
the process's CPU over the phase and the close together (work the compactor put off is done
by the close's drain), and where the data is after it: what competes with an awaited batch
for the GIL. ``--compactor in-process process`` adds, interleaved, the deployment where the
compactor runs in its own process and shares no GIL with the writer (``compactor="off"``,
``slatepy compactor URL`` started before the writes, polling every 0.1 s, and stopped by
SIGTERM after the close; "compactor CPU s" is then the child's, the other CPU figures the
writer's process alone).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from slatepy import Db, Settings, WriteBatch


def run(batches: int, file_sync: str) -> str:
    calls = [0]
    real = os.fsync

    def counting(fd: int) -> None:
        calls[0] += 1
        real(fd)

    os.fsync = counting
    try:
        with tempfile.TemporaryDirectory() as tmp:
            settings = Settings(compactor="off", file_sync=file_sync)  # type: ignore[arg-type]
            with Db.open(f"file://{tmp}/db", settings=settings) as db:
                written = []
                for b in range(batches):
                    batch = WriteBatch()
                    for i in range(b * 1000, (b + 1) * 1000):
                        batch.put(b"key%013d" % i, b"v" * 100)
                    written.append(batch)
                db.metrics.reset()
                calls[0] = 0
                cpu, start = time.process_time(), time.perf_counter()
                for batch in written:
                    db.write(batch)
                elapsed = time.perf_counter() - start
                cpu = time.process_time() - cpu
                puts = db.metrics.snapshot()["put"].requests
    finally:
        os.fsync = real
    return (
        f"| {file_sync} | {batches / elapsed:.1f} | {elapsed / batches * 1e3:.2f} "
        f"| {cpu / batches * 1e3:.2f} | {calls[0] / batches:.2f} | {puts / batches:.2f} |"
    )


SEQUENCE = """
import json, os, signal, statistics, subprocess, sys, tempfile, threading, time
from bench.engines import ENGINES
from slatepy import Db, Settings, WriteBatch
keys = [b"key%013d" % i for i in range(int(sys.argv[1]))]  # as bench.__main__.key
own_process = sys.argv[2] == "process"

def cpu_of(stat):
    with open(stat) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

def thread_cpu(name):
    if child is not None:  # the compactor's own process
        return cpu_of(f"/proc/{child.pid}/stat")
    ids = [t.native_id for t in threading.enumerate() if t.name == name]
    return sum(cpu_of(f"/proc/self/task/{tid}/stat") for tid in ids)

with tempfile.TemporaryDirectory() as tmp:
    url = f"file://{tmp}/db"
    # As the benchmark opens it; or with the compactor in its own process.
    engine = ENGINES["slatepy"](url, Settings(compactor="off") if own_process else Settings())
    db = engine.db
    child = None
    if own_process:
        # Nothing wakes it when writes come: it polls, every 0.1 s as a writer flushes.
        polls = dict(os.environ, SLATEPY_COMPACTION_INTERVAL="0.1")
        polls.update(SLATEPY_COMPACTION_MAX_INTERVAL="0.1")
        command = [sys.executable, "-m", "slatepy.cli.main", "compactor", url]
        quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        child = subprocess.Popen(command, env=polls, **quiet)
    engine.put_many(keys, b"v" * 100)
    compactor = thread_cpu("slatepy-compactor")
    latencies, writer = [], []
    cpu, start = time.process_time(), time.perf_counter()
    for first in range(0, len(keys), 1000):
        batch = WriteBatch()
        for key in keys[first : first + 1000]:
            batch.put(key, b"w" * 100)
        began, mine = time.perf_counter(), time.thread_time()
        db.write(batch)
        latencies.append(time.perf_counter() - began)
        writer.append(time.thread_time() - mine)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    compactor = thread_cpu("slatepy-compactor") - compactor
    began, total = time.perf_counter(), time.process_time()
    db.close()
    closed, total = time.perf_counter() - began, time.process_time() - total + cpu
    if child is not None:
        child.send_signal(signal.SIGTERM)  # it hands its lease back and exits
        child.wait(timeout=60)
    with Db.open(f"file://{tmp}/db", settings=Settings(compactor="off")) as again:
        view = again._view
        layout = f"L0 {len(view.l0)}, runs {len(view.sorted_runs)}"
batches = len(latencies)
print(json.dumps({
    "rows/s": len(keys) / elapsed,
    "write ms": statistics.median(latencies) * 1e3,
    "p90 ms": sorted(latencies)[int(batches * 0.9)] * 1e3,
    "CPU ms/batch": cpu / batches * 1e3,
    "writer CPU ms/batch": sum(writer) / batches * 1e3,
    "compactor CPU s": compactor,
    "close s": closed,
    "CPU s, batches + close": total,
    "after close": layout,
}))
"""


def sequence(trees: list[str], keys: int, repeat: int, compactors: list[str]) -> None:
    """``--sequence``: the reopen benchmark's write phases, trees (and where the compactor
    runs) interleaved (module doc)."""
    runs: dict[str, list[dict[str, float | str]]] = {
        f"{tree} {where}": [] for tree in trees for where in compactors
    }
    for _ in range(repeat):
        for name, results in runs.items():
            tree, where = name.rsplit(" ", 1)
            env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
            out = subprocess.run(
                [sys.executable, "-c", SEQUENCE, str(keys), where],
                cwd=tree,  # ``-c`` puts the working directory first on sys.path
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            results.append(json.loads(out.strip().splitlines()[-1]))
            print(name, results[-1], flush=True)
    figures = [k for k in next(iter(runs.values()))[0] if k != "after close"]
    print("| tree, compactor | " + " | ".join(figures) + " | after close |")
    print("|---|" + "---|" * (len(figures) + 1))
    for tree, results in runs.items():
        cells = []
        for figure in figures:
            values = [float(r[figure]) for r in results]
            cells.append(
                f"{statistics.median(values):,.2f} [{min(values):,.2f}-{max(values):,.2f}]"
            )
        layouts = sorted({str(r["after close"]) for r in results})
        print(f"| {tree} | " + " | ".join(cells) + f" | {'; '.join(layouts)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--file-sync", nargs="+", default=["fsync"], choices=["fsync", "fsync-file", "off"]
    )
    parser.add_argument("--sequence", action="store_true", help="see the module's doc")
    parser.add_argument("--keys", type=int, default=200_000, help="--sequence: keys written")
    parser.add_argument("--trees", nargs="+", default=["."], help="--sequence: source trees")
    parser.add_argument(
        "--compactor",
        nargs="+",
        default=["in-process"],
        choices=["in-process", "process"],
        help="--sequence: where the compactor runs (see the module's doc)",
    )
    args = parser.parse_args()
    if args.sequence:
        sequence(args.trees, args.keys, args.repeat, args.compactor)
        return
    print("| file_sync | batches/s | ms/batch | CPU ms/batch | fsyncs/batch | PUTs/batch |")
    print("|---|---|---|---|---|---|")
    for _ in range(args.repeat):
        for file_sync in args.file_sync:  # interleaved
            print(run(args.batches, file_sync), flush=True)


if __name__ == "__main__":
    main()
