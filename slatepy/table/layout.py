"""Where a database keeps its SSTs in the store (DESIGN §3, "Paths").

WAL SSTs are numbered objects ``wal/{id:020}.sst`` (see ``store.numbered``); compacted SSTs
(L0 and sorted runs) are ``compacted/{id}.sst``, ``id`` a fresh uuid4 in hex. The writer,
readers, the compactor, GC and the CLI all find objects through these names, so they live
below all of them.
"""

from __future__ import annotations

WAL_DIR = "wal"
WAL_SUFFIX = ".sst"
COMPACTED_DIR = "compacted"


def compacted_path(sst_id: str) -> str:
    """Where the compacted SST ``sst_id`` lives."""
    return f"{COMPACTED_DIR}/{sst_id}.sst"


def compacted_id(path: str) -> str | None:
    """The SST id of ``compacted/{id}.sst``; None for any other path."""
    prefix, suffix = COMPACTED_DIR + "/", ".sst"
    if path.startswith(prefix) and path.endswith(suffix) and "/" not in path[len(prefix) :]:
        return path[len(prefix) : -len(suffix)]
    return None
