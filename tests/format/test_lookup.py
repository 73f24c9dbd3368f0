"""Lookup indexes of version 6 columnar blocks (slatepy.format.lookup): every key found, no
other, in blocks of every shape; damage detected; blocks without an index told apart."""

from __future__ import annotations

import random
import struct
from array import array

import pytest

from slatepy import Db, Settings
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.errors import CorruptionError
from slatepy.format import columnar, lookup, lookup_index
from slatepy.format.checksum import append_checksum
from slatepy.format.columnar import ColumnBlockBuilder, decode_columnar
from slatepy.format.kinds import Expiring, Operands
from slatepy.format.lookup import LookupBlock, open_lookup
from slatepy.format.lookup_index import TRAILER
from slatepy.format.sst import SstBuilder, decode_sst
from slatepy.manifest.store import ManifestStore
from slatepy.store import open_store
from slatepy.table.layout import compacted_path
from slatepy.table.reader import TableReader


def block_of(entries: list[tuple[bytes, int, bytes | None]], *, lookup: bool = True) -> bytes:
    builder = ColumnBlockBuilder(lookup=lookup)
    for key, seq, value in entries:
        builder.add(key, seq, value)
    return builder.finish()


def entries(count: int, key_size: int, value_size: int, seed: int = 1) -> list:
    rng = random.Random(seed)
    keys = sorted({rng.randbytes(key_size) for _ in range(count)})
    return [(key, i + 1, rng.randbytes(value_size)) for i, key in enumerate(keys)]


def kinds(count: int) -> list:
    """Plain values, tombstones, expiring values and merge operands, mixed."""
    out: list = []
    for i in range(count):
        key = b"k%05d" % i
        if i % 5 == 1:
            out.append((key, i, None))
        elif i % 5 == 2:
            out.append((key, i, Expiring.make(b"ttl%d" % i, 1_700_000_000_000 + i)))
        elif i % 5 == 3:
            out.append((key, i, Operands.of([b"+%d" % i, b"+1"])))
        else:
            out.append((key, i, b"v%d" % i))
    return out


SHAPES = {
    "one entry": entries(1, 1, 0),
    "16-byte keys, 100-byte values": entries(127, 16, 100),
    "keys of 255 and 256 bytes (bin 8 and bin 16 headers)": entries(20, 255, 3)
    + entries(20, 256, 3, seed=2),
    "values over 64 KiB (32-bit offsets)": entries(3, 8, 70_000),
    "a key over 64 KiB (a bin 32 header) after small ones": [
        *entries(10, 4, 3),
        (b"\xff" * 70_001, 99, b"big"),
    ],
    "300 entries (16-bit slots)": entries(300, 5, 1),
    "70,000 entries (32-bit slots)": [(b"%06d" % i, i, b"") for i in range(70_000)],
    "tombstones and entry kinds": kinds(200),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_key_is_found_with_its_entry_and_no_other_key(shape: str) -> None:
    stored = sorted(SHAPES[shape], key=lambda e: e[0])
    stored = [e for i, e in enumerate(stored) if i == 0 or e[0] != stored[i - 1][0]]
    data = block_of(stored)
    block = open_lookup(data)
    assert block is not None
    decoded = decode_columnar(data)  # the scan's decode of the same bytes agrees
    assert decoded.keys == [key for key, _, _ in stored]
    for i, (key, seq, value) in enumerate(stored):
        found = block.get(key)
        assert found == (seq, value) == (decoded.seqs[i], decoded.values[i]), key
        assert type(found[1]) is type(value)
    rng = random.Random(3)
    present = {key for key, _, _ in stored}
    for key, _, _ in stored[:300]:
        for probe in (key + b"\x00", key[:-1], rng.randbytes(len(key))):
            if probe not in present:
                assert block.get(probe) is None
    assert block.first_key() == stored[0][0]
    assert block.decode().keys == decoded.keys
    # The block costs about its encoded size in a cache (a decoded block about twice that).
    assert len(data) <= block.size_in_memory <= len(data) + 1024


def test_a_block_without_an_index_is_told_apart() -> None:
    data = block_of(entries(50, 16, 100), lookup=False)
    assert data[0] == 0x94 and open_lookup(data) is None
    assert decode_columnar(data).keys == [key for key, _, _ in entries(50, 16, 100)]


def test_only_ssts_with_filters_have_lookup_indexes() -> None:
    """WAL SSTs and persist parts are written without filters and only ever read whole."""
    rows = [(b"k%04d" % i, i, b"v" * 20) for i in range(200)]
    for bits, expected in ((10, 0x95), (0, 0x94)):
        encoded = SstBuilder(writer_epoch=1, block_size=512, bloom_bits_per_key=bits)
        sst = encoded.add_all(rows).finish()
        data, top = sst.data, sst.meta.top
        assert top.lookup_blocks
        firsts = {data[handle.offset] for handle in sst.meta.blocks}
        assert firsts == {expected}
        assert list(decode_sst(bytes(data))[1]) == rows


def test_flipping_any_byte_of_a_block_is_detected() -> None:
    data = block_of(kinds(12))
    rng = random.Random(4)
    for position in range(len(data)):
        corrupt = bytearray(data)
        corrupt[position] ^= 1 << rng.randrange(8)
        with pytest.raises(CorruptionError, match="data block"):
            open_lookup(bytes(corrupt))


def resealed(body: bytes) -> bytes:
    return append_checksum(body)


def test_an_index_that_lies_behind_a_valid_checksum_is_refused() -> None:
    """A writer bug, not damage: the checksum passes, and the index still cannot be trusted
    to point anywhere in the block."""
    data = block_of(entries(40, 16, 20))
    body = bytearray(data[:-8])
    end = len(body) - TRAILER.size
    count, slots, width, slot_width = TRAILER.unpack_from(body, end)
    for trailer in (
        (count, slots, 3, slot_width),  # no such offset width
        (count, 2 * count - 1, width, slot_width),  # fewer slots than the table needs
        (count * 50, slots, width, slot_width),  # an index larger than the block
    ):
        lie = bytearray(body)
        TRAILER.pack_into(lie, end, *trailer)
        with pytest.raises(CorruptionError, match="lookup index"):
            open_lookup(resealed(bytes(lie)))
    # The first value's offset moved onto a byte that starts no bin.
    index_at = end - slots * slot_width - 2 * (count + 1) * width
    first_value = index_at + (count + 1) * width
    lie = bytearray(body)
    (offset,) = struct.unpack_from("<H", lie, first_value)
    struct.pack_into("<H", lie, first_value, offset + 1)
    block = open_lookup(resealed(bytes(lie)))
    assert block is not None
    with pytest.raises(CorruptionError, match="entry 0's value"):
        block.get(entries(40, 16, 20)[0][0])


def test_the_writer_refuses_a_body_its_index_does_not_describe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The offsets follow from the sizes msgpack's encoder is expected to write: a body of
    another size (a changed encoder) must fail the write, not write lookups that misread."""
    real = columnar.build_index
    monkeypatch.setattr(
        columnar, "build_index", lambda *a, **k: (real(*a, **k)[0], real(*a, **k)[1] + 1)
    )
    with pytest.raises(AssertionError, match="other sizes"):
        block_of(entries(10, 16, 20))


def test_a_lookup_block_is_what_point_reads_cache() -> None:
    """One block read per block for gets, then gets served from the cached bytes."""
    store = open_store("memory://")
    rows = [(b"k%05d" % i, i, b"v" * 100) for i in range(2000)]
    sst = SstBuilder(writer_epoch=1, block_size=4096).add_all(rows).finish()
    store.put("sst", bytes(sst.data))
    tables = TableReader(store)
    for key, seq, value in rows[::7]:
        assert tables.get("sst", key) == (seq, value)
    blocks = list(tables._blocks.values())
    assert blocks and all(isinstance(b, LookupBlock) for b in blocks)
    assert tables.stats().block_reads == len(blocks)
    for key, seq, value in rows[::7]:
        assert tables.get("sst", key) == (seq, value)
    assert tables.stats().block_reads == len(blocks)
    assert tables.get("sst", b"k00001x") is None


def test_a_lying_index_in_a_stored_sst_is_reported_with_the_object_and_block() -> None:
    rows = [(b"k%05d" % i, i, b"v" * 100) for i in range(200)]
    sst = SstBuilder(writer_epoch=1, block_size=4096).add_all(rows).finish()
    data = bytearray(sst.data)
    first = sst.meta.blocks[1]  # the second block: its own checksum, resealed below
    body = bytearray(data[first.offset : first.offset + first.length - 8])
    end = len(body) - TRAILER.size
    count, slots, width, slot_width = TRAILER.unpack_from(body, end)
    value_at = end - slots * slot_width - (count + 1) * width
    (offset,) = struct.unpack_from("<H", body, value_at)
    struct.pack_into("<H", body, value_at, offset + 1)
    data[first.offset : first.offset + first.length] = resealed(bytes(body))
    store = open_store("memory://")
    store.put("sst", bytes(data))
    tables = TableReader(store)
    key = decode_columnar(resealed(bytes(body))).keys[0]
    with pytest.raises(CorruptionError, match=f"sst: block 1 at byte {first.offset}: .*value"):
        tables.get("sst", key)
    assert tables.get("sst", rows[0][0]) == rows[0][1:]  # the other blocks still read


def test_gets_read_each_block_once_when_the_stored_blocks_fit_the_cache() -> None:
    """Issue 33: a cache that holds the blocks as stored but not decoded (about twice that)
    read blocks again and again under random gets (a quarter of the gets after a reopen of
    200,000 keys). Blocks with lookup indexes are cached as their bytes: read once."""
    rows = [(b"k%06d" % i, i, b"v" * 100) for i in range(20_000)]
    sst = SstBuilder(writer_epoch=1, block_size=16 * 1024).add_all(rows).finish()
    store = open_store("memory://")
    store.put("sst", bytes(sst.data))
    stored = sum(handle.length for handle in sst.meta.blocks)
    tables = TableReader(store, block_cache_bytes=stored * 5 // 4)
    shuffled = rows[:]
    random.Random(5).shuffle(shuffled)
    for _ in range(2):
        for key, seq, value in shuffled:
            assert tables.get("sst", key) == (seq, value)
    assert tables.stats().block_reads == len(sst.meta.blocks)


def test_wal_compactions_write_l0_ssts_without_indexes_and_merges_runs_with_them() -> None:
    """L0 SSTs of the WAL live until the next L0 merge: their blocks are version 5's (the
    index would cost the writer's awaited batches; RFC 0022's addendum). A sorted run's
    SSTs, where data lives on and gets read, have lookup indexes."""
    store = open_store("memory://")
    settings = Settings(compactor="off", block_size=1024)
    model = {b"k%05d" % i: b"v%d" % i * 10 for i in range(3000)}
    with Db.open(store, settings=settings) as db:
        for key, value in model.items():
            db.put(key, value, await_durable=False)

    def firsts(handles: list) -> set[int]:
        out = set()
        for handle in handles:
            data = store.get(compacted_path(handle.id))
            meta, _ = decode_sst(data)
            out |= {data[block.offset] for block in meta.blocks}
        return out

    wal = Compactor(store, settings=settings, policy=CompactionPolicy(l0_trigger=100))
    wal.run_until_idle()
    manifest = wal.last_published.manifest
    assert manifest.l0 and not manifest.sorted_runs and firsts(list(manifest.l0)) == {0x94}
    with Db.open(store, settings=settings) as db:  # gets from L0's version 5 blocks
        assert all(db.get(key) == value for key, value in list(model.items())[::37])
    Compactor(store, settings=settings, policy=CompactionPolicy(l0_trigger=1)).run_until_idle()
    stored = ManifestStore(store).load()
    assert stored is not None
    manifest = stored.manifest
    run = [h for r in manifest.sorted_runs for h in r.ssts]
    assert not manifest.l0 and run and firsts(run) == {0x95}
    with Db.open(store, settings=settings) as db:
        assert all(db.get(key) == value for key, value in list(model.items())[::37])
        assert dict(db.scan()) == model


def test_a_slot_past_the_entries_is_reported_as_damage_not_an_index_error() -> None:
    """A hash table naming an entry the block does not have (a writer's bug behind a valid
    checksum) fails a get as ``CorruptionError`` naming the object and block."""
    rows = [(b"k%05d" % i, i, b"v" * 100) for i in range(200)]
    sst = SstBuilder(writer_epoch=1, block_size=4096).add_all(rows).finish()
    data = bytearray(sst.data)
    block = sst.meta.blocks[0]
    body = bytearray(data[block.offset : block.offset + block.length - 8])
    end = len(body) - TRAILER.size
    _, slots, _, slot_width = TRAILER.unpack_from(body, end)
    assert slot_width == 1
    body[end - slots : end] = bytes([254]) * slots  # every slot names entry 254
    data[block.offset : block.offset + block.length] = resealed(bytes(body))
    store = open_store("memory://")
    store.put("sst", bytes(data))
    with pytest.raises(CorruptionError, match="sst: block 0 at byte 0: a lookup index entry"):
        TableReader(store).get("sst", rows[1][0])


def test_a_big_endian_machine_reads_the_little_endian_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The index is little-endian on disk; a big-endian reader copies and swaps each column
    (emulated here: on this machine the swap makes the values wrong, but each column has its
    items, not one per byte)."""
    raw = memoryview(array("H", [1, 2, 3]).tobytes())
    monkeypatch.setattr(lookup, "BIG_ENDIAN", True)
    column = lookup._column(raw, 0, len(raw), 2)
    expected = array("H")
    expected.frombytes(bytes(raw))
    expected.byteswap()
    assert column == expected and len(column) == 3


@pytest.mark.parametrize(
    ("key_size", "value_size", "count"), [(16, 100, 127), (3, 300, 40), (8, 0, 900)]
)
def test_an_index_told_its_rows_widths_is_the_one_it_finds_itself(
    key_size: int, value_size: int, count: int
) -> None:
    """``build_index`` with ``widths`` (a bulk add of rows of one size) writes the index it
    writes measuring every key and value (bin 8 and bin 16 values, 1 and 2-byte slots)."""
    keys = [b"%0*d" % (key_size, i) for i in range(count)]
    values = [bytes([i % 256]) * value_size for i in range(count)]
    assert lookup_index.build_index(
        b"", keys, values, 8 * count, (key_size, value_size)
    ) == lookup_index.build_index(b"", keys, values, 8 * count)


def test_open_lookup_checks_the_first_key_the_index_gives() -> None:
    stored = entries(30, 16, 20)
    data = block_of(stored)
    block = open_lookup(data, stored[0][0])
    assert block is not None and block.first_key() == stored[0][0]
    for other in (stored[1][0], stored[0][0][:-1], stored[0][0] + b"\x00"):
        with pytest.raises(CorruptionError, match="disagrees with the index"):
            open_lookup(data, other)
    unindexed = block_of(stored, lookup=False)
    assert open_lookup(unindexed, stored[1][0]) is None  # (its first key is its decoder's)


def test_a_block_whose_first_key_disagrees_with_the_index_is_reported() -> None:
    """A block that passes its checksum but starts with another key than the SST's index
    says (the cold get's check, made while the block is opened) fails the get as
    ``CorruptionError`` naming the object and the block, and is not cached."""
    rows = [(b"k%05d" % i, i, b"v" * 100) for i in range(200)]
    sst = SstBuilder(writer_epoch=1, block_size=4096).add_all(rows).finish()
    data = bytearray(sst.data)
    handle = sst.meta.blocks[1]
    body = bytearray(data[handle.offset : handle.offset + handle.length - 8])
    first = decode_columnar(resealed(bytes(body))).keys[0]
    at = body.index(first)
    body[at : at + len(first)] = b"j" + first[1:]  # same length: the offsets stay right
    data[handle.offset : handle.offset + handle.length] = resealed(bytes(body))
    store = open_store("memory://")
    store.put("sst", bytes(data))
    tables = TableReader(store)
    match = f"sst: block 1 at byte {handle.offset}: disagrees with the index"
    with pytest.raises(CorruptionError, match=match):
        tables.get("sst", first)
    assert len(tables._blocks) == 0
    assert tables.get("sst", rows[0][0]) == rows[0][1:]  # the other blocks still read
