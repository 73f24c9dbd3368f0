"""Reading the compacted part of a database (L0 and sorted runs) as one manifest names it.

Shared by the writer (``Db``) and readers (``DbReader``): both put their memtable in front
of what is here. Every read passes the SST's size from the manifest, so opening an SST is a
plain range GET (no suffix request: Azure has none), and tells the table reader which view it
reads, so the top-level indexes it keeps in memory follow the live SSTs (RFC 0009).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator

from slatepy.engine.memtable import Version
from slatepy.engine.merge import merge_newest
from slatepy.engine.table import TableReader, compacted_path
from slatepy.format.block import Entry
from slatepy.manifest.record import Manifest, SortedRun, SstHandle


def get_compacted(tables: TableReader, view: Manifest, key: bytes) -> Version | None:
    """The newest ``(seq, value)`` of ``key`` in the compacted SSTs of ``view``."""
    if tables.followed is not view:
        _follow(tables, view)
    for handle in view.l0:
        if handle.first_key <= key <= handle.last_key:
            found = tables.get(compacted_path(handle.id), key, size=handle.object_size)
            if found is not None:
                return found
    for run in view.sorted_runs:
        in_run = _run_sst_for(run, key)
        if in_run is not None:
            found = tables.get(compacted_path(in_run.id), key, size=in_run.object_size)
            if found is not None:
                return found
    return None


def scan_compacted(
    tables: TableReader, view: Manifest, start: bytes, end: bytes | None
) -> list[Iterator[Entry]]:
    """Entry streams (newest source first) of ``start <= key < end`` in ``view``."""
    if tables.followed is not view:
        _follow(tables, view)
    sources = [tables.scan(compacted_path(h.id), start, end, size=h.object_size) for h in view.l0]
    sources += [_scan_run(tables, run, start, end) for run in view.sorted_runs]
    return sources


def scan_merged(
    tables: TableReader, newer: list[Entry], view: Manifest, start: bytes, end: bytes | None
) -> Iterator[tuple[bytes, bytes]]:
    """Live ``(key, value)`` pairs of ``newer`` (memtable entries) over ``view``'s SSTs, the
    newest version of each key winning; tombstones hide what they shadow."""
    sources = [iter(newer), *scan_compacted(tables, view, start, end)]
    return ((k, v) for k, _, v in merge_newest(sources) if v is not None)


def compacted_ids(view: Manifest) -> set[str]:
    """Ids of every compacted SST ``view`` references."""
    return {h.id for h in (*view.l0, *(h for run in view.sorted_runs for h in run.ssts))}


def _scan_run(
    tables: TableReader, run: SortedRun, start: bytes, end: bytes | None
) -> Iterator[Entry]:
    for handle in run.ssts:
        if handle.last_key >= start and (end is None or handle.first_key < end):
            yield from tables.scan(compacted_path(handle.id), start, end, size=handle.object_size)


def _follow(tables: TableReader, view: Manifest) -> None:
    """Tell ``tables`` the SSTs of the view now read, so it can release the rest."""
    tables.retain(view, [compacted_path(i) for i in compacted_ids(view)])


def _first_key(handle: SstHandle) -> bytes:
    return handle.first_key


def _run_sst_for(run: SortedRun, key: bytes) -> SstHandle | None:
    """The only SST of a sorted run whose key range can hold ``key``."""
    # bisect with key= builds no list: a get costs O(log n) whatever the run's length.
    i = bisect_right(run.ssts, key, key=_first_key) - 1
    if i >= 0 and key <= run.ssts[i].last_key:
        return run.ssts[i]
    return None
