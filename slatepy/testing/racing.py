"""Several writers and readers at once over a store that fails and delays requests.

Where :mod:`slatepy.testing.torture` drives one actor at a time, this harness runs rounds in
which two or three writers race to open the same database (each with its own
``max_parallel_writes``), write durable puts until they are fenced, and some are killed at a
chosen request (their store stops answering mid-protocol, as if the process died: during
the epoch bump, fencing, replay or a WAL PUT), while readers poll. Every store request may be
delayed, refused, time out, or act and lose its reply.

Values are ``b"<writer>=<counter>"`` with one global counter taken *before* a write is
issued. A write acknowledged by a writer lands below the fence of any writer that opens
after it, so for each key the newest acknowledged counter is a floor: nothing may read an
older value afterwards. Checked:

* during a round, each reader's view of a key never goes back to a smaller counter and a
  key it has seen never vanishes;
* after each round, with faults off, a fresh writer reads every key at or above its newest
  acknowledged counter, with a value somebody wrote, and a fresh reader agrees with it;
* along the WAL, no SST of an older epoch lies past the fence of a writer that completed
  start-up (the seed's fencing guarantee). Epochs may still decrease below a fence: a
  writer killed after skipping ahead leaves its SST above free slots that the next writer
  fills with its own (newer) failed fence attempts (RFC 0008).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import msgspec

from slatepy.config import Settings
from slatepy.engine.db import Db
from slatepy.engine.reader import DbReader
from slatepy.errors import FencedError, SlatepyError, StoreUnavailable
from slatepy.format.sst import decode_sst
from slatepy.store.base import ObjectMeta, ObjectStore, PutData, PutMode, WrappingStore
from slatepy.store.numbered import NumberedObjects
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX
from slatepy.testing.faults import FaultyStore, uniform
from slatepy.testing.torture import Violation

KEYS = [b"key%02d" % i for i in range(12)]


class Killed(StoreUnavailable):
    """Every request of a killed actor's store fails like this, without acting.

    To the store a dead process and a process whose requests all fail without acting look
    the same: nothing it does lands any more. The actor then fails and is dropped.
    """


class KillableStore(WrappingStore):
    """``inner`` until the actor is killed, then dead for good.

    The kill comes at the ``kill_at``-th request (1-based; 0 never) or, with ``kill_after``
    a path prefix, right after the first PUT under it lands (``"manifest/"``: after the
    epoch bump, before any fencing SST; ``"wal/"``: after the first fencing SST).
    """

    def __init__(self, inner: ObjectStore, kill_at: int, kill_after: str | None = None) -> None:
        super().__init__(inner)
        self.kill_at = kill_at
        self.kill_after = kill_after
        self.requests = 0
        self.dead = False
        self._lock = threading.Lock()

    def _tick(self) -> None:
        with self._lock:
            self.requests += 1
            self.dead |= bool(self.kill_at) and self.requests >= self.kill_at
            if self.dead:
                raise Killed("killed", definite=True)

    def get(self, path: str) -> bytes:
        self._tick()
        return self.inner.get(path)

    def get_range(self, path: str, start: int, end: int) -> bytes:
        self._tick()
        return self.inner.get_range(path, start, end)

    def get_suffix(self, path: str, length: int) -> bytes:
        self._tick()
        return self.inner.get_suffix(path, length)

    def head(self, path: str) -> ObjectMeta:
        self._tick()
        return self.inner.head(path)

    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> str | None:
        self._tick()
        result = self.inner.put(path, data, mode=mode)
        if self.kill_after is not None and path.startswith(self.kill_after):
            with self._lock:
                self.dead = True
        return result

    def delete(self, path: str) -> None:
        self._tick()
        self.inner.delete(path)

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        self._tick()
        return self.inner.list(prefix, offset=offset)


@dataclass
class Ledger:
    """What was written and acknowledged, shared by every actor (under ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    counter: int = 0
    written: dict[bytes, set[int]] = field(default_factory=dict)
    acked: dict[bytes, int] = field(default_factory=dict)
    # epoch -> last WAL id of its fence, for writers that completed start-up
    fences: dict[int, int] = field(default_factory=dict)
    stats: Counter[str] = field(default_factory=Counter)

    def issue(self, key: bytes) -> int:
        with self.lock:
            self.counter += 1
            self.written.setdefault(key, set()).add(self.counter)
            return self.counter

    def acknowledge(self, key: bytes, counter: int) -> None:
        with self.lock:
            self.acked[key] = max(self.acked.get(key, 0), counter)
            self.stats["acknowledged"] += 1

    def count(self, what: str) -> None:
        with self.lock:
            self.stats[what] += 1


def counter_of(value: bytes) -> int:
    return int(value.rsplit(b"=", 1)[1])


@dataclass
class RacingRounds:
    """Rounds of racing writers and polling readers over ``store`` (see the module doc)."""

    store: ObjectStore
    seed: int
    fault_rate: float = 0.05
    latency: float = 0.003
    round_seconds: float = 0.6
    widths: tuple[int, ...] = (1, 1, 2, 4)
    ledger: Ledger = field(default_factory=Ledger)
    _violations: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.faulty = FaultyStore(
            self.store, uniform(self.fault_rate), seed=self.seed, latency=self.latency
        )
        self.base = Settings(
            compactor="off",
            flush_interval=0.05,
            reader_poll_interval=3600.0,
            reader_gap_timeout=3600.0,
            wal_write_attempts=3,
            request_attempts=3,
        )

    def run(self, rounds: int) -> Counter[str]:
        for _ in range(rounds):
            self.round()
            self.verify()
        return self.ledger.stats

    # -- one round ---------------------------------------------------------------------
    def round(self) -> None:
        deadline = time.monotonic() + self.round_seconds
        threads = [
            threading.Thread(target=self._writer, args=(i, self.rng.random(), deadline))
            for i in range(self.rng.choice([2, 3]))
        ]
        threads += [
            threading.Thread(target=self._reader, args=(self.rng.random(), deadline))
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(self.round_seconds + 60)
            if thread.is_alive():
                raise Violation("an actor did not finish within a minute of its deadline")
        if self._violations:
            raise self._violations[0]

    def _writer(self, index: int, roll: float, deadline: float) -> None:
        rng = random.Random(roll)
        width = rng.choice(self.widths)
        # Most writers live; some die between start-up steps or at a random request.
        fate = rng.random()
        kill_at = rng.randrange(1, 40) if fate < 0.25 else 0
        kill_after = "manifest/" if fate > 0.85 else "wal/" if fate > 0.7 else None
        store = KillableStore(self.faulty, kill_at, kill_after)
        settings = msgspec.structs.replace(self.base, max_parallel_writes=width)
        db: Db | None = None
        try:
            time.sleep(rng.uniform(0, self.round_seconds / 2))
            db = Db.open(store, settings=settings)
            if store.dead:
                raise Killed("killed", definite=True)
            with self.ledger.lock:
                self.ledger.fences[db.epoch] = db.next_wal_id - 1
            self.ledger.count("opened")
            tag = b"w%d" % db.epoch
            opened = db
            # As many threads as PUTs the writer may have in flight, so they overlap; thread t
            # writes every width-th key from t.
            loops = [
                threading.Thread(
                    target=self._write_loop,
                    args=(opened, store, tag, KEYS[t::width]),
                    kwargs={"roll": rng.random(), "deadline": deadline},
                )
                for t in range(width)
            ]
            for loop in loops:
                loop.start()
            for loop in loops:
                loop.join(self.round_seconds + 60)
        except FencedError:
            self.ledger.count("fenced")
        except SlatepyError:
            self.ledger.count("killed" if store.dead else "failed")
        except Violation as exc:
            self._violations.append(exc)
        finally:
            if db is not None:
                db._crash()  # like a process that ends without flushing

    def _write_loop(
        self,
        db: Db,
        store: KillableStore,
        tag: bytes,
        keys: list[bytes],
        *,
        roll: float,
        deadline: float,
    ) -> None:
        """Durable puts of ``keys`` until ``deadline``; each key has one thread per writer, so
        its counters reach the WAL in the order they were taken."""
        rng = random.Random(roll)
        try:
            while time.monotonic() < deadline:
                key = rng.choice(keys)
                counter = self.ledger.issue(key)
                db.put(key, tag + b"=%d" % counter)
                self.ledger.acknowledge(key, counter)
        except FencedError:
            self.ledger.count("fenced")
        except SlatepyError:
            self.ledger.count("killed" if store.dead else "failed")

    def _reader(self, roll: float, deadline: float) -> None:
        rng = random.Random(roll)
        seen: dict[bytes, int] = {}
        reader: DbReader | None = None
        try:
            time.sleep(rng.uniform(0, 0.1))
            reader = DbReader.open(self.faulty, settings=self.base)
            self.ledger.count("reader opened")
            while time.monotonic() < deadline:
                try:
                    reader.refresh()
                except SlatepyError:
                    self.ledger.count("reader refresh failed")
                    continue
                for key in KEYS:
                    value = reader.get(key)
                    if value is None:
                        if key in seen:
                            raise Violation(f"reader: {key!r} vanished (was {seen[key]})")
                        continue
                    counter = counter_of(value)
                    if counter < seen.get(key, 0):
                        raise Violation(f"reader: {key!r} went back from {seen[key]} to {counter}")
                    seen[key] = counter
                time.sleep(rng.uniform(0, 0.02))
        except SlatepyError:
            self.ledger.count("reader failed")
        except Violation as exc:
            self._violations.append(exc)
        finally:
            if reader is not None:
                with contextlib.suppress(SlatepyError):
                    reader.close()

    # -- after a round -----------------------------------------------------------------
    def verify(self) -> None:
        """With faults off: a fresh writer and a fresh reader against the ledger and WAL."""
        self.faulty.enabled = False
        try:
            self._check_wal()
            with Db.open(self.faulty, settings=self.base) as db:
                rows = {key: db.get(key) for key in KEYS}
                with self.ledger.lock:
                    self.ledger.fences[db.epoch] = db.next_wal_id - 1
            for key, value in rows.items():
                floor = self.ledger.acked.get(key, 0)
                if value is None:
                    if floor:
                        raise Violation(f"acknowledged {key!r}={floor} is lost")
                    continue
                counter = counter_of(value)
                if counter < floor:
                    raise Violation(f"{key!r} reads {counter}, acknowledged {floor}")
                if counter not in self.ledger.written.get(key, set()):
                    raise Violation(f"{key!r} reads {counter}, which nobody wrote")
            reader = DbReader.open(self.faulty, settings=self.base)
            try:
                for key, value in rows.items():
                    if reader.get(key) != value:
                        raise Violation(f"a fresh reader disagrees on {key!r}")
            finally:
                reader.close()
        finally:
            self.faulty.enabled = True

    def _check_wal(self) -> None:
        wal = NumberedObjects(self.faulty, WAL_DIR, WAL_SUFFIX)
        epochs = {i: decode_sst(wal.read(i))[0].props.writer_epoch for i in wal.ids()}
        for epoch, fence_end in self.ledger.fences.items():
            older = [i for i, e in epochs.items() if i > fence_end and e < epoch]
            if older:
                raise Violation(
                    f"WAL SSTs {older} of older epochs lie past the fence of epoch {epoch} "
                    f"(ending at {fence_end})"
                )
