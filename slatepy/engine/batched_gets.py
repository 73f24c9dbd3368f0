"""Batched gets: the one implementation of ``get_many`` that ``Db``, ``DbReader`` and
snapshots share, once each has taken its memtable's versions of the keys and the view under
its own checks and lock."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from slatepy.engine.memtable import Version
from slatepy.engine.view import get_many_compacted, newer_version, view_ranges, visible
from slatepy.manifest.record import Manifest
from slatepy.table.merge_operator import NO_MERGING, Merging
from slatepy.table.reader import TableReader
from slatepy.table.visibility import EMPTY, Clock, RangeIndex

T = TypeVar("T")

Read = Callable[[Callable[[Manifest], T], Manifest], T]
"""How a handle reads a view: ``read(fn, view)`` is ``fn(view)``, with the handle's answer to
an SST that is gone (``Db._read``, ``DbReader._read``: refresh and retry, or damage)."""


def get_many(
    keys: Sequence[bytes],
    newer: Sequence[Version | None],
    view: Manifest,
    ranges: RangeIndex,
    *,
    read: Read[dict[bytes, Version]],
    tables: TableReader,
    clock: Clock,
    merging: Merging,
) -> list[bytes | None]:
    """The values of ``keys`` (in the order given; None where absent or deleted), given
    their memtable versions ``newer``, the memtable's range tombstones ``ranges`` and the
    ``view``, all taken together: the keys the memtable does not answer (none, or a version
    older than an ingestion, which may hold a newer one) are read from ``view`` in one
    :func:`~slatepy.engine.view.get_many_compacted` through ``read``."""
    ingested = view.last_ingest_seq
    rest = sorted({k for k, v in zip(keys, newer, strict=True) if v is None or v[0] < ingested})
    found = read(lambda v: get_many_compacted(tables, v, rest), view)
    return values_of(
        keys,
        newer,
        found,
        ranges=ranges,
        view=view,
        clock=clock,
        merging=merging,
        tables=tables,
    )


def values_of(
    keys: Sequence[bytes],
    newer: Sequence[Version | None],
    found: dict[bytes, Version],
    *,
    ranges: RangeIndex = EMPTY,
    view: Manifest | None = None,
    clock: Clock = time.time,
    merging: Merging = NO_MERGING,
    tables: TableReader | None = None,
) -> list[bytes | None]:
    """The value of each key: the newer of its memtable version (``newer``) and what
    :func:`get_many_compacted` found, as :func:`visible` reads it (``ranges``: the
    memtable's range tombstones, ``view``: the view ``found`` came from); None for absent or
    deleted keys. ``merging`` and ``tables`` serve keys holding merge operands."""
    plain = ranges is EMPTY and (view is None or view_ranges(view) is EMPTY)
    values: list[bytes | None] = []
    for key, memtable in zip(keys, newer, strict=True):
        version = newer_version(memtable, found.get(key))
        value = None if version is None else version[1]
        if value is None or (plain and value.__class__ is bytes):
            values.append(value)  # absent, deleted, or a plain value nothing can cover
        else:
            values.append(
                visible(key, version, ranges, view, clock, merging=merging, tables=tables)
            )
    return values
