"""The columnar path of compaction: the inputs' blocks as columns, merged a window of key
range at a time (every version of a key in one window), plain windows in C.

A window of plain values only (no tombstone, no entry kind), the common case, is merged in
C (concatenated when one input has it all, else sorted and deduped by
:func:`slatepy.table.merge.newest_columns`) and written in bulk; any other window goes
back to the entry path as a list of entries (``slatepy.compactor.executor``).
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import NamedTuple, cast

from slatepy.format.block import Entry
from slatepy.table.merge import merge_folding, newest_columns
from slatepy.table.reader import Piece, TableReader

PLAIN_BATCH_ROWS = 512
"""Rows the columnar path writes between GIL yields and checks for output to send."""
SOURCE_GROUP_ROWS = 2048
"""Rows of an input the columnar path takes at a time (whole blocks: the block reaching it
ends the group), or fewer when their keys and values reach the input's read chunk."""
MAX_WINDOW_ROWS = 8192
"""Rows of several inputs the columnar path merges in one step (about 2 ms of sorting)."""


class Plain(NamedTuple):
    """Merged entries (newest version per key, key order) whose values are all plain:
    written as they are."""

    keys: list[bytes]
    seqs: list[int]
    values: list[bytes]


class Source:
    """One input (a WAL SST, an L0 SST or a sorted run) as columns, a group of blocks at a
    time (:func:`groups`): ``keys[pos:]`` are not merged yet; ``keys`` None once the input
    is exhausted."""

    __slots__ = ("_groups", "_stamp", "keys", "plain", "pos", "seqs", "values")

    def __init__(self, groups: Iterator[Piece], stamp: int) -> None:
        self._groups = groups
        self._stamp = stamp
        self.keys: list[bytes] | None = None
        self.seqs: list[int] = []
        self.values: list[bytes | None] = []
        self.plain = False
        self.pos = 0
        self.advance()

    def advance(self) -> None:
        """Move on to the next group."""
        for keys, seqs, values, plain in self._groups:
            if keys:
                self.keys, self.values, self.pos, self.plain = keys, values, 0, plain
                # Ingested L0 SSTs store seq 0: their entries take the handle's global seq
                # (RFC 0016), as ``stamped`` gives them on the entry path.
                self.seqs = [self._stamp] * len(keys) if self._stamp else list(seqs)
                return
        self.keys = None


def groups(pieces: Iterator[Piece], budget: int) -> Iterator[Piece]:
    """A source's blocks joined into groups of ``SOURCE_GROUP_ROWS`` rows or ``budget``
    bytes of keys and values, whichever comes first (or what is left), each with whether
    all its values are plain: windows then hold whole groups of the inputs that overlap
    them, not a block or two of each (a window costs a step per input in it), and memory
    about one read chunk per input, as on the entry path (large values, few rows)."""
    keys: list[bytes] = []
    seqs: list[int] = []
    values: list[bytes | None] = []
    plain = True
    size = 0
    for piece_keys, piece_seqs, piece_values, piece_plain in pieces:
        keys += piece_keys
        seqs += piece_seqs
        values += piece_values
        size += sum(map(len, piece_keys))
        if piece_plain:
            size += sum(map(len, cast("list[bytes]", piece_values)))
        else:
            size += sum(len(v) for v in piece_values if v is not None)
        plain = plain and piece_plain
        if len(keys) >= SOURCE_GROUP_ROWS or size >= budget:
            yield keys, seqs, values, plain
            keys, seqs, values, plain, size = [], [], [], True, 0
    if keys:
        yield keys, seqs, values, plain


def chain_columns(
    tables: TableReader, paths: list[tuple[str, int | None]], chunk: int
) -> Iterator[Piece]:
    """``slatepy.compactor.executor``'s ``_chain``, a block at a time."""
    for path, size in paths:
        yield from tables.scan_all_columns(path, chunk_bytes=chunk, size=size)


WindowPart = tuple[list[bytes], list[int], list[bytes | None], bool]
Window = list[WindowPart]
"""The columns of the sources that have entries in a window, in source order, and whether
each one's values are all plain."""


def windows(sources: list[Source]) -> Iterator[Window]:
    """The sources' entries in consecutive key ranges, so every version of a key is in one
    window and memory holds one group per source.

    A window ends at the smallest last key of the sources' current groups (a source whose
    next key lies beyond that cannot hold it); the sources it draws on are found through a
    heap by next key, so a window costs the sources it holds, not all of them (a WalToL0
    may have hundreds of WAL SSTs of disjoint key ranges: one a window, concatenated).
    """
    heap = [(s.keys[0], rank, s) for rank, s in enumerate(sources) if s.keys is not None]
    heapq.heapify(heap)
    while heap:
        _, rank, source = heapq.heappop(heap)
        taken = [(rank, source)]
        assert source.keys is not None
        bound = source.keys[-1]
        while heap and heap[0][0] <= bound:
            _, rank, source = heapq.heappop(heap)
            taken.append((rank, source))
            assert source.keys is not None
            bound = min(bound, source.keys[-1])
        taken.sort(key=itemgetter(0))  # source order: ties on seq go to the earlier one
        window: Window = []
        for rank, source in taken:
            keys = source.keys
            assert keys is not None
            pos = source.pos
            count = len(keys)
            cut = count if keys[-1] <= bound else bisect_right(keys, bound, pos)
            if cut > pos:
                window.append(_sliced((keys, source.seqs, source.values, source.plain), pos, cut))
                source.pos = cut
            if cut == count:
                source.advance()
            if source.keys is not None:
                heapq.heappush(heap, (source.keys[source.pos], rank, source))
        if len(window) > 1 and sum(len(w[0]) for w in window) > MAX_WINDOW_ROWS:
            yield from _split(window)
        else:
            yield window


def _sliced(columns: WindowPart, lo: int, hi: int) -> WindowPart:
    """Rows ``lo:hi`` of ``columns`` (the lists themselves when that is all of them) and
    whether their values are all plain."""
    keys, seqs, values, plain = columns
    if lo == 0 and hi == len(keys):
        return columns
    part = values[lo:hi]
    return keys[lo:hi], seqs[lo:hi], part, plain or _all_plain(part)


def _split(window: Window) -> Iterator[Window]:
    """A window of many rows cut into windows of about ``MAX_WINDOW_ROWS`` at keys of its
    largest source (a key's versions stay together: each cut is after a key), so one merge
    holds the GIL for a few ms at most."""
    total = sum(len(w[0]) for w in window)
    largest = max(window, key=lambda w: len(w[0]))[0]
    parts = -(-total // MAX_WINDOW_ROWS)
    bounds = [largest[len(largest) * i // parts - 1] for i in range(1, parts)]
    starts = [0] * len(window)
    for bound in [*bounds, None]:
        sub: Window = []
        for n, columns in enumerate(window):
            keys, lo = columns[0], starts[n]
            hi = len(keys) if bound is None else bisect_right(keys, bound, lo)
            if hi > lo:
                sub.append(_sliced(columns, lo, hi))
                starts[n] = hi
        if sub:
            yield sub


def _all_plain(values: list[bytes | None]) -> bool:
    """Whether every value is exactly ``bytes`` (what ``compacted_entries`` writes as it
    is): a group holding a tombstone or an entry kind may have none in this window."""
    return set(map(type, values)) == _BYTES_ONLY


_BYTES_ONLY = {bytes}


def batches(
    sources: list[Source], fold: Callable[[list[Entry]], Entry | None]
) -> Iterator[Plain | list[Entry]]:
    """The merge of ``sources`` (``merge_folding``'s: newest version per key, ties on seq to
    the earlier source, merge operands folded by ``fold``), a window at a time: plain
    windows as :class:`Plain` batches of at most ``PLAIN_BATCH_ROWS`` rows, others as
    lists of entries for ``compacted_entries``."""
    for window in windows(sources):
        if not all(plain for _, _, _, plain in window):
            yield list(merge_folding((zip(k, s, v, strict=True) for k, s, v, _ in window), fold))
            continue
        if len(window) == 1:
            keys, seqs, values, _ = window[0]
        else:
            keys, seqs, values = _merge_plain(window)
        for begin in range(0, len(keys), PLAIN_BATCH_ROWS):
            end = begin + PLAIN_BATCH_ROWS
            yield Plain(keys[begin:end], seqs[begin:end], values[begin:end])  # type: ignore[arg-type]


def _merge_plain(window: Window) -> tuple[list[bytes], list[int], list[bytes | None]]:
    """The newest version of each key of a window, in C (:func:`newest_columns`)."""
    return newest_columns([(k, s, v) for k, s, v, _ in window])
