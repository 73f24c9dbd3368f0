"""Decoders and the public API under random and mutated input: only typed errors.

Every decoder gets random bytes, mutated valid encodings, and garbage that carries a *valid*
checksum (so the parser behind the checksum is exercised too). Allowed outcomes: a decoded
value or ``CorruptionError``; never another exception, never a hang or a large allocation.
"""

from __future__ import annotations

import contextlib
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slatepy import Db, InvalidArgument, Settings, WriteBatch
from slatepy.errors import CorruptionError
from slatepy.format.block import BlockBuilder, decode_block
from slatepy.format.bloom import BloomFilter
from slatepy.format.checksum import append_checksum
from slatepy.format.envelope import seal
from slatepy.format.sst import SstBuilder, decode_footer, decode_sst
from slatepy.manifest.record import MANIFEST_FORMAT_VERSION, MANIFEST_MAGIC, Manifest, SstHandle
from slatepy.store import open_store

MAX_BYTES = 64 * 1024 * 1024
MAX_SECONDS = 2.0


def only_corruption(decode: Callable[[], Any]) -> None:
    """Run ``decode``: it may succeed or raise CorruptionError, within time and memory bounds."""
    tracemalloc.start()
    start = time.monotonic()
    try:
        decode()
    except CorruptionError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert time.monotonic() - start < MAX_SECONDS
    assert peak < MAX_BYTES, f"decoder allocated {peak} bytes"


def whole_sst(data: bytes) -> None:
    _, entries = decode_sst(data)
    list(entries)


def valid_sst() -> bytes:
    builder = SstBuilder(writer_epoch=3, block_size=128)
    for i in range(40):
        builder.add(b"key%03d" % i, i + 1, None if i % 7 == 0 else b"value-%d" % i)
    return builder.finish().data


VALID_SST = valid_sst()
VALID_MANIFEST = Manifest(
    writer_epoch=2,
    l0=(SstHandle("abc", 10, b"a", b"z", 3, 9),),
    wal_id_last_compacted=4,
    wal_id_last_seen=9,
).encode()


def mutate(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    buf = bytearray(data)
    for pos, byte in edits:
        buf[pos % len(buf)] = byte
    return bytes(buf[:cut] if cut is not None else buf)


edits = st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=6)
cuts = st.one_of(st.none(), st.integers(0, 4096))


@settings(max_examples=300)
@given(st.binary(max_size=2048))
def test_random_bytes(data: bytes) -> None:
    only_corruption(lambda: decode_block(data))
    only_corruption(lambda: decode_footer(data))
    only_corruption(lambda: whole_sst(data))
    only_corruption(lambda: Manifest.decode(data))
    only_corruption(lambda: BloomFilter(data).may_contain(b"k"))


@settings(max_examples=300)
@given(edits, cuts)
def test_mutated_sst_and_manifest(changes: list[tuple[int, int]], cut: int | None) -> None:
    only_corruption(lambda: whole_sst(mutate(VALID_SST, changes, cut)))
    only_corruption(lambda: Manifest.decode(mutate(VALID_MANIFEST, changes, cut)))


@settings(max_examples=300)
@given(st.binary(max_size=1024))
def test_garbage_behind_a_valid_checksum(body: bytes) -> None:
    only_corruption(lambda: decode_block(append_checksum(body)).entries())
    only_corruption(lambda: Manifest.decode(seal(MANIFEST_MAGIC, MANIFEST_FORMAT_VERSION, body)))


@settings(max_examples=200)
@given(edits)
def test_mutated_block_behind_a_valid_checksum(changes: list[tuple[int, int]]) -> None:
    builder = BlockBuilder()
    for i in range(10):
        builder.add(b"k%02d" % i, i, b"v" * i)
    body = builder.finish()[:-8]  # drop the checksum, mutate, checksum again
    only_corruption(lambda: decode_block(append_checksum(mutate(body, changes, None))).entries())


anything = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=5),
    st.binary(max_size=70_000),
    st.lists(st.integers(), max_size=3),
    st.floats(allow_nan=False),
)


@pytest.fixture(scope="module")
def db() -> Any:
    with Db.open(open_store("memory://"), settings=Settings(compactor="off")) as opened:
        yield opened


@settings(max_examples=200)
@given(key=anything, value=anything)
def test_public_api_refuses_bad_arguments_with_invalid_argument(
    db: Db, key: Any, value: Any
) -> None:
    for call in (
        lambda: db.put(key, value),
        lambda: db.get(key),
        lambda: db.delete(key),
        lambda: list(db.scan(key, value)),
        lambda: db.write(WriteBatch().put(key, value)),
        lambda: db.write(key),
    ):
        with contextlib.suppress(InvalidArgument):  # or success, for valid arguments
            call()
