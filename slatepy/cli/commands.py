"""``slatepy scan``, ``compact``, ``compactor`` and ``gc``: thin wrappers that print."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib
import sys
from typing import Any

from slatepy.cli.output import escape, exit_on_sigterm, print_json
from slatepy.compactor import BackgroundCompactor, Compactor
from slatepy.compactor.lease import default_holder
from slatepy.config import Settings
from slatepy.engine import checkpoint as checkpoints
from slatepy.engine.clone import clone as clone_database
from slatepy.engine.clone import with_external
from slatepy.engine.reader import DbReader
from slatepy.errors import InvalidArgument, NotFound
from slatepy.gc import GarbageCollector, GcReport
from slatepy.gc.describe import describe_hold, human_bytes
from slatepy.manifest.store import ManifestStore
from slatepy.store.base import ObjectStore
from slatepy.store.stack import open_stack
from slatepy.store.url import open_store
from slatepy.table.merge_operator import MergeOperator

ADMIN_COMMANDS = ("inspect", "scan", "compact", "compactor", "gc", "checkpoint")
"""Commands that work on an existing database and must never create one."""


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
    start: bytes,
    end: bytes | None,
    limit: int,
    *,
    snapshot: bool = False,
    checkpoint: str | None = None,
    json: bool = False,
) -> None:
    """Print ``key<TAB>value`` lines (``output.escape``), or with ``json`` one
    ``{"key": ..., "value": ...}`` object per line; ``limit`` pairs at most (0: all). When the
    limit stops the scan, a note goes to standard error, never among the pairs.

    Read-only by default: a scan lasts seconds, far less than ``gc_min_age`` (the grace
    period that protects a reader without a snapshot), and an inspection tool should neither
    write to the database it looks at nor need write access to it. ``snapshot`` registers a
    snapshot for the scan (removed after), for scans longer than ``gc_min_age``.
    ``checkpoint`` scans that checkpoint's view (it protects itself; nothing is written).
    """
    with DbReader.open(
        store, settings=settings, read_only=not snapshot, checkpoint=checkpoint
    ) as reader:
        for count, (key, value) in enumerate(reader.scan(start, end), 1):
            if json:
                print_json({"key": escape(key), "value": escape(value)}, lines=True)
            else:
                print(f"{escape(key)}\t{escape(value)}")
            if count == limit:
                print(f"slatepy: stopped after --limit {limit}", file=sys.stderr)
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
    full: bool = False,
    merge_operator: MergeOperator | None = None,
    json: bool = False,
) -> None:
    """Compact until nothing is left, then exit (``full``: into one sorted run,
    :func:`~slatepy.compactor.planner.plan_full`). Refuses (``CompactorBusy``) while another
    compactor's lease is live unless ``force``; a writer's compactor superseded by this run
    takes compaction back ``compactor_lease`` after it ends (RFC 0013)."""
    compactor = Compactor(
        with_external(store, settings),  # a clone's compaction reads its source's SSTs
        settings=settings,
        holder=default_holder("slatepy compact"),
        takeover="always" if force else "unless-live",
        merge_operator=merge_operator,
    )
    rounds = compactor.run_until_idle(full=full)
    compactor.release()  # a superseded writer's compactor takes back at its next checks
    m = compactor.last_published.manifest
    if json:
        print_json(
            {
                "epoch": compactor.epoch,
                "compactions": rounds,
                "wal_id_last_compacted": m.wal_id_last_compacted,
                "l0": len(m.l0),
                "sorted_runs": len(m.sorted_runs),
            }
        )
        return
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
    compactor = Compactor(
        with_external(store, settings),
        settings=settings,
        holder=default_holder("slatepy compactor"),
        takeover="always" if force else "unless-live",
        merge_operator=merge_operator,
    )
    print(
        f"compactor epoch {compactor.epoch} on {store.url}: compacting every "
        f"{settings.compaction_interval} s, collecting garbage every {settings.gc_interval} s"
    )
    # A service manager stops it with SIGTERM: leave as on Ctrl-C (abandon the compaction in
    # progress, hand the lease back) instead of dying with the lease held until it lapses;
    # main() then exits 143.
    exit_on_sigterm()
    BackgroundCompactor(compactor, gc=GarbageCollector(store, settings=settings)).run_forever()


def gc(
    store: ObjectStore,
    settings: Settings,
    *,
    dry_run: bool,
    min_age: float | None,
    verbose: bool = False,
    json: bool = False,
) -> None:
    """One GC pass; prints ``describe_gc``, or with ``json`` the whole report."""
    report = GarbageCollector(store, settings=settings, min_age=min_age).collect(dry_run=dry_run)
    if json:
        print_json({**dataclasses.asdict(report), "summary": report.summary()})
    else:
        print(describe_gc(report, verbose=verbose))


def describe_gc(report: GcReport, *, verbose: bool = False) -> str:
    """A summary of a GC pass: counts and bytes per kind deleted, what is live, and what was
    held back, by reason, with when it becomes collectable (RFC 0017). Each object (deleted
    or held, with its reason and collectable time) only in a dry run or with ``verbose`` (a
    pass after a long run can delete thousands)."""
    lines = [
        f"current manifest {report.current_manifest}, active manifests {report.active_manifests}",
        report.summary(),
        f"live: {report.live_objects} objects, {human_bytes(report.live_bytes)} "
        "(the current manifest, its SSTs and the WAL not yet compacted)",
        *(
            f"shared: {count} SSTs, {human_bytes(size)} read from {url} (a clone's; its "
            "checkpoint there keeps them, and this GC never deletes them; it releases the "
            "checkpoint once compactions have rewritten them all)"
            for url, count, size in report.shared
        ),
        *(
            f"{'would release' if report.dry_run else 'released'} checkpoint {checkpoint_id} "
            f"in {url}: the clone reads nothing there any more, so that database's GC may "
            "collect what only the clone shared"
            for url, checkpoint_id in report.released
        ),
        report.held_summary(),
    ]
    if verbose or report.dry_run:
        verb = "would delete" if report.dry_run else "deleted"
        lines += [
            f"  {d.path}  ({human_bytes(d.size)}, {verb}: {d.reason})" for d in report.deletions
        ]
        lines += ["  " + describe_hold(h, now=report.now) for h in report.holds]
    elif report.deletions or report.holds:
        lines.append("  (-v or --dry-run lists the objects)")
    return "\n".join(lines)


def checkpoint(store: ObjectStore, settings: Settings, args: argparse.Namespace) -> None:
    """``slatepy checkpoint create|list|refresh|delete`` (RFC 0017); ``--json`` prints the
    checkpoint (``list``: a list of them; ``delete``: ``{"deleted": id}``)."""
    stack = open_stack(store, settings)
    json = args.json
    if args.checkpoint_command == "create":
        made = checkpoints.create_checkpoint(
            stack, settings, lifetime=args.lifetime, name=args.name
        )
        if json:
            return print_json(checkpoint_json(made))
        print(made.id)
        print(f"  {describe_checkpoint(made)}")
    elif args.checkpoint_command == "list":
        found = checkpoints.list_checkpoints(stack, settings)
        if json:
            return print_json([checkpoint_json(made) for made in found])
        if not found:
            print("no checkpoints")
        for made in found:
            print(f"{made.id}  {describe_checkpoint(made)}")
    elif args.checkpoint_command == "refresh":
        made = checkpoints.refresh_checkpoint(stack, settings, args.id, args.lifetime)
        if json:
            return print_json(checkpoint_json(made))
        print(f"{made.id}  {describe_checkpoint(made)}")
    else:
        checkpoints.delete_checkpoint(stack, settings, args.id)
        if json:
            return print_json({"deleted": args.id})
        print(f"deleted checkpoint {args.id}; GC may now collect what only it held")


def checkpoint_json(made: checkpoints.Checkpoint) -> dict[str, Any]:
    """A checkpoint for ``--json``: its fields, times in ISO 8601."""
    return {
        "id": made.id,
        "name": made.name,
        "manifest_id": made.manifest_id,
        "wal_id": made.wal_id,
        "create_time": made.create_time.isoformat(),
        "expire_time": None if made.expire_time is None else made.expire_time.isoformat(),
    }


def describe_checkpoint(made: checkpoints.Checkpoint) -> str:
    expiry = "never expires" if made.expire_time is None else f"expires {_utc(made.expire_time)}"
    name = f"{made.name!r} " if made.name else ""
    return (
        f"{name}manifest {made.manifest_id}, WAL to {made.wal_id}, "
        f"created {_utc(made.create_time)}, {expiry}"
    )


def _utc(at: dt.datetime) -> str:
    return at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def clone(
    src: str, dst: str, settings: Settings, *, checkpoint: str | None, json: bool = False
) -> None:
    """``slatepy clone SRC DST [--checkpoint ID] [--json]`` (RFC 0017)."""
    made = clone_database(src, dst, checkpoint=checkpoint, settings=settings)
    stored = ManifestStore(open_store(dst, settings)).load()
    holders = [] if stored is None else stored.manifest.external_dbs
    if json:
        held = [{"url": e.url, "checkpoint_id": e.checkpoint_id} for e in holders]
        return print_json(
            {
                "src": src,
                "dst": dst,
                "manifest_id": made.manifest_id,
                "wal_id": made.wal_id,
                "held_checkpoints": held,
            }
        )
    print(f"cloned {src} to {dst}: manifest {made.manifest_id}, WAL to {made.wal_id}")
    for external in holders:
        print(
            f"{external.url} keeps checkpoint {external.checkpoint_id} for the clone (it never "
            "expires; the clone's GC releases it once its compactions have rewritten every "
            "SST it shares): if you delete the clone before that, run "
            f"`slatepy checkpoint delete {external.url} {external.checkpoint_id}`"
        )


def torture(
    store: ObjectStore, settings: Settings, seconds: float, seed: int, fault_rate: float
) -> int:
    """Run the torture workload; exit status 1 if any invariant failed or a write was lost.

    Raises:
        InvalidArgument: the location is not empty (exit status 1, a refusal).
    """
    from slatepy.testing.torture import Torture, Violation

    if store.list(""):
        raise InvalidArgument(f"{store.url} is not empty; torture needs a location of its own")
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
