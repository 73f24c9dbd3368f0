"""An opener of a catalog that dies by SIGKILL at a chosen point of its open (the open
migrates: the write is the migration, the epoch bump and the audit event at once).

``python crash_child.py URL SHARD POINT``: POINT ``in-sql-transaction`` (SQLite/PostgreSQL: every
statement of the open's transaction ran, its COMMIT not), ``before-consensus`` (persist: the
open's batch is in blob storage, its consensus entry not written), ``after-write`` (persist:
the open's write landed; the critical since is not moved yet).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from slatepy.catalog import open_catalog
from slatepy.catalog.persist import PersistStorage
from slatepy.catalog.sql import SqlStorage
from slatepy.persist.location.objconsensus import ObjectConsensus


def die(*_: Any, **__: Any) -> Any:
    os.kill(os.getpid(), signal.SIGKILL)


def main(url: str, shard: str, point: str) -> None:
    if point == "in-sql-transaction":
        SqlStorage._compact = die  # type: ignore[method-assign]
    elif point == "after-write":
        PersistStorage._downgrade_since = die  # type: ignore[method-assign]
    else:
        assert point == "before-consensus"
        real_write, real_cas = PersistStorage.write, ObjectConsensus.compare_and_set
        armed = [False]

        def write(self: PersistStorage, *args: Any, **kwargs: Any) -> int:
            armed[0] = True
            return real_write(self, *args, **kwargs)

        def cas(self: ObjectConsensus, *args: Any) -> Any:
            if armed[0]:
                die()
            return real_cas(self, *args)

        PersistStorage.write = write  # type: ignore[method-assign]
        ObjectConsensus.compare_and_set = cas  # type: ignore[method-assign]
    with open_catalog(url, shard=shard) as state:
        state.open()
    print("not killed", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
