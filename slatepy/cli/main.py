"""The ``slatepy`` command."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from slatepy.cli import output
from slatepy.cli.output import add_json, location, non_negative_float, non_negative_int
from slatepy.config import Settings, resolve_settings
from slatepy.errors import SlatepyError
from slatepy.store.base import ObjectStore
from slatepy.store.url import open_store


def _version() -> str:
    try:
        return importlib.metadata.version("slatepy")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    from slatepy.cli.wal import parse_start

    parser = argparse.ArgumentParser(
        prog="slatepy",
        description="slatepy: an LSM key-value store on object storage. Store settings come "
        "from SLATEPY_* environment variables (e.g. SLATEPY_S3_ENDPOINT), then the TOML file "
        "$SLATEPY_CONFIG, then AWS_* and the like (docs/configuration.md).",
        epilog="Exit status: 0 done, 1 refused or failed, 2 usage, 130 on SIGINT, 143 on "
        "SIGTERM. Keys and values print with \\\\ \\t \\n \\r and \\xNN escapes, and "
        "--start/--end take them so (docs/cli-conventions.md).",
    )
    parser.add_argument("--version", action="version", version=f"slatepy {_version()}")
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
        default=None,
        help="log to standard error from this level on (default: WARNING; INFO for compactor)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="run a realistic workload on a local directory (or any store with --url)"
    )
    where = demo.add_mutually_exclusive_group()
    where.add_argument(
        "--dir",
        type=Path,
        default=Path("slatepy-demo-data"),
        help="local directory of the database (default: ./slatepy-demo-data)",
    )
    where.add_argument(
        "--url",
        type=location,
        help="run on this database URL instead, e.g. s3://slatepy/mydb against MinIO "
        "(settings from SLATEPY_* as for every command)",
    )
    demo.add_argument(
        "--orders", type=_positive_int, default=20_000, help="orders to ingest (at least 1)"
    )
    inspect = sub.add_parser("inspect", help="show the manifest, levels, WAL and GC candidates")
    _url(inspect)
    inspect.add_argument("--limit", type=non_negative_int, default=20, help="WAL SSTs to summarise")
    inspect.add_argument(
        "--verify", action="store_true", help="read every object, check every checksum"
    )
    doctor = sub.add_parser("doctor", help="explain damage and what a repair would give up")
    _url(doctor)
    doctor.add_argument(
        "--repair", action="store_true", help="repair, giving up what the report names"
    )
    scan = sub.add_parser("scan", help="print key/value pairs (a read-only reader)")
    _url(scan)
    scan.add_argument(
        "--start",
        type=output.unescape,
        default=b"",
        help="first key (inclusive), escaped as scan prints keys (\\xNN, \\t, \\n, \\\\)",
    )
    scan.add_argument(
        "--end", type=output.unescape, default=None, help="last key (exclusive), escaped alike"
    )
    scan.add_argument(
        "--limit", type=non_negative_int, default=100, help="pairs to print (0 = all)"
    )
    scan.add_argument(
        "--snapshot",
        action="store_true",
        help="register a snapshot for the scan (needs write access); by default the scan is "
        "read-only, protected from GC by gc_min_age only, which outlasts any usual scan",
    )
    scan.add_argument("--checkpoint", default=None, help="read this checkpoint (RFC 0017)")
    compact = sub.add_parser("compact", help="compact a database until nothing is left to do")
    _url(compact)
    compact.add_argument(
        "--force",
        action="store_true",
        help="take over even while another compactor (a writer's in-process one) is live; "
        "it takes compaction back once this one leaves work pending for its lease",
    )
    compact.add_argument(
        "--full",
        action="store_true",
        help="then merge L0 and every sorted run into one run (rewrites the whole database "
        "once, as RocksDB's CompactRange; gets and scans then read one source)",
    )
    compactor = sub.add_parser(
        "compactor", help="run the compactor and garbage collector until interrupted"
    )
    _url(compactor)
    compactor.add_argument(
        "--force",
        action="store_true",
        help="take over even while another compactor (a writer's in-process one) is live; "
        "it takes compaction back once this one leaves work pending for its lease",
    )
    for command in (compact, compactor):
        command.add_argument(
            "--merge-operator",
            metavar="MODULE:FUNCTION",
            help="the database's merge operator (RFC 0019): needed to compact merges",
        )
    gc = sub.add_parser("gc", help="delete what no active manifest or snapshot can reach")
    _url(gc)
    gc.add_argument("--dry-run", action="store_true", help="list, do not delete")
    gc.add_argument(
        "--min-age",
        type=non_negative_float,
        default=None,
        help="seconds, >= 0 (default: settings)",
    )
    gc.add_argument("-v", "--verbose", action="store_true", help="list every object")
    _add_checkpoint_commands(sub)
    from slatepy.cli.catalog import add_catalog_commands

    add_catalog_commands(sub)
    torture = sub.add_parser(
        "torture", help="soak: a random workload under injected faults, checked against a model"
    )
    torture.add_argument(
        "url", type=location, help="an empty location (the soak writes its own database)"
    )
    torture.add_argument(
        "--seconds", type=non_negative_float, default=60.0, help="how long to run (seconds)"
    )
    torture.add_argument("--seed", type=int, default=0, help="the random workload's seed")
    torture.add_argument(
        "--fault-rate", type=output.fraction, default=0.1, help="per request, 0..1"
    )
    wal = sub.add_parser("wal", help="the write-ahead log: change data capture")
    wal_sub = wal.add_subparsers(dest="wal_command", required=True)
    tail = wal_sub.add_parser(
        "tail", help="print committed writes in commit order, one line each (read-only)"
    )
    _url(tail)
    tail.add_argument(
        "--from-seq",
        type=parse_start,
        default="oldest",
        help="first seq to print, or 'oldest' (default: the oldest the WAL holds) or 'end'",
    )
    tail.add_argument("--follow", action="store_true", help="keep printing new writes")
    dynamodb = sub.add_parser("dynamodb", help="the two-phase CAS table (cas=dynamodb)")
    dyn = dynamodb.add_subparsers(dest="dynamodb_command", required=True)
    create_table = dyn.add_parser(
        "create-table", help="create SLATEPY_DYNAMODB_TABLE (pk/sk, on demand)"
    )
    recover = dyn.add_parser("recover", help="complete every half-done two-phase write")
    _url(recover)
    from slatepy.cli.ingest import add_parser as add_ingest

    add_ingest(sub)
    persist = sub.add_parser("persist", help="persist shards: inspect and administer")
    psub = persist.add_subparsers(dest="persist_command", required=True)
    pinspect = psub.add_parser("inspect", help="a shard's state as JSON (all shards: a summary)")
    pinspect.add_argument("url", type=location, help="the blob store URL the persist client opens")
    pinspect.add_argument("shard", nargs="?", default=None, help="the shard (default: all)")
    padmin = psub.add_parser("admin", help="change a shard (a dry run unless --commit)")
    pasub = padmin.add_subparsers(dest="admin_command", required=True)
    pfinal = pasub.add_parser("finalize", help="finalize a shard whose since and upper are closed")
    pfinal.add_argument("url", type=location, help="the blob store URL of the shard")
    pfinal.add_argument("shard", help="the shard to finalize")
    pfinal.add_argument("--commit", action="store_true", help="do it (default: a dry run)")
    pgc = pasub.add_parser(
        "force-gc",
        help="one GC pass now: delete unreferenced parts, rollups and consensus entries "
        "(JSON report; a dry run unless --commit)",
    )
    pcompact = pasub.add_parser(
        "force-compaction",
        help="run the spine's merges now, whatever the background schedule (JSON report; "
        "a dry run unless --commit)",
    )
    for command in (pgc, pcompact):
        command.add_argument("url", type=location, help="the blob store URL of the shard")
        command.add_argument("shard", help="the shard to change")
        command.add_argument("--commit", action="store_true", help="do it (default: a dry run)")
    for command in (pinspect, pfinal, pgc, pcompact):
        command.add_argument(
            "--consensus", default=None, help="a postgresql:// URL (default: a log on the store)"
        )
    # Every command that reports takes --json (persist's print JSON already: accepted alike).
    for command in (inspect, doctor, compact, gc, create_table, recover, pinspect):
        add_json(command)
    add_json(scan, "print a JSON object per pair, a line each (keys and values escaped alike)")
    add_json(tail, "print a JSON object per write, a line each (keys and values escaped alike)")
    for command in (pfinal, pgc, pcompact):
        add_json(command, "print the report as JSON (it is JSON already)")
    return parser


def _url(parser: argparse.ArgumentParser) -> None:
    """The ``url`` argument of a database command: a URL or a plain directory path."""
    parser.add_argument(
        "url",
        type=location,
        help="the database: a URL (file://, s3://, memory://, ...) or a local directory path",
    )


def _add_checkpoint_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``slatepy checkpoint create|list|refresh|delete`` and ``slatepy clone`` (RFC 0017)."""
    checkpoint = sub.add_parser("checkpoint", help="checkpoints: views GC keeps until deleted")
    csub = checkpoint.add_subparsers(dest="checkpoint_command", required=True)
    create = csub.add_parser("create", help="checkpoint the durable state (prints its id)")
    _url(create)
    create.add_argument("--name", default=None, help="a label for humans")
    refresh = csub.add_parser("refresh", help="set a checkpoint's expiry from now")
    _url(refresh)
    refresh.add_argument("id", help="the checkpoint's id")
    for command in (create, refresh):
        command.add_argument(
            "--lifetime",
            type=non_negative_float,
            default=None,
            help="seconds until it expires (default: never)",
        )
    listing = csub.add_parser("list", help="the live checkpoints")
    _url(listing)
    delete = csub.add_parser("delete", help="delete a checkpoint (GC may then collect)")
    _url(delete)
    delete.add_argument("id", help="the checkpoint's id")
    clone = sub.add_parser(
        "clone", help="a new database at DST sharing SRC's SSTs (nothing is copied but the WAL)"
    )
    clone.add_argument("src", type=location, help="the database to clone (URL or path)")
    clone.add_argument("dst", type=location, help="where the clone goes (URL or path)")
    clone.add_argument(
        "--checkpoint", default=None, help="clone this checkpoint (default: the current state)"
    )
    for command in (create, refresh, listing, delete, clone):
        add_json(command)


def _positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``slatepy ARGV``; the exit status by the conventions of ``slatepy.cli.output``
    (argparse exits 2 itself on a usage error)."""
    args = build_parser().parse_args(argv)
    _configure_logging(args)
    json = getattr(args, "json", False)
    try:
        if args.command == "demo":
            from slatepy.cli.demo import run_demo

            run_demo(args.dir, orders=args.orders, url=args.url)
            return 0
        settings = resolve_settings()
        if args.command == "persist":
            return _persist(args, settings)
        if args.command == "catalog":
            from slatepy.cli.catalog import run_catalog

            return run_catalog(args, settings)
        if args.command == "ingest":
            from slatepy.cli.ingest import run as run_ingest

            return run_ingest(args, settings)
        if args.command == "dynamodb" and args.dynamodb_command == "create-table":
            from slatepy.store.dynamodb import create_table

            created = create_table(settings)
            if json:
                output.print_json({"table": settings.dynamodb_table, "created": created})
            else:
                print(
                    f"DynamoDB table {settings.dynamodb_table} {'created' if created else 'exists'}"
                )
            return 0
        if args.command == "clone":
            from slatepy.cli.commands import clone

            clone(args.src, args.dst, settings, checkpoint=args.checkpoint, json=json)
            return 0
        if args.command == "torture" or (args.command == "wal" and args.follow):
            output.exit_on_sigterm()  # long-running, like the compactor: SIGTERM exits 143
        # Only the torture soak may create its location; the rest need a database there.
        store = open_store(args.url, settings, create=args.command == "torture")
        from slatepy.cli.commands import ADMIN_COMMANDS, require_database

        if args.command in ADMIN_COMMANDS:
            require_database(store)
        if args.command in ("inspect", "doctor"):
            return _report(args, store, settings)
        if args.command == "scan":
            from slatepy.cli.commands import scan

            scan(
                store,
                settings,
                args.start,
                args.end,
                args.limit,
                snapshot=args.snapshot,
                checkpoint=args.checkpoint,
                json=json,
            )
        elif args.command == "compact":
            from slatepy.cli.commands import compact, load_merge_operator

            compact(
                store,
                settings,
                force=args.force,
                full=args.full,
                merge_operator=load_merge_operator(args.merge_operator),
                json=json,
            )
        elif args.command == "compactor":
            from slatepy.cli.commands import load_merge_operator, run_compactor

            run_compactor(
                store,
                settings,
                force=args.force,
                merge_operator=load_merge_operator(args.merge_operator),
            )
        elif args.command == "torture":
            from slatepy.cli.commands import torture

            return torture(store, settings, args.seconds, args.seed, args.fault_rate)
        elif args.command == "wal":
            from slatepy.cli.wal import tail

            tail(store, settings, args.from_seq, follow=args.follow, json=json)
        elif args.command == "dynamodb":
            recovered = store.recover()
            if json:
                output.print_json({"url": store.url, "recovered": recovered})
            else:
                print(f"recovered {recovered} pending two-phase writes on {store.url}")
        elif args.command == "checkpoint":
            from slatepy.cli.commands import checkpoint

            checkpoint(store, settings, args)
        elif args.command == "gc":
            from slatepy.cli.commands import gc

            gc(
                store,
                settings,
                dry_run=args.dry_run,
                min_age=args.min_age,
                verbose=args.verbose,
                json=json,
            )
    except SlatepyError as exc:
        print(f"slatepy: {type(exc).__name__}: {exc}", file=sys.stderr)
        return output.FAILED
    except OSError as exc:  # e.g. a path that is a file, a permission denied
        if isinstance(exc, BrokenPipeError):  # the reader left (| head): not an error to say
            output.silence_stdout()
        else:
            print(f"slatepy: {type(exc).__name__}: {exc}", file=sys.stderr)
        return output.FAILED
    except output.Terminated:
        return output.TERMINATED
    except KeyboardInterrupt:
        return output.INTERRUPTED
    return 0


def _configure_logging(args: argparse.Namespace) -> None:
    """``--log-level``: WARNING by default, INFO for the long-running ``compactor``."""
    level = args.log_level or ("INFO" if args.command == "compactor" else "WARNING")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.log_level:  # also where logging was configured already (embedding, tests)
        logging.getLogger().setLevel(level)


def _report(args: argparse.Namespace, store: ObjectStore, settings: Settings) -> int:
    """``inspect`` (with ``--verify``) and ``doctor``: a report and an exit status; with
    ``--json``, ``{"status": ..., "manifest": {...}, "lines": [...]}``: the exit status, the
    current manifest's numbers (``inspect.manifest_summary``) and the report as printed."""
    if args.command == "doctor":
        from slatepy.cli.doctor import doctor

        report, status = doctor(store, settings=settings, repair=args.repair)
    elif args.verify:
        from slatepy.cli.inspect import verify

        report, status = verify(store, settings=settings)
    else:
        from slatepy.cli.inspect import inspect

        report, status = inspect(store, limit=args.limit, settings=settings), 0
    if args.json:
        from slatepy.cli.inspect import manifest_summary

        found = {"status": status, "manifest": manifest_summary(store)}
        output.print_json({**found, "lines": report.splitlines()})
    else:
        print(report)
    return status


def _persist(args: argparse.Namespace, settings: Settings) -> int:
    from slatepy.cli import persist

    if args.persist_command == "inspect":
        print(
            persist.inspect_persist(
                args.url, args.shard, consensus=args.consensus, settings=settings
            )
        )
    elif args.admin_command in ("force-gc", "force-compaction"):
        import json

        from slatepy.cli import persist_admin

        command = (
            persist_admin.force_gc
            if args.admin_command == "force-gc"
            else persist_admin.force_compaction
        )
        result = command(
            args.url, args.shard, consensus=args.consensus, settings=settings, commit=args.commit
        )
        print(json.dumps(result.report, indent=2))
        if result.status:
            print(f"slatepy: {result.report['message']}", file=sys.stderr)
        return result.status
    else:
        message, status = persist.finalize_shard(
            args.url,
            args.shard,
            consensus=args.consensus,
            settings=settings,
            commit=args.commit,
        )
        if args.json:
            output.print_json({"shard": args.shard, "status": status, "message": message})
        else:
            print(message)
        if status:
            print(f"slatepy: {message}", file=sys.stderr)
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
