"""Durable catalog: open time and commit latency with 10,000 items, per implementation.

    python -m bench.catalog [--items 10000] [--commits 200] [--impls persist-file sqlite ...]

For each implementation (persist on files and on S3 over moto in its own process, the SQL
stash on SQLite and on a throwaway PostgreSQL on 127.0.0.1) a new catalog gets ``--items``
databases in commits of 1,000 (each also appends its audit events, so the catalog holds
twice as many rows). Then: ``open()`` of a new state (read everything, migrate in memory,
bump the epoch: one write), best and median of 3; ``open_read_only()``; and ``--commits``
single-item commits (one new database each, plus the audit events of it and its id
allocator), p50/p99/max. Prints a
Markdown table and writes ``bench/results/catalog.md``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from slatepy import Settings
from slatepy.catalog import open_catalog
from slatepy.testing.moto import create_bucket, moto_server
from slatepy.testing.postgres import postgres_server

IMPLS = ["persist-file", "persist-s3", "sqlite", "postgres"]


@contextmanager
def place(name: str) -> Iterator[tuple[str, Settings | None]]:
    """``(url, store settings)`` of an empty catalog location for ``name``."""
    with tempfile.TemporaryDirectory() as tmp:
        if name == "persist-file":
            yield f"file://{tmp}/persist", None
        elif name == "sqlite":
            yield f"sqlite:///{tmp}/catalog.db", None
        elif name == "postgres":
            with postgres_server() as server:
                yield server.url(), None
        elif name == "persist-s3":
            with moto_server(separate_process=True) as endpoint:
                create_bucket(endpoint, "bench")
                settings = Settings.from_dict(
                    {
                        "s3_endpoint": endpoint.url,
                        "s3_access_key_id": endpoint.access_key_id,
                        "s3_secret_access_key": endpoint.secret_access_key,
                        "s3_allow_http": True,
                        "disk_cache_dir": f"{tmp}/cache",
                    }
                )
                yield f"s3://bench/{uuid.uuid4().hex[:8]}", settings
        else:
            raise SystemExit(f"unknown implementation {name!r} ({', '.join(IMPLS)})")


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(name: str, items: int, commits: int) -> dict[str, float]:
    with place(name) as (url, settings):
        with open_catalog(url, store_settings=settings) as state:
            start = time.perf_counter()
            state.open()
            for first in range(0, items, 1000):
                tx = state.transaction(user="bench")
                for i in range(first, min(first + 1000, items)):
                    tx.create_database(f"db{i:06d}", f"file:///data/db{i:06d}")
                state.commit_transaction(tx)
            fill = time.perf_counter() - start
        opens = []
        for _ in range(3):
            with open_catalog(url, store_settings=settings) as state:
                start = time.perf_counter()
                state.open()
                opens.append(time.perf_counter() - start)
        with open_catalog(url, store_settings=settings) as reader:
            start = time.perf_counter()
            reader.open_read_only()
            read_only = time.perf_counter() - start
            assert len(reader.entries("databases")) == items
        latencies = []
        with open_catalog(url, store_settings=settings) as state:
            state.open()
            for i in range(commits):
                tx = state.transaction(user="bench")
                tx.create_database(f"new{i:06d}", "memory://")
                start = time.perf_counter()
                state.commit_transaction(tx)
                latencies.append(time.perf_counter() - start)
        return {
            "fill_s": fill,
            "open_best_s": min(opens),
            "open_median_s": statistics.median(opens),
            "open_read_only_s": read_only,
            "commit_p50_ms": _pct(latencies, 0.50) * 1000,
            "commit_p99_ms": _pct(latencies, 0.99) * 1000,
            "commit_max_ms": max(latencies) * 1000,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--impls", nargs="+", default=IMPLS)
    parser.add_argument("--out", type=Path, default=Path("bench/results/catalog.md"))
    args = parser.parse_args()
    lines = [
        f"Catalog of {args.items:,} databases (+ as many audit events); "
        f"{args.commits} single-item commits.",
        "",
        "| implementation | fill (s) | open best / median (s) | open read-only (s) "
        "| commit p50 (ms) | commit p99 (ms) | commit max (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in args.impls:
        r = run(name, args.items, args.commits)
        lines.append(
            f"| {name} | {r['fill_s']:.2f} | {r['open_best_s']:.3f} / {r['open_median_s']:.3f} "
            f"| {r['open_read_only_s']:.3f} | {r['commit_p50_ms']:.2f} "
            f"| {r['commit_p99_ms']:.2f} | {r['commit_max_ms']:.2f} |"
        )
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print()
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
