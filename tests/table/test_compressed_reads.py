"""Compressed SSTs through ``TableReader`` and a database (RFC 0018): every read path,
blocks decompressed once before they are cached, corruption named by object, databases
whose SSTs mix codecs."""

from __future__ import annotations

from pathlib import Path

import pytest

from slatepy import Db, DbReader, Settings
from slatepy.cli.main import main
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.errors import CorruptionError
from slatepy.format.block import Block, Entry, IndexedBlock
from slatepy.format.compression import Compression, unframe_block
from slatepy.format.lookup import LookupBlock
from slatepy.format.sst import SstBuilder, decode_footer, decode_sst
from slatepy.manifest.store import ManifestStore
from slatepy.store import MetricsStore, ObjectStore, open_store
from slatepy.table.layout import compacted_path
from slatepy.table.reader import TableReader
from tests.conftest import Backend

PATH = "compacted/c.sst"
CODECS: list[Compression] = ["zstd", "lz4"]


def entries(n: int) -> list[Entry]:
    return [(b"key%08d" % i, i + 1, b"row %d of the table, status=ok" % i * 2) for i in range(n)]


def stored(compression: Compression, n: int = 2000) -> tuple[MetricsStore, bytes]:
    data = bytes(
        SstBuilder(writer_epoch=1, block_size=1024, compression=compression)
        .add_all(entries(n))
        .finish()
        .data
    )
    store = MetricsStore(open_store("memory://"))
    store.put(PATH, data)
    return store, data


@pytest.mark.parametrize("compression", CODECS)
def test_every_read_path_reads_compressed_blocks(compression: Compression) -> None:
    store, data = stored(compression)
    expected = entries(2000)
    tables = TableReader(store)
    assert tables.top(PATH, size=len(data)).compressed_blocks
    assert tables.get(PATH, b"key00000500") == (501, expected[500][2])
    assert tables.get(PATH, b"key00000500x") is None
    wanted = [b"key00000003", b"key00001000", b"key00001999", b"nope"]
    assert tables.get_many(PATH, wanted) == [
        (k[1], k[2]) for k in (expected[3], expected[1000], expected[1999])
    ] + [None]
    assert list(tables.scan(PATH, b"key00000100", b"key00000200")) == expected[100:200]
    assert list(tables.scan(PATH, b"", None)) == expected
    assert list(TableReader(store).scan_all(PATH, chunk_bytes=4096)) == expected


@pytest.mark.parametrize("compression", CODECS)
def test_a_block_is_decompressed_once_then_served_from_the_cache(
    compression: Compression, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = stored(compression)
    unframed: list[int] = []

    def counting(stored: bytes | memoryview) -> bytes | memoryview:
        unframed.append(len(stored))
        return unframe_block(stored)

    monkeypatch.setattr("slatepy.table.point_reads.unframe_block", counting)
    tables = TableReader(store)
    for _ in range(20):  # past PROMOTE_AFTER_HITS: the cached block is decoded whole too
        assert tables.get(PATH, b"key00000501") is not None
    assert len(unframed) == 1 and tables.stats().block_reads == 1
    (block,) = tables._blocks.values()
    # The cache holds the decompressed block, larger than the frame read from the store.
    assert isinstance(block, IndexedBlock | Block | LookupBlock)
    assert block.size_in_memory > unframed[0]


@pytest.mark.parametrize("compression", CODECS)
def test_a_corrupt_compressed_block_is_a_corruption_error_naming_the_object(
    compression: Compression,
) -> None:
    store, data = stored(compression)
    tables = TableReader(store)
    top = tables.top(PATH, size=len(data))
    part = tables.partition(PATH, top, 0)
    start, end = part.offsets[3], part.offsets[4]
    corrupt = bytearray(data)
    corrupt[(start + end) // 2] ^= 0x10
    store.put(PATH, bytes(corrupt))
    key = part.first_keys[3]
    for read in (
        lambda t: t.get(PATH, key),
        lambda t: list(t.scan(PATH, key, None)),
        lambda t: list(t.scan_all(PATH, chunk_bytes=4096)),
    ):
        with pytest.raises(CorruptionError, match="checksum") as caught:
            read(TableReader(store))
        assert caught.value.path == PATH and caught.value.offset == start
        assert PATH in str(caught.value)


def db_settings(compression: Compression, **extra: object) -> Settings:
    return Settings(
        compression=compression,
        flush_interval=60,
        block_size=512,
        compactor="off",
        **extra,  # type: ignore[arg-type]
    )


def compact_all(store: ObjectStore, settings: Settings, *, l0_trigger: int = 1) -> None:
    compactor = Compactor(store, settings=settings, policy=CompactionPolicy(l0_trigger=l0_trigger))
    for _ in range(20):
        if compactor.run_once() is None:
            return


def versions(store: ObjectStore) -> dict[str, set[int]]:
    """The SST format versions in the store, by directory."""
    found: dict[str, set[int]] = {}
    for meta in store.list(""):
        if meta.path.endswith(".sst"):
            version = decode_footer(store.get(meta.path)).version
            found.setdefault(meta.path.split("/")[0], set()).add(version)
    return found


def l0_codecs(store: ObjectStore) -> list[str]:
    """The codec of each L0 SST the current manifest references, newest first."""
    stored = ManifestStore(store).load()
    assert stored is not None
    return [
        decode_sst(store.get(compacted_path(h.id)))[0].props.compression for h in stored.manifest.l0
    ]


def value(i: int, round_: int) -> bytes:
    return b"round %d value %d padding padding padding" % (round_, i)


def test_a_zstd_database_reopens_without_compression_and_reads_everything() -> None:
    store = open_store("memory://")
    with Db.open(store, settings=db_settings("zstd")) as db:
        for i in range(300):
            db.put(b"k%04d" % i, value(i, 0), await_durable=False)
        db.flush()
    compact_all(store, db_settings("zstd"))
    with Db.open(store, settings=db_settings("zstd")) as db:
        db.put(b"k0000", b"in the WAL only")
    assert versions(store) == {"wal": {6}, "compacted": {6}}  # framed only where compressed
    with Db.open(store, settings=db_settings("none")) as db:
        assert db.get(b"k0000") == b"in the WAL only"
        assert dict(db.scan()) == {
            b"k%04d" % i: b"in the WAL only" if i == 0 else value(i, 0) for i in range(300)
        }


def test_one_database_mixes_ssts_of_every_codec() -> None:
    """Written and compacted (WAL to L0) in turn with none, lz4 and zstd: reads merge SSTs
    of every codec, and a compaction under one codec reads all the others."""
    store = open_store("memory://")
    model: dict[bytes, bytes] = {}
    for round_, compression in enumerate(["none", "lz4", "zstd", "none"]):
        settings = db_settings(compression)  # type: ignore[arg-type]
        with Db.open(store, settings=settings) as db:
            for i in range(round_ * 50, round_ * 50 + 200):
                key = b"k%04d" % i
                model[key] = value(i, round_)
                db.put(key, model[key], await_durable=False)
            db.flush()
            assert dict(db.scan()) == model
        if round_ < 3:
            compact_all(store, settings, l0_trigger=100)  # WAL -> L0 only: L0 SSTs pile up
    assert l0_codecs(store) == ["zstd", "lz4", "none"]  # and round 3 is in the WAL
    for compression in ("none", "lz4", "zstd"):
        with Db.open(store, settings=db_settings(compression)) as db:  # type: ignore[arg-type]
            assert dict(db.scan()) == model
            assert all(db.get(k) == v for k, v in list(model.items())[::17])
    compact_all(store, db_settings("lz4"))
    stored = ManifestStore(store).load()
    assert stored is not None and not stored.manifest.l0 and stored.manifest.sorted_runs
    with Db.open(store, settings=db_settings("none")) as db:
        assert dict(db.scan()) == model


@pytest.mark.parametrize("compression", CODECS)
def test_flipping_any_byte_is_caught_by_the_reader_too(compression: Compression) -> None:
    """Through ``TableReader`` (open, partitions, framed blocks): a typed error or the
    right data, for a flip at every byte of a small compressed SST."""
    data = bytes(
        SstBuilder(writer_epoch=1, block_size=256, compression=compression)
        .add_all(entries(40))
        .finish()
        .data
    )
    expected = entries(40)
    store = open_store("memory://")
    for position in range(len(data)):
        corrupt = bytearray(data)
        corrupt[position] ^= 0x04
        store.put(PATH, bytes(corrupt))
        try:
            got = list(TableReader(store).scan(PATH, b"", None))
        except CorruptionError:
            continue
        pytest.fail(f"flipping byte {position} went undetected (same data: {got == expected})")


def test_compressed_databases_on_every_backend(backend: Backend) -> None:
    """Through each store's stack (the disk cache of remote stores holds stored, compressed
    bytes): a writer, a compaction and readers under another setting."""
    fields = {name: getattr(backend.settings, name) for name in backend.settings.__struct_fields__}
    zstd = Settings.from_dict({**fields, "compression": "zstd", "block_size": 512})
    plain = Settings.from_dict({**fields, "compression": "none"})
    model = {b"k%04d" % i: value(i, 0) for i in range(200)}
    with Db.open(backend.target(), settings=zstd) as db:
        for key, data in model.items():
            db.put(key, data, await_durable=False)
        db.flush()
    compact_all(backend.store(), zstd)
    with Db.open(backend.target(), settings=zstd) as db:
        db.put(b"k0000", b"newest")
    model[b"k0000"] = b"newest"
    with DbReader.open(backend.target(), settings=plain) as reader:
        assert dict(reader.scan()) == model
        assert reader.get(b"k0100") == model[b"k0100"]
    with Db.open(backend.target(), settings=plain) as db:
        assert dict(db.scan()) == model


def test_inspect_shows_each_ssts_compression(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path}/db"
    with Db.open(url, settings=db_settings("lz4")) as db:
        for i in range(100):
            db.put(b"k%04d" % i, value(i, 0), await_durable=False)
    assert main(["inspect", url]) == 0
    out = capsys.readouterr().out
    (line,) = (line for line in out.splitlines() if " lz4=" in line)
    before, after = map(int, line.split(" lz4=")[1].split()[0].split("->"))
    assert after < before


def test_a_database_written_with_version_3_blocks_reads_and_compacts_after_upgrade(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SSTs written before version 5 (indexed blocks, compressed or not: versions 3 and 4),
    in version 5 (columnar blocks) and in version 6 (with lookup indexes) live in one
    database: reads merge them, with tombstones and every read path, and compaction
    rewrites them all as version 6 (RFC 0022 and its addendum)."""
    store = open_store("memory://")
    model: dict[bytes, bytes] = {}
    defaults = dict(SstBuilder.__init__.__kwdefaults__ or {})
    for round_, (version, compression) in enumerate(
        [(3, "none"), (3, "zstd"), (5, "none"), (6, "none")]
    ):
        monkeypatch.setattr(
            SstBuilder.__init__, "__kwdefaults__", {**defaults, "format_version": version}
        )
        settings = db_settings(compression)  # type: ignore[arg-type]
        with Db.open(store, settings=settings) as db:
            for i in range(round_ * 60, round_ * 60 + 200):
                key = b"k%04d" % i
                if i % 9 == round_:
                    db.delete(key, await_durable=False)
                    model.pop(key, None)
                else:
                    model[key] = value(i, round_)
                    db.put(key, model[key], await_durable=False)
            db.flush()
        compact_all(store, settings, l0_trigger=100)  # WAL -> L0 only
    monkeypatch.setattr(SstBuilder.__init__, "__kwdefaults__", defaults)
    assert versions(store)["compacted"] == {3, 4, 5, 6}
    with Db.open(store, settings=db_settings("none")) as db:
        assert dict(db.scan()) == model
        assert list(db.scan(reverse=True)) == sorted(model.items(), reverse=True)
        assert [r for b in db.scan_batches(batch_size=50) for r in b] == sorted(model.items())
        assert all(db.get(b"k%04d" % i) == model.get(b"k%04d" % i) for i in range(0, 330, 7))
    compact_all(store, db_settings("none"))
    stored = ManifestStore(store).load()
    assert stored is not None and not stored.manifest.l0
    live = [compacted_path(h.id) for run in stored.manifest.sorted_runs for h in run.ssts]
    assert {decode_footer(store.get(p)).version for p in live} == {6}
    with Db.open(store, settings=db_settings("none")) as db:
        assert dict(db.scan()) == model
