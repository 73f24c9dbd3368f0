"""Indexed data blocks (SST format version 3): a point lookup reads O(log n) keys of a block
and parses one entry; corruption is still always detected; version 2 SSTs still read."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from slatepy.errors import CorruptionError
from slatepy.format.block import BlockBuilder, IndexedBlock, decode_block, open_block
from slatepy.format.kinds import Expiring
from slatepy.format.sst import SstBuilder, decode_footer, decode_sst
from tests.format.v1sst import sample_entries

V2_SAMPLE = (Path(__file__).parent / "data" / "v2-sample.sst").read_bytes()


class CountingBytes(bytes):
    """Bytes that count the slices taken of them (a key or value read out of a block)."""

    slices = 0

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        if isinstance(index, slice):
            CountingBytes.slices += 1
        return super().__getitem__(index)


def block_of(n: int, *, indexed: bool = True) -> tuple[bytes, list[bytes]]:
    builder = BlockBuilder(indexed=indexed)
    keys = [b"key%06d" % i for i in range(0, 2 * n, 2)]
    for i, key in enumerate(keys):
        builder.add(key, i + 1, None if i % 5 == 0 else b"value-%d" % i)
    return builder.finish(), keys


@pytest.mark.parametrize("n", [1, 2, 31, 1000, 5000])
def test_a_cold_point_get_reads_log_n_keys_and_one_value(n: int) -> None:
    data, keys = block_of(n)
    opened = open_block(data)
    counted = IndexedBlock(CountingBytes(opened.data), opened.count, opened.entries_end)
    bound = math.ceil(math.log2(n + 1)) + 2  # the probes, the found key, its value
    for i in [0, n // 3, n - 1]:
        CountingBytes.slices = 0
        assert counted.get(keys[i]) == (i + 1, None if i % 5 == 0 else b"value-%d" % i)
        assert CountingBytes.slices <= bound
        CountingBytes.slices = 0
        assert counted.get(keys[i] + b"x") is None  # absent, between two keys
        assert CountingBytes.slices <= bound
    assert counted.get(b"a") is None and counted.get(b"z") is None


def test_indexed_lookup_agrees_with_the_full_decode() -> None:
    data, keys = block_of(300)
    opened, decoded = open_block(data), decode_block(data)
    assert decoded.keys == keys and opened.first_key == keys[0]
    assert opened.decode() == decoded
    probes = keys + [k + b"\x00" for k in keys] + [b"", b"key", b"\xff"]
    for key in probes:
        assert opened.get(key) == decoded.get(key)


def test_indexed_and_legacy_blocks_differ_by_the_offsets_array() -> None:
    indexed, _ = block_of(50)
    legacy, _ = block_of(50, indexed=False)
    assert len(indexed) == len(legacy) + 4 * 50
    assert decode_block(indexed).entries() == decode_block(legacy, indexed=False).entries()


def test_flipping_any_byte_of_an_indexed_block_is_detected() -> None:
    data, keys = block_of(40)
    rng = random.Random(3)
    for position in range(len(data)):
        corrupt = bytearray(data)
        corrupt[position] ^= 1 << rng.randrange(8)
        with pytest.raises(CorruptionError):
            open_block(bytes(corrupt)).get(keys[7])
        with pytest.raises(CorruptionError):
            decode_block(bytes(corrupt))


def test_garbage_offsets_behind_a_valid_checksum_are_corruption_not_wrong_data() -> None:
    from slatepy.format.checksum import append_checksum

    data, keys = block_of(20)
    body = bytearray(data[:-8])
    count = 20
    offsets_at = len(body) - 4 - 4 * count
    rng = random.Random(4)
    for _ in range(300):
        mutated = bytearray(body)
        at = offsets_at + rng.randrange(4 * count)
        mutated[at] = rng.randrange(256)
        block = open_block(append_checksum(bytes(mutated)))
        for key in keys[::3]:
            try:
                got = block.get(key)
            except CorruptionError:
                continue
            assert got is None or got[0] == keys.index(key) + 1


def test_a_version_2_sst_written_by_the_old_code_still_decodes() -> None:
    """``data/v2-sample.sst`` came from the version 2 ``SstBuilder`` (commit 8473648)."""
    assert decode_footer(V2_SAMPLE).version == 2
    meta, decoded = decode_sst(V2_SAMPLE)
    assert list(decoded) == sample_entries()
    assert not meta.top.indexed_blocks and meta.props.writer_epoch == 4
    assert (
        SstBuilder(writer_epoch=4, block_size=128, format_version=2)
        .add_all(sample_entries())
        .finish()
        .data
        == V2_SAMPLE
    )


@pytest.mark.parametrize("indexed", [True, False])
def test_an_expiring_value_too_short_for_its_expiry_is_corruption(indexed: bool) -> None:
    """Found when an expiring entry's expiry was read (``struct.error``), not at decode."""
    builder = BlockBuilder(indexed=indexed)
    builder.add(b"a", 1, b"plain")
    builder.add(b"b", 2, Expiring(b"short"))  # flagged expiring, 5 bytes: no room for one
    data = builder.finish()
    with pytest.raises(CorruptionError, match="no expiry"):
        decode_block(data, indexed=indexed)
    if indexed:
        assert open_block(data).get(b"a") == (1, b"plain")
        with pytest.raises(CorruptionError, match="no expiry"):
            open_block(data).get(b"b")
