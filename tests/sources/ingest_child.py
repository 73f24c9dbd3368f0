"""A child ingest for the crash tests: ``python -m tests.sources.ingest_child STORE PG_URL
POINT N TARGET_LSN``. Ingests the publication ``pub`` into shard ``orders`` on the persist
store at STORE, kills itself with SIGKILL right after the N-th POINT (``remap-appended``,
``data-appended``, ``committed``; ``none`` for never), and otherwise exits 0 once the
committed offset reached TARGET_LSN (0: run until killed)."""

from __future__ import annotations

import os
import signal
import sys

from slatepy.persist import PersistClient
from slatepy.sources import Ingest
from slatepy.sources.postgres import PostgresSource


def main() -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)d %(name)s %(message)s")
    store, url, point, count, target = sys.argv[1:6]
    seen = 0

    def hook(at: str) -> None:
        nonlocal seen
        if at == point:
            seen += 1
            if seen == int(count):
                os.kill(os.getpid(), signal.SIGKILL)

    source = PostgresSource(url, "pub", slot="slot_orders")
    with PersistClient.open(store) as client:
        ingest = Ingest(
            client,
            source,
            data_shards=["orders"],
            remap_shard="orders.remap",
            hook=hook,
            tick=0.02,
            commit_interval=0.2,
        )
        ingest.start()
        while int(target) == 0 or ingest.committed[0] < int(target):
            ingest.step(0.05)
        ingest.close()


if __name__ == "__main__":
    main()
