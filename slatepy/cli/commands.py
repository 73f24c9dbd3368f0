"""``slatepy scan``, ``compact``, ``compactor`` and ``gc``: thin wrappers that print."""

from __future__ import annotations

import importlib
import logging
import sys

from slatepy.compactor import BackgroundCompactor, Compactor
from slatepy.compactor.lease import default_holder
from slatepy.config import Settings
from slatepy.engine.reader import DbReader
from slatepy.errors import InvalidArgument, NotFound
from slatepy.gc import GarbageCollector, GcReport
from slatepy.manifest.store import ManifestStore
from slatepy.store.base import ObjectStore
from slatepy.table.merge_operator import MergeOperator

ADMIN_COMMANDS = ("inspect", "scan", "compact", "compactor", "gc")
"""Commands that work on an existing database and must never create one."""


def show(data: bytes) -> str:
    """Bytes for a terminal: UTF-8 where it is, ``\\xNN`` escapes where it is not."""
    return data.decode("utf-8", "backslashreplace")


def require_database(store: ObjectStore) -> None:
    """Raise ``NotFound`` unless ``store`` holds a database (at least one manifest).

    The admin commands check this first so that a mistyped URL is an error (exit status 1)
    rather than an empty report, an empty database created by ``compact``, or a pass of GC
    over nothing. One LIST; the manifest itself is left to the command to read.
    """
    if ManifestStore(store).latest_id() is None:
        raise NotFound(
            f"no slatepy database at {store.url}: it has no manifest/ objects. Is the URL "
            "right? Only a writer (Db.open) creates a database.",
            path="manifest/",
        )


def scan(
    store: ObjectStore,
    settings: Settings,
    start: str,
    end: str | None,
    limit: int,
    *,
    snapshot: bool = False,
) -> None:
    """Print ``key<TAB>value`` lines from a reader.

    Read-only by default: a scan lasts seconds, far less than ``gc_min_age`` (the grace
    period that protects a reader without a snapshot), and an inspection tool should neither
    write to the database it looks at nor need write access to it. ``snapshot`` registers a
    snapshot for the scan (removed after), for scans longer than ``gc_min_age``.
    """
    with DbReader.open(store, settings=settings, read_only=not snapshot) as reader:
        rows = reader.scan(start.encode(), None if end is None else end.encode())
        for count, (key, value) in enumerate(rows, 1):
            print(f"{show(key)}\t{show(value)}")
            if count == limit:
                print(f"(stopped after --limit {limit})")
                break


def load_merge_operator(spec: str | None) -> MergeOperator | None:
    """The merge operator named ``module:attribute`` (``--merge-operator``; RFC 0019).

    Raises:
        InvalidArgument: the name is malformed, or does not import as a callable.
    """
    if spec is None:
        return None
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise InvalidArgument(f"--merge-operator {spec!r}: give it as module:function")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise InvalidArgument(f"--merge-operator {spec!r} does not import: {exc}") from exc
    if not callable(found):
        raise InvalidArgument(f"--merge-operator {spec!r} is not callable")
    operator: MergeOperator = found
    return operator


def compact(
    store: ObjectStore,
    settings: Settings,
    *,
    force: bool = False,
    merge_operator: MergeOperator | None = None,
) -> None:
    """Compact until nothing is left, then exit. Refuses (``CompactorBusy``) while another
    compactor's lease is live unless ``force``; a writer's compactor superseded by this run
    takes compaction back ``compactor_lease`` after it ends (RFC 0013)."""
    compactor = Compactor(
        store,
        settings=settings,
        holder=default_holder("slatepy compact"),
        takeover="always" if force else "unless-live",
        merge_operator=merge_operator,
    )
    rounds = compactor.run_until_idle()
    compactor.release()  # a superseded writer's compactor takes back at its next checks
    m = compactor.last_published.manifest
    print(
        f"compactor epoch {compactor.epoch}: {rounds} compactions; "
        f"wal_id_last_compacted={m.wal_id_last_compacted}, "
        f"l0={len(m.l0)}, sorted runs={len(m.sorted_runs)}"
    )


def run_compactor(
    store: ObjectStore,
    settings: Settings,
    *,
    force: bool = False,
    merge_operator: MergeOperator | None = None,
) -> None:
    """The compactor process: compaction and GC on their intervals until Ctrl-C. Refuses
    while another compactor's lease is live unless ``force``; superseded later, it stands by
    and takes compaction back when the other one leaves work pending (RFC 0013)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    compactor = Compactor(
        store,
        settings=settings,
        holder=default_holder("slatepy compactor"),
        takeover="always" if force else "unless-live",
        merge_operator=merge_operator,
    )
    print(
        f"compactor epoch {compactor.epoch} on {store.url}: compacting every "
        f"{settings.compaction_interval} s, collecting garbage every {settings.gc_interval} s"
    )
    BackgroundCompactor(compactor, gc=GarbageCollector(store, settings=settings)).run_forever()


def gc(
    store: ObjectStore,
    settings: Settings,
    *,
    dry_run: bool,
    min_age: float | None,
    verbose: bool = False,
) -> None:
    report = GarbageCollector(store, settings=settings, min_age=min_age).collect(dry_run=dry_run)
    print(describe_gc(report, verbose=verbose))


def describe_gc(report: GcReport, *, verbose: bool = False) -> str:
    """A summary of a GC pass: counts and bytes per kind; each object only with ``verbose``
    (a pass after a long run can delete thousands)."""
    lines = [
        f"current manifest {report.current_manifest}, active manifests {report.active_manifests}",
        report.summary(),
    ]
    if verbose:
        lines += [f"  {d.path}  ({d.size} B, {d.reason})" for d in report.deletions]
    elif report.deletions:
        lines.append("  (-v lists the objects)")
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
        report = run.run(seconds=seconds, progress=_progress)
    except Violation as exc:
        print(f"VIOLATION: {exc}")
        for line in run.report.lines():
            print("  " + line)
        return 1
    for line in report.lines():
        print("  " + line)
    return 1 if report.lost_acknowledged_writes else 0


def _progress(line: str) -> None:
    """Print a torture progress line at once (the soak runs for minutes, often into a log)."""
    print("  " + line)
    sys.stdout.flush()
