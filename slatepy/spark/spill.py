"""A bulk-load task's rows in bounded memory: sorted runs spilled to local files (RFC 0025).

A task buffers its rows as Arrow binary columns (keys, values) until their estimated size
passes its budget (``bufferBytes``), then sorts the buffer and writes it to a temporary
file as one run (an Arrow IPC file of chunks). At the end the runs (and what is still
buffered) are merged in key order, equal keys kept in arrival order, so the last row of
equal keys wins as in a load that fits in memory; memory is then one chunk per run. The
files live in the worker's temporary directory and are deleted when the task ends,
whatever happens.

Everything per row is vectorised (``slatepy.spark.columns``: Arrow and numpy sorts, masks
and takes); no Python object is made per row until the SSTs are built, a chunk at a time
(RFC 0025, Addendum B: a task spent most of its time on tuples, a Python sort and one
``SstBuilder.add`` per row).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from slatepy.spark.columns import BINARY, Pairs, concat_pairs, in_order, merge_sorted, sorted_chunks

PAIR_OVERHEAD = 120
"""Bytes a buffered pair counts beyond its key and value. The Arrow columns take about 16
(two offsets), but the sort's copy of the buffer doubles it while it lasts, and the chunk
of Python objects the SSTs are built from costs more again: an over-estimate keeps the
budget a bound on the task's memory."""

CHUNK_BYTES = 256 * 1024
"""Estimated bytes (as :data:`PAIR_OVERHEAD`) per chunk of a spilled run, at most: what each
run holds in memory while runs are merged (a 64th of the budget if that is less)."""

FAN_IN = 16
"""Runs merged at once: when this many are spilled they are merged into one, so a merge
holds at most ``FAN_IN + 1`` chunks whatever the partition's size."""

OUT_ROWS = 65536
"""Rows of the chunks :meth:`SortedSpill.sorted_pairs` yields at most (each becomes two lists
of Python bytes objects for the SST builder)."""


class SortedSpill:
    """Buffers pairs within ``budget`` bytes, spilling sorted runs; :meth:`sorted_pairs`
    yields them all in key order with only the last of equal keys. A context manager: its
    exit deletes the spilled files."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.runs = 0
        self._keys: list[pa.Array] = []
        self._values: list[pa.Array] = []
        self._bytes = 0
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._files: list[str] = []

    def add(self, keys: pa.Array, values: pa.Array) -> None:
        """Buffer rows: ``keys`` and ``values`` binary (or large binary) arrays, no nulls."""
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys for {len(values)} values")
        if not len(keys):
            return
        keys, values = keys.cast(BINARY), values.cast(BINARY)
        self._keys.append(keys)
        self._values.append(values)
        self._bytes += _data_bytes(keys) + _data_bytes(values) + PAIR_OVERHEAD * len(keys)
        if self._bytes >= self.budget:
            self._spill()

    def _buffered(self) -> Iterator[Pairs]:
        """The buffer sorted by key, the last of equal keys only, in chunks (of at most
        :data:`OUT_ROWS`); the buffer emptied. Rows that came in strictly increasing key
        order are kept as they came (no copy); others are concatenated and sorted, and
        the chunks taken one at a time (``sorted_chunks``)."""
        keys, values = self._keys, self._values
        self._keys, self._values, self._bytes = [], [], 0
        if in_order(keys):
            return iter(list(zip(keys, values, strict=True)))
        pairs = concat_pairs(keys, values)
        keys.clear()
        values.clear()
        return sorted_chunks(pairs, OUT_ROWS)

    def _chunks(self, chunks: Iterable[Pairs]) -> Iterator[Pairs]:
        """``chunks`` cut to at most ``CHUNK_BYTES`` (estimated, a 64th of the budget if
        that is less): what a spilled run holds in memory per chunk while runs merge."""
        limit = min(CHUNK_BYTES, max(1, self.budget // 64))
        for keys, values in chunks:
            rows = len(keys)
            if not rows:
                continue
            per_row = (_data_bytes(keys) + _data_bytes(values)) / rows + PAIR_OVERHEAD
            step = max(1, int(limit / per_row))
            for start in range(0, rows, step):
                yield keys[start : start + step], values[start : start + step]

    def _spill(self) -> None:
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="slatepy-load-")
        path = os.path.join(self._dir.name, f"run-{len(self._files):05}")
        _write_run(path, self._chunks(self._buffered()))
        self._files.append(path)
        self.runs += 1
        if len(self._files) >= FAN_IN:  # one run of them all, in their order
            merged = os.path.join(self._dir.name, f"merged-{self.runs:05}")
            _write_run(merged, merge_sorted([_read_run(f) for f in self._files]))
            for old in self._files:
                os.remove(old)
            self._files = [merged]

    def sorted_pairs(self) -> Iterator[tuple[list[bytes], list[bytes]]]:
        """Every pair added, in key order, the last of equal keys only: chunks of at most
        :data:`OUT_ROWS` keys and their values, as lists of bytes."""
        buffered = self._buffered()
        chunks: Iterable[Pairs] = buffered
        if self._files:
            # Equal keys: a later run wins; the buffer holds the newest rows.
            runs = [_read_run(path) for path in self._files]
            chunks = merge_sorted([*runs, self._chunks(buffered)])
        for keys, values in chunks:
            for start in range(0, len(keys), OUT_ROWS):
                end = start + OUT_ROWS
                yield keys[start:end].to_pylist(), values[start:end].to_pylist()

    def __enter__(self) -> SortedSpill:
        return self

    def __exit__(self, *exc: object) -> None:
        self._keys, self._values = [], []
        if self._dir is not None:
            self._dir.cleanup()


def _data_bytes(array: pa.Array) -> int:
    """Bytes of the keys or values in a binary array (its offsets aside)."""
    total = pc.sum(pc.binary_length(array)).as_py()
    return int(total or 0)


_SCHEMA = pa.schema([("key", BINARY), ("value", BINARY)])


def _write_run(path: str, chunks: Iterator[Pairs]) -> None:
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, _SCHEMA) as out:
        for keys, values in chunks:
            out.write_batch(pa.record_batch([keys, values], schema=_SCHEMA))


def _read_run(path: str) -> Iterator[Pairs]:
    """A run's chunks, each read into memory (not mapped: a chunk outlives the file)."""
    with pa.OSFile(path, "rb") as source:
        run = pa.ipc.open_file(source)
        for i in range(run.num_record_batches):
            batch = run.get_batch(i)
            yield batch.column(0), batch.column(1)
