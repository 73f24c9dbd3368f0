"""The disk cache in the store stack of a Db and a DbReader (RFC 0010), on file and S3 over HTTP.

Request counts are taken below the stack by ``PathCounter``, by object directory, so the
tests can say "no range GET of a compacted SST" rather than "no range GET at all".
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import msgspec
import pytest

from slatepy import Db, DbReader, Settings, WriteBatch
from slatepy.cli.main import main
from slatepy.compactor import Compactor
from slatepy.manifest.store import ManifestStore
from slatepy.store import MetricsStore, ObjectStore, open_store
from slatepy.store.base import WrappingStore
from slatepy.store.disk_cache import PART_SIZE, DiskCachedStore
from slatepy.store.stack import cache_namespace, disk_cache_dir, open_stack
from tests.conftest import Backend, make_backend

KEYS = 4000
VALUE = b"v" * 100


class PathCounter(WrappingStore):
    """Counts reads by the object's top directory (``compacted``, ``wal``, ``manifest``)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.reads: Counter[str] = Counter()

    def _count(self, path: str) -> None:
        self.reads[path.split("/", 1)[0]] += 1

    def get(self, path: str) -> bytes:
        self._count(path)
        return super().get(path)

    def get_range(self, path: str, start: int, end: int) -> bytes:
        self._count(path)
        return super().get_range(path, start, end)

    def get_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        self._count(path)
        return super().get_ranges(path, ranges)

    def get_suffix(self, path: str, length: int) -> bytes:
        self._count(path)
        return super().get_suffix(path, length)


def key(i: int) -> bytes:
    return b"key%08d" % i


def with_cache_dir(settings: Settings, root: Path, **more: object) -> Settings:
    return msgspec.structs.replace(settings, disk_cache_dir=str(root), **more)


def write_and_compact(url: str, settings: Settings) -> None:
    """KEYS keys in a few batches, then every WAL SST compacted (nothing left in the WAL)."""
    with Db.open(url, settings=settings) as db:
        for first in range(0, KEYS, 1000):
            batch = WriteBatch()
            for i in range(first, first + 1000):
                batch.put(key(i), VALUE)
            db.write(batch)
    Compactor(open_store(url, settings), settings=settings).run_until_idle()


def compacted_sizes(url: str, settings: Settings) -> list[int]:
    stored = ManifestStore(open_store(url, settings)).load()
    assert stored is not None
    m = stored.manifest
    return [h.object_size for h in m.l0] + [h.object_size for r in m.sorted_runs for h in r.ssts]


def read_everything(
    url: str, settings: Settings, gets: list[int], *, opener: type[Db] | type[DbReader] = DbReader
) -> tuple[PathCounter, int]:
    """Open a reader (or a writer) below which reads are counted by directory; get ``gets``,
    scan everything; return the counts and the disk cache's hits."""
    counter = PathCounter(open_store(url, settings))
    with opener.open(counter, settings=settings) as reader:
        for i in gets:
            assert reader.get(key(i)) == VALUE
        rows = sum(1 for _ in reader.scan())
        hits = reader.metrics.cache_snapshot().hits
    assert rows == KEYS
    return counter, hits


# -- when the stack has a cache ------------------------------------------------------------


def test_auto_caches_remote_stores_only(tmp_path: Path) -> None:
    auto = Settings(disk_cache_dir=str(tmp_path / "cache"), instance_credentials=True)
    assert type(open_stack("memory://", auto)) is MetricsStore
    assert type(open_stack(f"file://{tmp_path}", auto)) is MetricsStore
    assert isinstance(open_stack("s3://bucket/prefix", auto), DiskCachedStore)
    assert isinstance(open_stack("gs://bucket/prefix", auto), DiskCachedStore)
    on = msgspec.structs.replace(auto, disk_cache="on")
    assert isinstance(open_stack(f"file://{tmp_path}", on), DiskCachedStore)
    assert isinstance(open_stack("memory://", on), DiskCachedStore)
    off = msgspec.structs.replace(auto, disk_cache="off")
    assert type(open_stack("s3://bucket/prefix", off)) is MetricsStore
    cached = open_stack("s3://bucket/prefix", auto)
    assert not isinstance(open_stack(cached, auto), DiskCachedStore)  # never two caches


@pytest.mark.parametrize("scheme", ["memory", "file"])
def test_memory_and_file_databases_are_not_cached_in_auto(tmp_path: Path, scheme: str) -> None:
    root = tmp_path / "cache"
    settings = Settings(compactor="off", flush_interval=0.02, disk_cache_dir=str(root))
    url = f"file://{tmp_path}/db" if scheme == "file" else "memory://"
    target: str | ObjectStore = open_store(url) if scheme == "memory" else url
    with Db.open(target, settings=settings) as db:
        for i in range(100):
            db.put(key(i), VALUE)
        Compactor(target if isinstance(target, ObjectStore) else open_store(url)).run_until_idle()
    with DbReader.open(target, settings=settings) as reader:
        assert sum(1 for _ in reader.scan()) == 100
        assert reader.get(key(7)) == VALUE
        assert reader.metrics.cache_snapshot().hits + reader.metrics.cache_snapshot().misses == 0
    assert not root.exists()


def test_default_cache_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert disk_cache_dir(Settings(disk_cache_dir="/x/y")) == Path("/x/y")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert disk_cache_dir(Settings()) == tmp_path / "slatepy"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert disk_cache_dir(Settings()) == tmp_path / "home" / ".cache" / "slatepy"


def test_the_namespace_tells_endpoints_apart() -> None:
    minio = Settings(s3_endpoint="http://127.0.0.1:9000")
    aws = Settings(s3_endpoint="https://s3.eu-west-1.amazonaws.com")
    assert cache_namespace("s3://b/p", minio) != cache_namespace("s3://b/p", aws)
    assert cache_namespace("file:///d", Settings()) == "file:///d"


# -- a restarted reader --------------------------------------------------------------------


@pytest.mark.s3
@pytest.mark.parametrize("opener", [DbReader, Db])
def test_a_restarted_reader_reads_compacted_data_from_disk_only(
    request: pytest.FixtureRequest, tmp_path: Path, opener: type[Db] | type[DbReader]
) -> None:
    backend: Backend = make_backend("s3", request, tmp_path)
    settings = with_cache_dir(backend.settings, tmp_path / "cache")  # "auto": on for s3://
    write_and_compact(backend.url, settings)
    assert compacted_sizes(backend.url, settings)
    gets = random.Random(3).sample(range(KEYS), 300)

    cold, _ = read_everything(backend.url, settings, gets, opener=opener)
    assert cold.reads["compacted"] > 0  # the first reader had to fetch

    warm, warm_hits = read_everything(backend.url, settings, gets, opener=opener)  # restarted
    assert warm.reads["compacted"] == 0, warm.reads
    assert warm_hits > 0
    assert warm.reads["manifest"] > 0  # manifests are always read fresh from the store


@pytest.mark.s3
def test_request_counts_for_gets_on_s3_are_as_planned(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """RFC 0010's plan: a cold reader reads each compacted SST at most once per part plus one
    footer read; a warm reader reads none of it. Without the cache, gets cost a GET per block.
    """
    backend: Backend = make_backend("s3", request, tmp_path)
    settings = with_cache_dir(
        backend.settings, tmp_path / "cache", reader_poll_interval=3600.0, block_cache_bytes=0
    )
    write_and_compact(backend.url, settings)
    sizes = compacted_sizes(backend.url, settings)
    planned = sum(1 + -(-size // PART_SIZE) for size in sizes)
    gets = random.Random(4).sample(range(KEYS), 500)

    uncached = msgspec.structs.replace(settings, disk_cache="off")
    without, _ = read_everything(backend.url, uncached, gets)
    cold, _ = read_everything(backend.url, settings, gets)
    warm, _ = read_everything(backend.url, settings, gets)
    print(f"compacted-SST reads: off {without.reads['compacted']}, cold {cold.reads['compacted']}")
    assert cold.reads["compacted"] <= planned
    assert warm.reads["compacted"] == 0
    assert without.reads["compacted"] > planned  # what the cache saves even when cold


# -- inspect -------------------------------------------------------------------------------


def test_inspect_shows_the_hit_rate_of_its_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path}/db"
    write_and_compact(url, Settings(compactor="off"))
    monkeypatch.setenv("SLATEPY_DISK_CACHE", "on")
    monkeypatch.setenv("SLATEPY_DISK_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["inspect", url]) == 0
    first = capsys.readouterr().out
    assert "disk cache: on" in first and "hit rate 0.0%" in first
    assert main(["inspect", url]) == 0
    second = capsys.readouterr().out
    assert "hit rate 100.0%" in second
    monkeypatch.setenv("SLATEPY_DISK_CACHE", "auto")
    assert main(["inspect", url]) == 0
    assert "disk cache: off" in capsys.readouterr().out
