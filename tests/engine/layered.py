"""A database whose keys live in every layer at once: sorted runs, L0 and the memtable."""

from __future__ import annotations

import random
from collections.abc import Sequence

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.compactor.planner import CompactionPolicy
from slatepy.store.base import ObjectStore

Op = tuple[bytes, bytes | None]
TO_RUN = CompactionPolicy(l0_trigger=1, target_sst_bytes=4096)
TO_L0 = CompactionPolicy(l0_trigger=1000, target_sst_bytes=4096)


def apply(db: Db, ops: Sequence[Op], model: dict[bytes, bytes]) -> None:
    """Write ``ops`` (value None deletes) as one batch and to ``model``."""
    if not ops:
        return
    batch = WriteBatch()
    for key, value in ops:
        if value is None:
            batch.delete(key)
            model.pop(key, None)
        else:
            batch.put(key, value)
            model[key] = value
    db.write(batch)


def compact(store: ObjectStore, settings: Settings, policy: CompactionPolicy, db: Db) -> None:
    Compactor(store, settings=settings, policy=policy).run_until_idle()
    db.refresh()


def layered(
    db: Db,
    store: ObjectStore,
    settings: Settings,
    phases: Sequence[Sequence[Op]],
    model: dict[bytes, bytes],
) -> None:
    """Phase 0 ends in a sorted run, phases 1 and 2 in L0 (overlapping SSTs), later phases
    stay in the memtable."""
    for i, ops in enumerate(phases):
        apply(db, ops, model)
        if i == 0:
            compact(store, settings, TO_RUN, db)
        elif i in (1, 2):
            compact(store, settings, TO_L0, db)


def random_phases(seed: int, n: int, keys: int) -> list[list[Op]]:
    rng = random.Random(seed)
    phases: list[list[Op]] = []
    for _ in range(4):
        ops: list[Op] = []
        for i in range(n):
            key = b"k%05d" % rng.randrange(keys)
            ops.append((key, None if rng.random() < 0.2 else b"v%d-%d" % (len(phases), i)))
        phases.append(ops)
    return phases
