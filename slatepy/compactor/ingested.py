"""Merge operands that a WAL compaction folds across an ingestion (RFC 0016, issue 29).

A WAL range can hold a put of a key (seq ``s``) and, after an ingestion published a newer
value of it (odd global seq ``G``, ``s < G``), merge operands (seq ``> G``). The ingested SST
is not an input of the WAL compaction, so folding the operands over the put would write, in
front of the ingestion, the result over the value the ingestion replaced: the operands must
fold over the ingested value instead. Likewise operands older than the ingestion (a run of
operands alone) must not be carried over it. :func:`over_ingestions` puts the compacted version in
the run when it is newer than the base the fold would use, a point read that only keys in
that situation (a base older than the view's newest ingestion) cost.
"""

from __future__ import annotations

from collections.abc import Callable

from slatepy.format.block import Entry
from slatepy.format.kinds import Operands
from slatepy.manifest.record import Manifest
from slatepy.table.layout import compacted_path
from slatepy.table.reader import TableReader

Fold = Callable[[list[Entry]], Entry | None]


def newest_compacted(tables: TableReader, manifest: Manifest, key: bytes) -> Entry | None:
    """The newest version of ``key`` in ``manifest``'s SSTs (every L0 SST and the run SST
    whose range holds it; an ingested SST's entries take its global seq)."""
    handles = [h for h in manifest.l0 if h.first_key <= key <= h.last_key]
    handles += [
        h for run in manifest.sorted_runs for h in run.ssts if h.first_key <= key <= h.last_key
    ]
    best: Entry | None = None
    for handle in handles:
        found = tables.get(compacted_path(handle.id), key, size=handle.object_size)
        if found is not None:
            seq = handle.global_seq or found[0]
            if best is None or seq > best[1]:
                best = (key, seq, found[1])
    return best


def over_ingestions(fold: Fold, manifest: Manifest, tables: TableReader) -> Fold:
    """``fold`` for a WAL compaction against ``manifest``: a run whose operands would fold
    over a base (or carry operands) older than an ingestion folds over the ingested version
    when that is newer, and drops what is older than it."""
    floor = manifest.last_ingest_seq
    if not floor:
        return fold

    def folded(run: list[Entry]) -> Entry | None:
        # The oldest entry the fold reads: the first base, or the oldest operands if none.
        oldest = next((e for e in run if e[2].__class__ is not Operands), run[-1])
        if oldest[1] >= floor:
            return fold(run)  # every entry it reads is newer than every ingestion
        found = newest_compacted(tables, manifest, run[0][0])
        if found is None or not oldest[1] < found[1] < run[0][1] or found[2].__class__ is Operands:
            return fold(run)
        return fold([e for e in run if e[1] > found[1]] + [found])

    return folded
