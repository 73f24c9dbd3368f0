"""How many sorted runs closes with a budget leave, simulated on the real planner (stop 38).

    python bench/close_runs_sim.py [DATABASES] [CYCLES]

Each simulated database starts with one run (0, 1, 10 or 100 times ``SCALE`` bytes) and goes
through CYCLES open-write-close cycles: 1 to 4 L0 SSTs of 1%, 10%, 30% or 50% of ``SCALE``
(the running compactor merging L0 at ``l0_trigger``, as it would while writing), then the
close's plan with ``close_budget`` (``CLOSE_L0_TRIGGER``). Merges are instant and sizes
add up (no overwrites). Prints, per budget (the first is no budget: the planner before stop
38), the most runs any database reached, its mean, how many closes merged, and the mean
number of sources (L0 SSTs + runs) after a close. A benchmark, not a test.
"""

from __future__ import annotations

import dataclasses
import random
import sys

import msgspec

from slatepy.compactor import CompactionPolicy, apply_result, plan
from slatepy.compactor.planner import CLOSE_L0_TRIGGER, L0ToRun
from slatepy.manifest import Manifest, SortedRun, SstHandle

SCALE = 1000
POLICY = CompactionPolicy()
CLOSING = dataclasses.replace(POLICY, l0_trigger=CLOSE_L0_TRIGGER)


def sst(name: str, size: int) -> SstHandle:
    return SstHandle(name, size, b"a", b"z", 1)


def simulate(seed: int, budget: int | None, cycles: int) -> tuple[int, int, float]:
    rnd = random.Random(seed)
    base = rnd.choice([0, 1, 10, 100]) * SCALE + 1
    manifest = Manifest(sorted_runs=(SortedRun(1, (sst("base", base),)),))
    made = most = closes = sources = 0

    def merge(todo: L0ToRun) -> None:
        nonlocal manifest, made
        size = sum(h.object_size for h in manifest.l0 if h.id in todo.l0_ids) + sum(
            h.object_size for r in manifest.sorted_runs if r.id in todo.run_ids for h in r.ssts
        )
        made += 1
        manifest = apply_result(manifest, todo, (sst(f"o{made}", size),), 0)

    per = rnd.choice([1, 2, 3, 5])
    for _ in range(cycles):
        for _ in range(rnd.randint(1, per)):
            made += 1
            size = int(SCALE * rnd.choice([0.01, 0.1, 0.3, 0.5]))
            manifest = msgspec.structs.replace(manifest, l0=(sst(f"l{made}", size), *manifest.l0))
            todo = plan(manifest, None, POLICY)
            if isinstance(todo, L0ToRun):
                merge(todo)
        todo = plan(manifest, None, CLOSING, close_budget=budget)
        if isinstance(todo, L0ToRun):
            merge(todo)
            closes += 1
        most = max(most, len(manifest.sorted_runs))
        sources += len(manifest.sorted_runs) + len(manifest.l0)
    return most, closes, sources / cycles


def main() -> None:
    databases = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    cycles = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    for budget in (None, 300, 1000, 3000):
        runs = [simulate(seed, budget, cycles) for seed in range(databases)]
        print(
            f"budget {budget}: most runs {max(r[0] for r in runs)}, mean of each database's "
            f"most {sum(r[0] for r in runs) / databases:.2f}, closes that merged "
            f"{sum(r[1] for r in runs)} of {databases * cycles}, mean sources after a close "
            f"{sum(r[2] for r in runs) / databases:.2f}"
        )


if __name__ == "__main__":
    main()
