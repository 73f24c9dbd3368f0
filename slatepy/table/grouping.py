"""Joining a scan's blocks into longer columns: the unit every layer above a table scan
(merging, the tombstone filter, batching) pays its fixed overhead per."""

from __future__ import annotations

from collections.abc import Iterator, MutableSequence

from slatepy.format.block import Block, PlainValues

GROUP_ROWS = 2048
"""Rows a scan joins consecutive blocks into before handing them on (see :func:`grouped`)."""

Columns = tuple[list[bytes], MutableSequence[int], list[bytes | None]]
"""Key-sorted parallel lists ``(keys, seqs, values)`` of one block's entries or more (read
only: they may be the cached block's own lists); the seqs a list or an ``array('Q')``."""
Piece = tuple[list[bytes], MutableSequence[int], list[bytes | None], bool]
"""A block's columns, or a slice of them, and whether every value is plain (``Block.plain``)."""


def _piece(block: Block, lo: int, hi: int) -> Piece:
    """Entries ``lo:hi`` of ``block`` as a :data:`Piece`."""
    return block.keys[lo:hi], block.seqs[lo:hi], block.values[lo:hi], block.plain


def _grow(target: int) -> int:
    return min(max(2 * target, GROUP_ROWS // 32), GROUP_ROWS)


def grouped(pieces: Iterator[Piece]) -> Iterator[Columns]:
    """Consecutive pieces (a block's each) joined into fewer, longer columns: the first alone
    (a short or limited scan pays for one block), then groups of growing size up to
    ``GROUP_ROWS`` rows. Every layer above (merging, the tombstone filter, batching, the
    scan's generators) then costs its fixed overhead per group, not per block of a few dozen
    rows; joining costs a list copy per row, in C. A group's values are
    :class:`~slatepy.format.block.PlainValues` when every piece's were plain."""
    target = 0
    keys: list[bytes] = []
    seqs: MutableSequence[int] = []
    values: list[bytes | None] = []
    try:
        for piece_keys, piece_seqs, piece_values, plain in pieces:
            if not keys:
                if len(piece_keys) >= target:
                    # As it is (a cached block's own lists: read only), but marked plain.
                    yield (
                        piece_keys,
                        piece_seqs,
                        PlainValues(piece_values) if plain else piece_values,
                    )
                    target = _grow(target)
                    continue
                keys, seqs = list(piece_keys), piece_seqs[:]  # an array stays an array
                values = PlainValues(piece_values) if plain else list(piece_values)
            else:
                keys += piece_keys
                if seqs.__class__ is piece_seqs.__class__:
                    seqs += piece_seqs  # list+list or array+array: in C
                else:
                    seqs = list(seqs)
                    seqs += piece_seqs
                if not plain and values.__class__ is PlainValues:
                    values = list(values)
                values += piece_values
            if len(keys) >= target:
                yield keys, seqs, values
                keys, seqs, values = [], [], []
                target = _grow(target)
        if keys:
            yield keys, seqs, values
    finally:
        # Now, not when CPython frees it (a traceback or a caller may still hold it): a
        # scan's source shuts down and joins its read-ahead thread in its own ``finally``.
        close = getattr(pieces, "close", None)
        if close is not None:
            close()
