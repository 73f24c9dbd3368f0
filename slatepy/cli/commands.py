"""``slatepy scan``, ``compact``, ``compactor`` and ``gc``: thin wrappers that print."""

from __future__ import annotations

import logging

from slatepy.compactor import BackgroundCompactor, Compactor
from slatepy.config import Settings
from slatepy.engine.reader import DbReader
from slatepy.gc import GarbageCollector, GcReport
from slatepy.store.base import ObjectStore


def show(data: bytes) -> str:
    """Bytes for a terminal: UTF-8 where it is, ``\\xNN`` escapes where it is not."""
    return data.decode("utf-8", "backslashreplace")


def scan(store: ObjectStore, settings: Settings, start: str, end: str | None, limit: int) -> None:
    """Print ``key<TAB>value`` lines from a snapshot reader (its snapshot is removed after)."""
    with DbReader.open(store, settings=settings) as reader:
        rows = reader.scan(start.encode(), None if end is None else end.encode())
        for count, (key, value) in enumerate(rows, 1):
            print(f"{show(key)}\t{show(value)}")
            if count == limit:
                print(f"(stopped after --limit {limit})")
                break


def compact(store: ObjectStore, settings: Settings) -> None:
    compactor = Compactor(store, settings=settings)
    rounds = compactor.run_until_idle()
    m = compactor.last_published.manifest
    print(
        f"compactor epoch {compactor.epoch}: {rounds} compactions; "
        f"wal_id_last_compacted={m.wal_id_last_compacted}, "
        f"l0={len(m.l0)}, sorted runs={len(m.sorted_runs)}"
    )


def run_compactor(store: ObjectStore, settings: Settings) -> None:
    """The compactor process: compaction and GC on their intervals until Ctrl-C or fenced."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    compactor = Compactor(store, settings=settings)
    print(
        f"compactor epoch {compactor.epoch} on {store.url}: compacting every "
        f"{settings.compaction_interval} s, collecting garbage every {settings.gc_interval} s"
    )
    BackgroundCompactor(compactor, gc=GarbageCollector(store, settings=settings)).run_forever()


def gc(store: ObjectStore, settings: Settings, *, dry_run: bool, min_age: float | None) -> None:
    report = GarbageCollector(store, settings=settings, min_age=min_age).collect(dry_run=dry_run)
    print(describe_gc(report))


def describe_gc(report: GcReport) -> str:
    verb = "would delete" if report.dry_run else "deleted"
    lines = [
        f"current manifest {report.current_manifest}, active manifests {report.active_manifests}",
        f"{verb} {len(report.deletions)} objects, {report.bytes} bytes",
    ]
    lines += [f"  {d.path}  ({d.size} B, {d.reason})" for d in report.deletions]
    return "\n".join(lines)


def torture(
    store: ObjectStore, settings: Settings, seconds: float, seed: int, fault_rate: float
) -> int:
    """Run the torture workload; exit status 1 if any invariant failed or a write was lost."""
    from slatepy.testing.torture import Torture, Violation

    if store.list(""):
        print(f"{store.url} is not empty; torture needs a location of its own")
        return 2
    print(f"torture on {store.url}: {seconds:g} s, seed {seed}, fault rate {fault_rate:g}")
    run = Torture(store, seed=seed, fault_rate=fault_rate, settings=settings)
    try:
        report = run.run(seconds=seconds)
    except Violation as exc:
        print(f"VIOLATION: {exc}")
        for line in run.report.lines():
            print("  " + line)
        return 1
    for line in report.lines():
        print("  " + line)
    return 1 if report.lost_acknowledged_writes else 0
