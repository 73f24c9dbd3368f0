"""A catalog leader in its own process (tests/catalog/test_fencing.py).

``python fencing_child.py URL SHARD MODE``: MODE ``open`` opens (bumping the epoch), commits a
database named ``child`` and exits; MODE ``lead`` opens, prints its epoch, waits for a line
on stdin, then tries to commit a database named ``stale`` and prints ``fenced`` or
``committed``.
"""

from __future__ import annotations

import sys

from slatepy.catalog import open_catalog
from slatepy.errors import FencedError


def main(url: str, shard: str, mode: str) -> None:
    with open_catalog(url, shard=shard) as state:
        state.open()
        tx = state.transaction(user="child")
        if mode == "open":
            tx.create_database("child", "memory://")
            state.commit_transaction(tx)
            print(state.epoch, flush=True)
            return
        print(state.epoch, flush=True)
        sys.stdin.readline()
        tx.create_database("stale", "memory://")
        try:
            state.commit_transaction(tx)
        except FencedError as exc:
            print(f"fenced: {exc}", flush=True)
        else:
            print("committed", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
