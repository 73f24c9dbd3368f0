"""Batched gets (``Db.get_many``, ``DbReader.get_many``): the same answers as a ``get`` per
key, from one view, in a few coalesced requests; and the request counts the design plans
for gets, batched gets and scans through a whole database on file and S3 over HTTP."""

from __future__ import annotations

import random

import msgspec
import pytest

from slatepy import Db, DbReader, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.compactor.planner import CompactionPolicy
from slatepy.manifest.record import Manifest
from slatepy.manifest.store import ManifestStore
from slatepy.store import open_store
from tests.conftest import Backend, make_backend


def key(i: int) -> bytes:
    return b"key%08d" % i


def current(backend: Backend) -> Manifest:
    stored = ManifestStore(backend.store()).load()
    assert stored is not None
    return stored.manifest


def test_get_many_answers_as_get_does_across_memtable_l0_and_sorted_runs(
    backend: Backend,
) -> None:
    rng = random.Random(5)
    model: dict[bytes, bytes | None] = {}
    policy = CompactionPolicy(l0_trigger=2, target_sst_bytes=64 * 1024)  # SSTs per run: several
    with Db.open(backend.target(), settings=backend.settings) as db:
        for round_ in range(4):
            batch = WriteBatch()
            for _ in range(3000):
                k = key(rng.randrange(5000))
                if rng.random() < 0.2:
                    batch.delete(k)
                    model[k] = None
                else:
                    value = b"r%d-%s" % (round_, k)
                    batch.put(k, value)
                    model[k] = value
            db.write(batch)
            if round_ < 3:  # rounds 0-1 go to a sorted run, 2 to L0, 3 stays in the memtable
                db.flush()
                compactor = Compactor(backend.store(), settings=backend.settings, policy=policy)
                if round_ < 2:
                    compactor.run_until_idle()
                else:
                    compactor.run_once()
                db.refresh()
        assert current(backend).l0 and current(backend).sorted_runs
        probes = [key(rng.randrange(5200)) for _ in range(2000)]  # present, deleted, absent
        probes += probes[:50]  # duplicates keep their places
        expected = [model.get(k) for k in probes]
        assert db.get_many(probes) == expected == [db.get(k) for k in probes]
        assert db.get_many([]) == []
    with DbReader.open(backend.target(), settings=backend.settings) as reader:
        assert reader.get_many(probes) == expected


def test_get_many_sees_a_write_batch_whole_or_not_at_all(tmp_path: object) -> None:
    """The memtable is read under the writer's lock: a batch applied meanwhile shows in
    every key of the result or in none."""
    import threading

    with Db.open("memory://", settings=Settings(compactor="off")) as db:
        keys = [key(i) for i in range(200)]
        stop = threading.Event()

        def writer() -> None:
            n = 0
            while not stop.is_set() and n < 2000:
                n += 1
                batch = WriteBatch()
                for k in keys:
                    batch.put(k, b"%d" % n)
                db.write(batch, await_durable=False)

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            for _ in range(200):
                values = db.get_many(keys)
                assert len(set(values)) == 1, set(values)
        finally:
            stop.set()
            thread.join(timeout=30)


@pytest.mark.parametrize("name", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_request_counts_for_gets_batched_gets_and_scans(
    name: str, request: pytest.FixtureRequest, tmp_path: object
) -> None:
    """What the design plans (RFC 0009), counted by the store metrics on a reopened database
    of one sorted run of several SSTs, the disk cache off so every read reaches the store:

    * opening the database reads no SST; the first read of an SST opens it with one GET;
    * a cold get: at most 2 GETs (a partition, a block) besides that open; a warm one none;
    * a batched get of 1,000 keys: per SST at most one GET of partitions and one of blocks
      per ``scan_read_ahead_bytes`` of them, where 1,000 gets cost about 2,000;
    * a full scan: per SST its open, a run of partitions, and read-ahead chunks growing from
      64 KiB to ``scan_read_ahead_bytes``.
    """
    backend = make_backend(name, request, tmp_path)  # type: ignore[arg-type]
    fields = msgspec.structs.asdict(backend.settings)
    settings = Settings.from_dict({**fields, "disk_cache": "off"})
    n = 40_000
    with Db.open(backend.target(), settings=settings) as db:
        for first in range(0, n, 1000):
            batch = WriteBatch()
            for i in range(first, first + 1000):
                batch.put(key(i), b"v" * 100)
            db.write(batch)
    policy = CompactionPolicy(target_sst_bytes=1 << 20)
    Compactor(open_store(backend.url, settings), settings=settings, policy=policy).run_until_idle()
    rng = random.Random(11)

    def counts(db: Db) -> dict[str, int]:
        return {k: s.requests for k, s in db.metrics.snapshot().items()}

    with Db.open(backend.target(), settings=settings) as db:
        manifest = current(backend)
        run = manifest.sorted_runs[0].ssts
        assert not manifest.l0 and len(manifest.sorted_runs) == 1 and len(run) >= 4
        db.metrics.reset()

        opened: set[int] = set()
        for i in rng.sample(range(n), 100):
            sst = next(s for s, h in enumerate(run) if h.first_key <= key(i) <= h.last_key)
            before = db.metrics.requests("get_range")
            assert db.get(key(i)) == b"v" * 100
            spent = db.metrics.requests("get_range") - before
            assert spent <= 2 + (sst not in opened), (i, spent)
            opened.add(sst)
            assert set(counts(db)) <= {"get_range"}
        db.metrics.reset()
        warm = rng.sample(range(n), 10)
        db.get_many([key(i) for i in warm])
        db.metrics.reset()
        assert db.get_many([key(i) for i in warm]) == [b"v" * 100] * 10
        assert counts(db) == {}

    read_ahead = settings.scan_read_ahead_bytes
    with Db.open(backend.target(), settings=settings) as db:
        db.metrics.reset()
        probes = [key(i) for i in rng.sample(range(n), 1000)]
        assert db.get_many(probes) == [b"v" * 100] * 1000
        per_sst = 1 + 1 + (1 + sum(h.object_size for h in run) // read_ahead)
        assert counts(db) == {"get_range": counts(db)["get_range"]}
        assert counts(db)["get_range"] <= len(run) * per_sst, counts(db)

    with Db.open(backend.target(), settings=settings) as db:
        db.metrics.reset()
        assert sum(1 for _ in db.scan()) == n
        growth = (read_ahead // (64 * 1024)).bit_length()  # 64 KiB, 128 KiB, ... doubling
        per_sst = 1 + 1 + growth
        assert set(counts(db)) == {"get_range"}
        assert counts(db)["get_range"] <= len(run) * per_sst, counts(db)
