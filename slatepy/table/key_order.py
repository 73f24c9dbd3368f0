"""The newest version of each key of several sorted column lists, ordered by numpy when every
key has one length (issue 33: a scan over many overlapping L0 SSTs or runs).

Python's ``sorted(range(n), key=keys.__getitem__)`` compares ``bytes`` objects one call at a
time (about 0.15 µs a row on the shared machine), and gathering the columns by the order
another 0.1 µs a row per column. When every key of a window has the same length ``L``, the
keys joined are an ``n x L`` byte matrix: the bytes they all share (the common prefix of
the smallest and the largest key, which every key between them shares) are dropped, the
rest read as big-endian unsigned 64-bit words, and numpy sorts those (stable, so a key's
versions stay in source order). Comparing such words is exactly comparing the keys, since
they are equal-length byte strings compared byte by byte; padding the last word with zero
bytes pads every key alike. The columns are then gathered as object arrays (a pointer copy
a row, in C).

Variable-length keys return None (the caller sorts them in Python): a zero-padded word
would make ``b"a"`` equal ``b"a\\x00"``.

numpy is not imported with the module, so that ``import slatepy`` and the CLI do not pay for
it, nor by the first small merge: importing it costs 0.1-0.25 s of CPU on the shared machine,
more than sorting a 200,000-row scan's windows in Python. :func:`worth_numpy` says to use it
once it is imported anyway (the compactor's filters, Spark, the caller) or once this process
has sorted ``NUMPY_AFTER_ROWS`` rows in Python (about what the import costs: a rent-or-buy
rule, so a process never pays more than twice the better of the two).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import numpy as np

V = TypeVar("V")

VECTOR_MIN_ROWS = 256
"""Below this many rows a window is merged in Python: numpy's fixed cost per call (a few
µs, some twenty calls) would exceed what it saves."""

NUMPY_AFTER_ROWS = 500_000
"""Rows this process merges in Python before it imports numpy for merging (see the module
docstring)."""
_rows_in_python = 0


def worth_numpy(rows: int) -> bool:
    """Whether to merge ``rows`` rows with numpy (else they are counted as merged in Python)."""
    global _rows_in_python
    if rows < VECTOR_MIN_ROWS:
        return False
    if "numpy" in sys.modules or _rows_in_python >= NUMPY_AFTER_ROWS:
        return True
    _rows_in_python += rows  # a lost update under a race only delays the switch
    return False


def newest_fixed_width(
    parts: Sequence[tuple[Sequence[bytes], Sequence[int], Sequence[V]]], keys: list[bytes]
) -> tuple[list[bytes], list[int], list[V]] | None:
    """:func:`slatepy.table.merge.newest_columns` of ``parts`` (each ascending or each
    descending, unique keys within a part), ``keys`` their keys concatenated; None when the
    keys differ in length or some key's versions have seqs rising in source order (the
    caller then takes its general path)."""
    import numpy as np

    n = len(keys)
    width = len(keys[0])
    joined = b"".join(keys)
    # Every length equals ``width`` iff they sum to n * width and none is shorter.
    if not width or len(joined) != n * width or min(map(len, keys)) != width:
        return None
    words = _words(joined, n, width, parts)
    if words.ndim == 1:
        order = np.argsort(words, kind="stable")
        ranked = words[order]
        repeats = ranked[1:] == ranked[:-1]
    else:
        order = np.lexsort(words.T[::-1])  # stable; the last key given is the primary one
        ranked = words[order]
        repeats = (ranked[1:] == ranked[:-1]).all(axis=1)
    seqs = _seqs(np, parts, n)
    if repeats.any():
        ranked_seqs = seqs[order]
        # Within a key, its versions are in source order: the first must be the newest.
        if (repeats & (ranked_seqs[1:] > ranked_seqs[:-1])).any():
            return None
        order = order[np.concatenate(([True], ~repeats))]
    key_objects = np.fromiter(keys, object, n)
    values = np.fromiter(chain.from_iterable(p[2] for p in parts), object, n)
    return key_objects[order].tolist(), seqs[order].tolist(), values[order].tolist()


def _seqs(
    np: Any, parts: Sequence[tuple[Sequence[bytes], Sequence[int], Sequence[Any]]], n: int
) -> Any:
    """The parts' seqs concatenated as a uint64 array: from the bytes when every part's are an
    ``array('Q')`` (a decoded block's: no int made per row), else from the ints."""
    columns = [p[1] for p in parts]
    arrays = [c for c in columns if isinstance(c, array) and c.typecode == "Q"]
    if len(arrays) == len(columns):
        joined = array("Q")
        for column in arrays:
            joined += column
        return np.frombuffer(joined, np.uint64)
    return np.fromiter(chain.from_iterable(columns), np.uint64, n)


def _words(
    joined: bytes,
    n: int,
    width: int,
    parts: Sequence[tuple[Sequence[bytes], Sequence[int], Sequence[Any]]],
) -> np.ndarray[Any, Any]:
    """The keys (``n`` of ``width`` bytes in ``joined``) past their common prefix, as rows of
    native uint64 words (a 1-D array when one word holds them)."""
    import numpy as np

    ends = [key for p in parts if p[0] for key in (p[0][0], p[0][-1])]
    low, high = min(ends), max(ends)
    prefix = 0
    while prefix < width and low[prefix] == high[prefix]:
        prefix += 1
    rest = width - prefix
    count = max(1, -(-rest // 8))
    matrix = np.frombuffer(joined, np.uint8).reshape(n, width)
    padded = np.zeros((n, 8 * count), np.uint8)
    padded[:, :rest] = matrix[:, prefix:]
    words = padded.view(">u8").astype(np.uint64)
    return words.ravel() if count == 1 else words
