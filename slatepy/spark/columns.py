"""A bulk load's rows as Arrow binary columns, sorted and merged vectorised (RFC 0025,
Addendum B).

A load task's rows are ``(key, value)`` bytes (``slatepy.spark.codec``). Held as two Arrow
``large_binary`` arrays instead of a Python tuple per row, they cost their bytes plus two
offsets, and every step over them runs in C: the encoding of the common key and value
columns (:func:`binary_columns`), the sort (:func:`sort_order`: none when the rows came in
order, else numpy's stable sort of fixed-width keys, else Arrow's), keeping the last of
equal keys (:func:`last_of_equal`) and the merge of sorted runs (:func:`merge_sorted`).

Order is bytewise, unsigned, shorter first on a common prefix: the order of the store's
keys (Python's ``bytes`` order), which Arrow's binary comparisons and numpy's fixed-width
``S`` comparisons share for keys of one length.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slatepy.spark.codec import INT_TYPES, RowCodec

Pairs = tuple[pa.Array, pa.Array]
"""Keys and values, ``large_binary`` arrays of one length."""

BINARY = pa.large_binary()
_SIGN = np.uint64(1 << 63)


def binary_columns(codec: RowCodec, batch: pa.RecordBatch) -> Pairs:
    """The encoded keys and values of ``batch``'s rows (``RowCodec.from_batch``'s bytes),
    as arrays: a single string, binary or integer key column and a binary value column are
    encoded in C; other layouts, and a batch with nulls where ``from_batch`` refuses them
    (its errors name the option), take ``from_batch``'s lists."""
    keys = _key_column(codec, batch)
    values = _value_column(codec, batch)
    if keys is None or values is None:
        listed_keys, listed_values = codec.from_batch(batch)
        if keys is None:
            keys = pa.array(listed_keys, BINARY)
        if values is None:
            values = pa.array(listed_values, BINARY)
    return keys, values


def _key_column(codec: RowCodec, batch: pa.RecordBatch) -> pa.Array | None:
    if len(codec.key) != 1:
        return None
    column = batch.column(codec.key[0])
    if column.null_count:
        return None
    kind = codec.columns[codec.key[0]].type_name
    if kind in ("string", "binary"):
        return column.cast(BINARY)
    if kind in INT_TYPES:
        # (v + 2**63) big-endian: the sign bit flipped (RowCodec's integer keys).
        flipped = column.to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64)
        data = (flipped ^ _SIGN).astype(">u8").tobytes()
        rows = len(column)
        offsets = np.arange(0, 8 * rows + 1, 8, dtype=np.int64)
        return pa.Array.from_buffers(
            BINARY, rows, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)]
        )
    return None


def _value_column(codec: RowCodec, batch: pa.RecordBatch) -> pa.Array | None:
    if codec.value is None:
        return None
    column = batch.column(codec.value)
    return None if column.null_count else column.cast(BINARY)


def concat_pairs(keys: Sequence[pa.Array], values: Sequence[pa.Array]) -> Pairs:
    """Arrays of keys and of values concatenated (empty ones when there are none)."""
    if not keys:
        return pa.array([], BINARY), pa.array([], BINARY)
    return (
        pa.concat_arrays([a.cast(BINARY) for a in keys]),
        pa.concat_arrays([a.cast(BINARY) for a in values]),
    )


def in_order(keys: Sequence[pa.Array]) -> bool:
    """Whether the chunks ``keys`` hold strictly increasing keys, chunk after chunk."""
    previous: bytes | None = None
    for chunk in keys:
        if not len(chunk):
            continue
        if previous is not None and not previous < chunk[0].as_py():
            return False
        if len(chunk) > 1 and not pc.all(pc.less(chunk[:-1], chunk[1:])).as_py():
            return False
        previous = chunk[-1].as_py()
    return True


def sort_order(keys: pa.Array) -> np.ndarray | None:
    """The indexes that sort ``keys``, equal keys in their order (a stable sort); None when
    they are in order already (checked first, in one pass: loads often come sorted)."""
    count = len(keys)
    if count < 2 or pc.all(pc.less_equal(keys[:-1], keys[1:])).as_py():
        return None
    lengths = pc.binary_length(keys)
    shortest, longest = pc.min_max(lengths).values()
    width = shortest.as_py()
    if width and width == longest.as_py():
        # One width: numpy compares fixed-width bytes unsigned, as bytes compare.
        dense = pa.concat_arrays([keys])  # (offset 0, its own buffers)
        fixed = np.frombuffer(dense.buffers()[2], dtype=f"S{width}", count=count)
        return np.argsort(fixed, kind="stable")
    return np.asarray(pc.sort_indices(keys))  # Arrow's sort is stable


def last_of_equal(keys: pa.Array, values: pa.Array) -> Pairs:
    """Sorted ``keys`` (and their values) with only the last of equal keys."""
    if len(keys) < 2:
        return keys, values
    differs = pc.not_equal(keys[:-1], keys[1:])  # [i]: key i is not key i + 1's
    if pc.all(differs).as_py():
        return keys, values
    keep = pa.concat_arrays([differs, pa.array([True])])
    return keys.filter(keep), values.filter(keep)


def sort_unique(pairs: Pairs) -> Pairs:
    """``pairs`` sorted by key, of equal keys the last only."""
    keys, values = pairs
    order = sort_order(keys)
    if order is not None:
        taken = pa.array(order)
        keys, values = keys.take(taken), values.take(taken)
    return last_of_equal(keys, values)


def sorted_chunks(pairs: Pairs, rows: int) -> Iterator[Pairs]:
    """:func:`sort_unique` of ``pairs`` in chunks of at most ``rows`` rows, taken one at a
    time: memory holds ``pairs``, a sorted copy of the keys and the order, not a sorted
    copy of the values too."""
    keys, values = pairs
    order = sort_order(keys)
    if order is None:
        keys, values = last_of_equal(keys, values)
        for start in range(0, len(keys), rows):
            yield keys[start : start + rows], values[start : start + rows]
        return
    taken = pa.array(order)
    del order
    sorted_keys = keys.take(taken)
    if len(sorted_keys) > 1:
        differs = pc.not_equal(sorted_keys[:-1], sorted_keys[1:])
        if not pc.all(differs).as_py():
            taken = taken.filter(pa.concat_arrays([differs, pa.array([True])]))
    del sorted_keys
    for start in range(0, len(taken), rows):
        part = taken[start : start + rows]
        yield keys.take(part), values.take(part)


def merge_sorted(runs: Sequence[Iterator[Pairs]]) -> Iterator[Pairs]:
    """The merge of sorted runs (each: chunks in key order, keys unique within the run), of
    equal keys the one of the latest run, in chunks. Memory: a chunk per run.

    A step takes, from every run, its rows up to the smallest last key among the runs'
    current chunks (so every version of a key is in that step, and the run that chunk
    belongs to moves on to its next), then sorts them by key (stably: run order) and keeps
    the last of equal keys.
    """
    current: list[Pairs | None] = [_next_chunk(run) for run in runs]
    while True:
        live = [c for c in current if c is not None]
        if not live:
            return
        bound = min(keys[-1].as_py() for keys, _ in live)
        taken_keys: list[pa.Array] = []
        taken_values: list[pa.Array] = []
        for i, chunk in enumerate(current):
            if chunk is None:
                continue
            keys, values = chunk
            if keys[-1].as_py() <= bound:
                taken_keys.append(keys)
                taken_values.append(values)
                current[i] = _next_chunk(runs[i])
                continue
            cut = pc.sum(pc.less_equal(keys, pa.scalar(bound, BINARY))).as_py() or 0
            if cut:
                taken_keys.append(keys[:cut])
                taken_values.append(values[:cut])
                current[i] = keys[cut:], values[cut:]
        yield sort_unique(concat_pairs(taken_keys, taken_values))


def _next_chunk(run: Iterator[Pairs]) -> Pairs | None:
    for keys, values in run:
        if len(keys):
            return keys, values
    return None
