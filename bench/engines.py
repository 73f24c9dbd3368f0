"""The engines behind one set of bulk operations, each driven the way its users drive it.

slatepy is synchronous: plain loops. SlateDB's Python package (``slatedb`` 0.17, a Rust core
behind asyncio bindings) is asynchronous: its operations run as ``async`` loops inside one
event loop, so neither engine pays for the other's calling convention. RocksDB through
``rocksdict`` (synchronous, a Rust binding over the C++ library) runs on the file store only.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from slatepy import Db, DbReader, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.store import ObjectStore, StoreMetrics, open_store

LAG_KEY = b"lag"
LAG_TIMEOUT = 20.0  # seconds a reader may take to see a write before it counts as unseen
LAG_BUDGET = 90.0  # seconds of lag measurement per engine, once 3 writes are measured


class SlatepyEngine:
    name = "slatepy"

    def __init__(self, url: str, settings: Settings) -> None:
        self.url, self.settings = url, settings
        self.store: ObjectStore = open_store(url, settings, create=True)
        self.db = Db.open(self.store, settings=settings)

    @property
    def metrics(self) -> StoreMetrics | None:
        return self.db.metrics

    def put_many(self, keys: Sequence[bytes], value: bytes) -> None:
        put = self.db.put  # looked up once, as the rocksdict loop does
        for key in keys:
            put(key, value, await_durable=False)
        self.db.flush()

    def batches(self, keys: Sequence[bytes], value: bytes, size: int, awaited: bool) -> None:
        for first in range(0, len(keys), size):
            batch = WriteBatch()
            for key in keys[first : first + size]:
                batch.put(key, value)
            self.db.write(batch, await_durable=awaited)
        if not awaited:
            self.db.flush()

    def durable_puts(self, keys: Sequence[bytes], value: bytes) -> list[float]:
        latencies = []
        for key in keys:
            start = time.perf_counter()
            self.db.put(key, value)
            latencies.append(time.perf_counter() - start)
        return latencies

    def get_many(self, keys: Sequence[bytes]) -> int:
        return sum(self.db.get(key) is not None for key in keys)

    def get_batches(self, keys: Sequence[bytes], size: int) -> int:
        """Batched gets, ``size`` keys a call (``Db.get_many``)."""
        get_many = self.db.get_many
        return sum(
            sum(v is not None for v in get_many(keys[first : first + size]))
            for first in range(0, len(keys), size)
        )

    def to_ssts(self) -> None:
        """Move everything written into SSTs and drop it from memory: the writer would keep
        recent writes in its memtable (``memtable_retain_bytes``), so it is reopened."""
        Compactor(self.store, settings=self.settings).run_until_idle()
        self.db.close()
        self.db = Db.open(self.store, settings=self.settings)

    def scan_all(self) -> int:
        return sum(1 for _ in self.db.scan())

    def reopen(self) -> None:
        """Close the writer and open a new one on the same store, as a restarted service
        does (issue 33: reads must not depend on where compaction was when it closed)."""
        self.db.close()
        self.db = Db.open(self.store, settings=self.settings)

    def mixed(self, keys: Sequence[bytes], value: bytes, ops: int, threads: int) -> None:
        def work(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(ops // threads):
                key = rng.choice(keys)
                if rng.random() < 0.8:
                    self.db.get(key)
                else:
                    self.db.put(key, value, await_durable=False)

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        self.db.flush()

    def concurrent_durable_puts(
        self, keys: Sequence[bytes], value: bytes, writers: int
    ) -> list[float]:
        """``writers`` threads, each putting its share of ``keys`` and awaiting durability
        (their puts share WAL writes: group commit). Latency of every put."""
        latencies: list[float] = []
        lock = threading.Lock()

        def work(mine: Sequence[bytes]) -> None:
            for key in mine:
                start = time.perf_counter()
                self.db.put(key, value)
                elapsed = time.perf_counter() - start
                with lock:
                    latencies.append(elapsed)

        threads = [threading.Thread(target=work, args=(keys[w::writers],)) for w in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return latencies

    def reader_lag(self, writes: int, timeout: float = LAG_TIMEOUT) -> list[float]:
        """Seconds from a durable put's return until a reader in this process, polling
        ``get`` every millisecond, sees it; one write at a time (a write not seen within
        ``timeout`` is left out)."""
        seen: dict[bytes, float] = {}
        stop = threading.Event()
        with self._cold_reader() as reader:

            def poll() -> None:
                while not stop.is_set():
                    value = reader.get(LAG_KEY)
                    if value is not None and value not in seen:
                        seen[value] = time.perf_counter()
                    time.sleep(0.001)

            poller = threading.Thread(target=poll, daemon=True)
            poller.start()
            try:
                return _lag_writes(writes, timeout, seen, self.db.put)
            finally:
                stop.set()
                poller.join(10)

    def _cold_reader(self, **overrides: object) -> DbReader:
        """A new reader with nothing cached in memory, nor on disk unless ``overrides`` say."""
        fields = {f: getattr(self.settings, f) for f in self.settings.__struct_fields__}
        cold = Settings.from_dict({**fields, "disk_cache": "off", **overrides})
        return DbReader.open(self.store, settings=cold)

    def fresh_reader_gets(self, keys: Sequence[bytes]) -> tuple[int, dict[str, int]]:
        with self._cold_reader() as reader:
            reader.metrics.reset()
            found = sum(reader.get(key) is not None for key in keys)
            return found, {k: v.requests for k, v in reader.metrics.snapshot().items()}

    def fresh_reader_batched_gets(
        self, keys: Sequence[bytes], batch: int = 1000
    ) -> tuple[int, dict[str, int]]:
        """``get_many`` in batches of ``batch`` keys from a new, cold reader."""
        with self._cold_reader() as reader:
            reader.metrics.reset()
            found = 0
            for first in range(0, len(keys), batch):
                found += sum(v is not None for v in reader.get_many(keys[first : first + batch]))
            return found, {k: v.requests for k, v in reader.metrics.snapshot().items()}

    def fresh_reader_scan(self) -> tuple[int, int, float]:
        """A full scan by a new, cold reader: ``(rows, bytes read from the store, seconds)``,
        the time being the scan's alone (the reader's open is not counted)."""
        with self._cold_reader() as reader:
            reader.metrics.reset()
            start = time.perf_counter()
            rows = sum(1 for _ in reader.scan())
            elapsed = time.perf_counter() - start
            return rows, sum(v.bytes_in for v in reader.metrics.snapshot().values()), elapsed

    def restarted_reader_gets(self, keys: Sequence[bytes], cache_dir: str) -> list[float]:
        """gets/s of a reader with an empty disk cache, then of a new reader (a restarted
        process) on the cache the first one filled."""
        rates = []
        for _ in range(2):
            with self._cold_reader(disk_cache="on", disk_cache_dir=cache_dir) as reader:
                start = time.perf_counter()
                found = sum(reader.get(key) is not None for key in keys)
                rates.append(len(keys) / (time.perf_counter() - start))
                assert found == len(keys), found
        return rates

    def close(self) -> None:
        self.db.close()


class SlatedbEngine:
    name = "slatedb"
    metrics = None  # its object store is inside the Rust core: counted only at the proxy

    def __init__(self, url: str, settings: Settings) -> None:
        from slatedb.uniffi import DbBuilder, ObjectStore

        self.loop = asyncio.new_event_loop()
        # SlateDB resolves the store root from the URL and takes the path separately.
        parts = urlsplit(url)
        self._path = parts.path.strip("/") or "db"
        self._store = ObjectStore.resolve(f"{parts.scheme}://{parts.netloc}/")
        self.db: Any = self._run(DbBuilder(self._path, self._store).build())

    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def put_many(self, keys: Sequence[bytes], value: bytes) -> None:
        async def go() -> None:
            for key in keys:
                await self.db.put(key, value)
            await self.db.flush()

        self._run(go())

    def batches(self, keys: Sequence[bytes], value: bytes, size: int, awaited: bool) -> None:
        from slatedb.uniffi import WriteBatch as SdbBatch

        async def go() -> None:
            for first in range(0, len(keys), size):
                batch = SdbBatch()
                for key in keys[first : first + size]:
                    batch.put(key, value)
                handle = await self.db.write(batch)
                if awaited:
                    await handle.await_durable()
            if not awaited:
                await self.db.flush()

        self._run(go())

    def durable_puts(self, keys: Sequence[bytes], value: bytes) -> list[float]:
        async def go() -> list[float]:
            latencies = []
            for key in keys:
                start = time.perf_counter()
                handle = await self.db.put(key, value)
                await handle.await_durable()
                latencies.append(time.perf_counter() - start)
            return latencies

        result: list[float] = self._run(go())
        return result

    def get_many(self, keys: Sequence[bytes]) -> int:
        async def go() -> int:
            return sum([await self.db.get(key) is not None for key in keys])

        result: int = self._run(go())
        return result

    def reopen(self) -> None:
        from slatedb.uniffi import DbBuilder

        self._run(self.db.shutdown())
        self.db = self._run(DbBuilder(self._path, self._store).build())

    def to_ssts(self) -> None:
        from slatedb.uniffi import FlushOptions, FlushType

        self._run(self.db.flush_with_options(FlushOptions(flush_type=FlushType.MEM_TABLE)))

    def scan_all(self) -> int:
        from slatedb.uniffi import KeyRange

        async def go() -> int:
            it = await self.db.scan(
                KeyRange(start=None, start_inclusive=True, end=None, end_inclusive=False)
            )
            count = 0
            while rows := await it.next_batch(1000):
                count += len(rows)
            return count

        result: int = self._run(go())
        return result

    def mixed(self, keys: Sequence[bytes], value: bytes, ops: int, threads: int) -> None:
        async def work(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(ops // threads):
                key = rng.choice(keys)
                if rng.random() < 0.8:
                    await self.db.get(key)
                else:
                    await self.db.put(key, value)

        async def go() -> None:
            await asyncio.gather(*(work(t) for t in range(threads)))
            await self.db.flush()

        self._run(go())

    def concurrent_durable_puts(
        self, keys: Sequence[bytes], value: bytes, writers: int
    ) -> list[float]:
        """``writers`` tasks, each putting its share of ``keys`` and awaiting durability."""
        latencies: list[float] = []

        async def work(mine: Sequence[bytes]) -> None:
            for key in mine:
                start = time.perf_counter()
                handle = await self.db.put(key, value)
                await handle.await_durable()
                latencies.append(time.perf_counter() - start)

        async def go() -> None:
            await asyncio.gather(*(work(keys[w::writers]) for w in range(writers)))

        self._run(go())
        return latencies

    def reader_lag(self, writes: int, timeout: float = LAG_TIMEOUT) -> list[float]:
        """As :meth:`SlatepyEngine.reader_lag`, with a ``DbReader`` (default options) polled
        by a task in the same event loop."""
        from slatedb.uniffi import DbReaderBuilder

        seen: dict[bytes, float] = {}

        async def go() -> list[float]:
            reader = await DbReaderBuilder(self._path, self._store).build()
            stop = asyncio.Event()

            async def poll() -> None:
                while not stop.is_set():
                    value = await reader.get(LAG_KEY)
                    if value is not None and value not in seen:
                        seen[value] = time.perf_counter()
                    await asyncio.sleep(0.001)

            async def put(key: bytes, value: bytes) -> None:
                handle = await self.db.put(key, value)
                await handle.await_durable()

            poller = asyncio.create_task(poll())
            try:
                return await _lag_writes_async(writes, timeout, seen, put)
            finally:
                stop.set()
                await poller
                await reader.shutdown()

        result: list[float] = self._run(go())
        return result

    def fresh_reader_gets(self, keys: Sequence[bytes]) -> tuple[int, dict[str, int]]:
        from slatedb.uniffi import DbReaderBuilder

        async def go() -> int:
            reader = await DbReaderBuilder(self._path, self._store).build()
            found = sum([await reader.get(key) is not None for key in keys])
            await reader.shutdown()
            return found

        return self._run(go()), {}

    def fresh_reader_scan(self) -> tuple[int, int, float]:
        """A full scan by a new reader: ``(rows, 0, seconds)`` (its client does not count
        bytes; the time is the scan's alone)."""
        from slatedb.uniffi import DbReaderBuilder, KeyRange

        async def go() -> tuple[int, float]:
            reader = await DbReaderBuilder(self._path, self._store).build()
            start = time.perf_counter()
            it = await reader.scan(
                KeyRange(start=None, start_inclusive=True, end=None, end_inclusive=False)
            )
            count = 0
            while rows := await it.next_batch(1000):
                count += len(rows)
            elapsed = time.perf_counter() - start
            await reader.shutdown()
            return count, elapsed

        rows, elapsed = self._run(go())
        return rows, 0, elapsed

    def close(self) -> None:
        self._run(self.db.shutdown())
        self.loop.close()


class RocksdictEngine:
    """RocksDB through ``rocksdict`` (0.3), on a local directory, with its default options.

    A write that "awaits durability" is one with ``WriteOptions.sync`` (the WAL fsynced
    before it returns); unawaited puts use the default write options (WAL written, not
    synced) and end with one synced WAL flush, as slatepy's end with ``flush``. Only the
    file store applies: RocksDB does not run on object storage."""

    name = "rocksdict"
    metrics = None  # no object store: nothing to count

    def __init__(self, url: str, settings: Settings) -> None:
        from rocksdict import Rdict, WriteOptions

        parts = urlsplit(url)
        if parts.scheme != "file":
            raise SystemExit(f"rocksdict runs on the file store only, not {parts.scheme!r}")
        self.path = parts.path
        self.db: Any = Rdict(self.path)
        self._sync: Any = WriteOptions()
        self._sync.sync = True

    def put_many(self, keys: Sequence[bytes], value: bytes) -> None:
        put = self.db.put
        for key in keys:
            put(key, value)
        self.db.flush_wal(True)

    def batches(self, keys: Sequence[bytes], value: bytes, size: int, awaited: bool) -> None:
        from rocksdict import WriteBatch as RocksBatch

        for first in range(0, len(keys), size):
            batch = RocksBatch()
            for key in keys[first : first + size]:
                batch.put(key, value)
            if awaited:
                self.db.write(batch, self._sync)
            else:
                self.db.write(batch)  # the default options: the WAL written, not synced
        if not awaited:
            self.db.flush_wal(True)

    def durable_puts(self, keys: Sequence[bytes], value: bytes) -> list[float]:
        latencies = []
        for key in keys:
            start = time.perf_counter()
            self.db.put(key, value, self._sync)
            latencies.append(time.perf_counter() - start)
        return latencies

    def get_many(self, keys: Sequence[bytes]) -> int:
        get = self.db.get
        return sum(get(key) is not None for key in keys)

    def get_batches(self, keys: Sequence[bytes], size: int) -> int:
        """Batched gets, ``size`` keys a call (``Rdict[list]``, RocksDB's multi-get)."""
        db = self.db
        return sum(
            sum(v is not None for v in db[list(keys[first : first + size])])
            for first in range(0, len(keys), size)
        )

    def to_ssts(self) -> None:
        """Flush the memtable to an SST and compact everything into the last level."""
        self.db.flush(True)
        self.db.compact_range(None, None)

    def scan_all(self) -> int:
        return sum(1 for _ in self.db.items())

    def reopen(self) -> None:
        from rocksdict import Rdict

        self.db.close()
        self.db = Rdict(self.path)

    def mixed(self, keys: Sequence[bytes], value: bytes, ops: int, threads: int) -> None:
        def work(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(ops // threads):
                key = rng.choice(keys)
                if rng.random() < 0.8:
                    self.db.get(key)
                else:
                    self.db.put(key, value)

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        self.db.flush_wal(True)

    def concurrent_durable_puts(
        self, keys: Sequence[bytes], value: bytes, writers: int
    ) -> list[float]:
        """``writers`` threads, each putting its share of ``keys`` with a synced WAL."""
        latencies: list[float] = []
        lock = threading.Lock()

        def work(mine: Sequence[bytes]) -> None:
            for key in mine:
                start = time.perf_counter()
                self.db.put(key, value, self._sync)
                elapsed = time.perf_counter() - start
                with lock:
                    latencies.append(elapsed)

        threads = [threading.Thread(target=work, args=(keys[w::writers],)) for w in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return latencies

    def _reader(self) -> Any:
        """A read-only instance opened now on the same directory (its own caches, cold)."""
        from rocksdict import AccessType, Rdict

        return Rdict(self.path, access_type=AccessType.read_only())

    def fresh_reader_gets(self, keys: Sequence[bytes]) -> tuple[int, dict[str, int]]:
        reader = self._reader()
        try:
            return sum(reader.get(key) is not None for key in keys), {}
        finally:
            reader.close()

    def fresh_reader_scan(self) -> tuple[int, int, float]:
        """A full scan by a new read-only instance: ``(rows, 0, seconds)``."""
        reader = self._reader()
        try:
            start = time.perf_counter()
            rows = sum(1 for _ in reader.items())
            return rows, 0, time.perf_counter() - start
        finally:
            reader.close()

    def close(self) -> None:
        self.db.close()


ENGINES: dict[str, Any] = {
    "slatepy": SlatepyEngine,
    "slatedb": SlatedbEngine,
    "rocksdict": RocksdictEngine,
}


def _lag_writes(
    writes: int,
    timeout: float,
    seen: dict[bytes, float],
    put: Callable[[bytes, bytes], object],
) -> list[float]:
    """Put up to ``writes`` values of :data:`LAG_KEY` one at a time, each after the reader
    saw the one before (or ``timeout`` passed); the lag of each, NaN if never seen.

    The pause before the next write is random, up to the lag just seen (at least 100 ms),
    so that writes fall at random points of the reader's polling cycle rather than just
    after a poll. Stops early after :data:`LAG_BUDGET` seconds (a reader polling every
    10 s would otherwise take minutes)."""
    rng = random.Random(3)
    lags: list[float] = []
    stop_at = time.perf_counter() + LAG_BUDGET
    for i in range(writes):
        if i >= 3 and time.perf_counter() > stop_at:
            break
        value = b"%d" % i
        put(LAG_KEY, value)
        acked = time.perf_counter()
        deadline = acked + timeout
        while value not in seen and time.perf_counter() < deadline:
            time.sleep(0.001)
        lags.append(seen[value] - acked if value in seen else float("nan"))
        time.sleep(rng.uniform(0, min(timeout, max(0.1, lags[-1]))))
    return lags


async def _lag_writes_async(
    writes: int,
    timeout: float,
    seen: dict[bytes, float],
    put: Callable[[bytes, bytes], Awaitable[None]],
) -> list[float]:
    """:func:`_lag_writes` for an asynchronous ``put``."""
    rng = random.Random(3)
    lags: list[float] = []
    stop_at = time.perf_counter() + LAG_BUDGET
    for i in range(writes):
        if i >= 3 and time.perf_counter() > stop_at:
            break
        value = b"%d" % i
        await put(LAG_KEY, value)
        acked = time.perf_counter()
        deadline = acked + timeout
        while value not in seen and time.perf_counter() < deadline:
            await asyncio.sleep(0.001)
        lags.append(seen[value] - acked if value in seen else float("nan"))
        await asyncio.sleep(rng.uniform(0, min(timeout, max(0.1, lags[-1]))))
    return lags


def median_ms(latencies: list[float]) -> float:
    return statistics.median(latencies) * 1e3


def p99_ms(latencies: list[float]) -> float:
    return sorted(latencies)[max(0, int(len(latencies) * 0.99) - 1)] * 1e3
