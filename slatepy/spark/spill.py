"""A bulk-load task's rows in bounded memory: sorted runs spilled to local files (RFC 0025).

A task buffers ``(key, value)`` pairs until their estimated size passes its budget
(``bufferBytes``), then sorts the buffer and writes it to a temporary file as one run of
length-prefixed msgpack chunks. At the end the runs (and what is still buffered) are merged
in key order, equal keys kept in arrival order, so the last row of equal keys wins as in a
load that fits in memory; memory is then one chunk per run. The files live in the worker's
temporary directory and are deleted when the task ends, whatever happens.
"""

from __future__ import annotations

import heapq
import os
import struct
import tempfile
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import msgspec

PAIR_OVERHEAD = 120
"""Bytes a buffered pair costs beyond its key and value (two bytes objects and a tuple)."""

CHUNK_BYTES = 256 * 1024
"""Estimated bytes (as :data:`PAIR_OVERHEAD`) per chunk of a spilled run, at most: what each
run holds in memory while runs are merged (a 64th of the budget if that is less)."""

FAN_IN = 16
"""Runs merged at once: when this many are spilled they are merged into one, so a merge
holds at most ``FAN_IN + 1`` chunks whatever the partition's size."""

_LENGTH = struct.Struct(">I")


class SortedSpill:
    """Buffers pairs within ``budget`` bytes, spilling sorted runs; :meth:`sorted_pairs`
    yields them all in key order with only the last of equal keys. A context manager: its
    exit deletes the spilled files."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.runs = 0
        self._buffer: list[tuple[bytes, bytes]] = []
        self._bytes = 0
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._files: list[str] = []

    def add(self, keys: Iterable[bytes], values: Iterable[bytes]) -> None:
        for key, value in zip(keys, values, strict=True):
            self._buffer.append((key, value))
            self._bytes += len(key) + len(value) + PAIR_OVERHEAD
        if self._bytes >= self.budget:
            self._spill()

    def _spill(self) -> None:
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="slatepy-load-")
        path = os.path.join(self._dir.name, f"run-{len(self._files):05}")
        self._buffer.sort(key=_first)  # stable: equal keys keep their arrival order
        self._write_run(path, iter(self._buffer))
        self._files.append(path)
        self.runs += 1
        self._buffer = []
        self._bytes = 0
        if len(self._files) >= FAN_IN:  # one run of them all, in their order
            assert self._dir is not None
            merged = os.path.join(self._dir.name, f"merged-{self.runs:05}")
            self._write_run(merged, heapq.merge(*map(_read_run, self._files), key=_first))
            for old in self._files:
                os.remove(old)
            self._files = [merged]

    def _write_run(self, path: str, pairs: Iterator[tuple[bytes, bytes]]) -> None:
        encode = msgspec.msgpack.Encoder().encode
        limit = min(CHUNK_BYTES, max(1, self.budget // 64))
        with open(path, "wb") as out:
            chunk: list[tuple[bytes, bytes]] = []
            size = 0
            for pair in pairs:
                chunk.append(pair)
                size += len(pair[0]) + len(pair[1]) + PAIR_OVERHEAD
                if size >= limit:
                    data = encode(chunk)
                    out.write(_LENGTH.pack(len(data)) + data)
                    chunk, size = [], 0
            if chunk:
                data = encode(chunk)
                out.write(_LENGTH.pack(len(data)) + data)

    def sorted_pairs(self) -> Iterator[tuple[bytes, bytes]]:
        """Every pair added, in key order, the last of equal keys only."""
        self._buffer.sort(key=_first)
        if not self._files:
            return _last_of_equal(iter(self._buffer))
        runs = [_read_run(path) for path in self._files]
        # heapq.merge takes equal keys from earlier iterables first: runs in spill order,
        # then the buffer (the newest rows).
        return _last_of_equal(heapq.merge(*runs, iter(self._buffer), key=_first))

    def __enter__(self) -> SortedSpill:
        return self

    def __exit__(self, *exc: object) -> None:
        self._buffer = []
        if self._dir is not None:
            self._dir.cleanup()


def _read_run(path: str) -> Iterator[tuple[bytes, bytes]]:
    decoder = msgspec.msgpack.Decoder(list[tuple[bytes, bytes]])
    with open(path, "rb") as run:
        yield from _chunks(run, decoder)


def _chunks(
    run: BinaryIO, decoder: msgspec.msgpack.Decoder[list[tuple[bytes, bytes]]]
) -> Iterator[tuple[bytes, bytes]]:
    while header := run.read(_LENGTH.size):
        (size,) = _LENGTH.unpack(header)
        yield from decoder.decode(run.read(size))


def _first(pair: tuple[bytes, bytes]) -> bytes:
    return pair[0]


def _last_of_equal(pairs: Iterator[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
    """Sorted pairs with, of equal keys, only the last."""
    previous: tuple[bytes, bytes] | None = None
    for pair in pairs:
        if previous is not None and previous[0] != pair[0]:
            yield previous
        previous = pair
    if previous is not None:
        yield previous
