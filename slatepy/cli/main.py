"""The ``slatepy`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from slatepy.config import Settings
from slatepy.errors import SlatepyError
from slatepy.store.url import open_store


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slatepy",
        description="slatepy: an LSM key-value store on object storage. Store settings come "
        "from SLATEPY_* environment variables (e.g. SLATEPY_S3_ENDPOINT) and AWS_*.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run a realistic workload on a local-directory store")
    demo.add_argument("--dir", type=Path, default=Path("slatepy-demo-data"))
    demo.add_argument("--orders", type=int, default=20_000)
    compact = sub.add_parser("compact", help="compact a database until nothing is left to do")
    compact.add_argument("url")
    inspect = sub.add_parser("inspect", help="show the manifest, WAL and SSTs of a database")
    inspect.add_argument("url")
    inspect.add_argument("--limit", type=int, default=20, help="WAL SSTs to summarise")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "demo":
            from slatepy.cli.demo import run_demo

            run_demo(args.dir, orders=args.orders)
        elif args.command == "compact":
            from slatepy.compactor import Compactor

            settings = Settings.from_env()
            compactor = Compactor(open_store(args.url, settings), settings=settings)
            rounds = compactor.run_until_idle()
            m = compactor.last_published.manifest
            print(
                f"compactor epoch {compactor.epoch}: {rounds} compactions; "
                f"wal_id_last_compacted={m.wal_id_last_compacted}, "
                f"l0={len(m.l0)}, sorted runs={len(m.sorted_runs)}"
            )
        elif args.command == "inspect":
            from slatepy.cli.inspect import inspect

            print(inspect(open_store(args.url, Settings.from_env()), limit=args.limit))
    except SlatepyError as exc:
        print(f"slatepy: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
