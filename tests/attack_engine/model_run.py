"""A seeded model-based run over one ``file://`` database: puts, TTL'd puts, deletes, range
deletes, merges and mixed batches on a few keys, with the clock, flushes, compactions (to L0
and to a sorted run), reopens and GC between them; every read form (get, get_many, bounded
scans forward and reverse with limits, prefix scans, iterators with seek, snapshots,
transactions, a ``DbReader``, a checkpoint reader, an iterator held across compaction and
GC) is compared with a dict model after each step."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from slatepy import Db, DbReader, Settings, WriteBatch
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.config import MAX_KEY_SIZE
from slatepy.engine.clone import clone
from slatepy.engine.reader import ReadSnapshot
from slatepy.engine.snapshot import Snapshot
from slatepy.format.kinds import Operands
from slatepy.gc import GarbageCollector
from slatepy.store.base import ObjectStore
from slatepy.store.url import open_store

SETTINGS = Settings(flush_interval=60, compactor="off", gc_min_age=3600)
TO_RUN = CompactionPolicy(l0_trigger=1, target_sst_bytes=512)
TO_L0 = CompactionPolicy(l0_trigger=1000, target_sst_bytes=512)

# Keys with prefix relations, 0xff bytes (prefix scans' upper bounds) and one of the
# largest size a key may have.
KEYS = [
    b"a",
    b"ab",
    b"abc",
    b"b",
    b"b\xff",
    b"b\xff\xff",
    b"c\x00",
    b"c",
    b"m1",
    b"m2",
    b"z" * MAX_KEY_SIZE,
]
KEYS.sort()
BOUNDS = [b"", b"a", b"aa", b"ab", b"b", b"b\xff", b"c", b"c\x00", b"m", b"m2", b"z", b"\xff"]
PREFIXES = [b"a", b"ab", b"b", b"b\xff", b"c", b"m", b"z"]

Entry = tuple[bytes, int | None]  # a value and the ms it expires at (None: never)


def concat(key: bytes, existing: bytes | None, operands: list[bytes]) -> bytes:
    return b",".join([existing, *operands] if existing is not None else operands)


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def visible(model: dict[bytes, Entry], now: float) -> dict[bytes, bytes]:
    ms = int(now * 1000)
    return {k: v for k, (v, exp) in sorted(model.items()) if exp is None or ms < exp}


@dataclass
class Run:
    """One seeded run; :meth:`step` does one random operation and checks every read."""

    url: str
    seed: int
    settings: Settings = SETTINGS
    rng: random.Random = field(init=False)
    clock: Clock = field(default_factory=Clock)
    model: dict[bytes, Entry] = field(default_factory=dict)
    snapshots: list[tuple[Snapshot | ReadSnapshot, dict[bytes, bytes]]] = field(
        default_factory=list
    )
    checkpoints: list[tuple[str, dict[bytes, Entry]]] = field(default_factory=list)
    reader: DbReader | None = None
    counter: int = 0
    clones: int = 0
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.store: ObjectStore = open_store(self.url, self.settings, create=True)
        self.db = self.open()

    def open(self) -> Db:
        return Db.open(self.url, settings=self.settings, clock=self.clock, merge_operator=concat)

    # -- the model ---------------------------------------------------------------------

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def live(self, key: bytes) -> bytes | None:
        entry = self.model.get(key)
        if entry is None or (entry[1] is not None and self.now_ms() >= entry[1]):
            return None
        return entry[0]

    def mergeable(self, key: bytes) -> bool:
        """Not over a live TTL'd value: RFC 0019 leaves that undetermined."""
        entry = self.model.get(key)
        return entry is None or entry[1] is None or self.now_ms() >= entry[1]

    def value(self) -> bytes:
        self.counter += 1
        return b"v%d" % self.counter

    # -- writes ------------------------------------------------------------------------

    def batch(self) -> None:
        batch, n = WriteBatch(), self.rng.randint(1, 4)
        model = dict(self.model)
        ops: list[str] = []
        for _ in range(n):
            kind = self.rng.choice(["put", "ttl", "delete", "range", "merge"])
            key = self.rng.choice(KEYS)
            if kind == "put":
                value = self.value()
                batch.put(key, value)
                model[key] = (value, None)
            elif kind == "ttl":
                value, ttl = self.value(), self.rng.choice([0.5, 1, 2])
                batch.put(key, value, ttl=ttl)
                model[key] = (value, self.now_ms() + math.ceil(ttl * 1000))
            elif kind == "delete":
                batch.delete(key)
                model.pop(key, None)
            elif kind == "range":
                lo, hi = sorted(self.rng.sample(BOUNDS[1:], 2))
                batch.delete_range(lo, hi)
                for k in [k for k in model if lo <= k < hi]:
                    del model[k]
                key = lo + b".." + hi
            else:
                entry = model.get(key)
                if entry is not None and entry[1] is not None:
                    continue  # RFC 0019: merges over TTL'd values are undetermined
                operand = self.value()
                batch.merge(key, operand)
                model[key] = (concat(key, None if entry is None else entry[0], [operand]), None)
            ops.append(f"{kind} {key[:8]!r}")
        if not len(batch):
            return
        self.log.append(f"batch {ops}")
        if len(batch) == 1 and self.rng.random() < 0.5:
            self._single(batch, model)
        else:
            self.db.write(batch)
        self.model = model

    def _single(self, batch: WriteBatch, model: dict[bytes, Entry]) -> None:
        """The one-op batch through the single-op call."""
        if batch.ranges:
            self.db.delete_range(*batch.ranges[0])
            return
        ((key, value),) = batch.ops
        if value is None:
            self.db.delete(key)
        elif value.__class__ is not bytes:
            (operand,) = Operands(value).operands()
            self.db.merge(key, operand)
        else:
            entry = model[key]
            if entry[1] is not None:  # the TTL again, from the expiry the model recorded
                self.db.put(key, value, ttl=(entry[1] - self.now_ms() - 0.5) / 1000)
            else:
                self.db.put(key, value)

    def tick(self) -> None:
        self.clock.now += self.rng.choice([0.3, 0.7, 1.3])
        self.log.append("tick")

    def flush(self) -> None:
        self.db.flush()
        self.log.append("flush")

    def compact(self) -> None:
        policy = self.rng.choice([TO_RUN, TO_L0])
        self.db.flush()
        Compactor(
            self.store,
            settings=self.settings,
            policy=policy,
            merge_operator=concat,
            expiry_clock=self.clock,
        ).run_until_idle()
        self.db.refresh()
        self.log.append(f"compact {'run' if policy is TO_RUN else 'l0'}")

    def gc(self) -> None:
        GarbageCollector(self.store, settings=self.settings, min_age=0).collect()
        self.log.append("gc")

    def reopen(self) -> None:
        self.db.close()
        self.db = self.open()
        self.log.append("reopen")

    # -- reads -------------------------------------------------------------------------

    def check(self) -> None:
        want = visible(self.model, self.clock())
        db = self.db
        where = f"seed {self.seed} after {self.log[-6:]}"
        got = dict(db.scan())
        assert got == want, f"scan {where}: {got} != {want}"
        assert db.get_many(KEYS) == [want.get(k) for k in KEYS], f"get_many {where}"
        expiring = [(k, v, self.model[k][1]) for k, v in want.items()]
        assert list(db.items_with_expiry()) == expiring, f"items_with_expiry {where}"
        for key in self.rng.sample(KEYS, 3):
            assert db.get(key) == want.get(key), f"get {key[:8]!r} {where}"
            kv = db.get_key_value(key)
            assert (None if kv is None else kv.value) == want.get(key), f"kv {key[:8]!r} {where}"
        lo, hi = sorted(self.rng.sample(BOUNDS, 2))
        end = None if hi == b"\xff" and self.rng.random() < 0.5 else hi
        rows = [(k, v) for k, v in want.items() if lo <= k and (end is None or k < end)]
        limit = self.rng.choice([None, 0, 1, 2, 5])
        for reverse in (False, True):
            expect = rows[::-1] if reverse else rows
            expect = expect if limit is None else expect[:limit]
            got_rows = list(db.scan(lo, end, reverse=reverse, limit=limit))
            assert got_rows == expect, f"scan({lo!r}, {end!r}, {reverse}, {limit}) {where}"
        prefix = self.rng.choice(PREFIXES)
        assert list(db.scan_prefix(prefix)) == [
            (k, v) for k, v in want.items() if k.startswith(prefix)
        ], f"scan_prefix({prefix!r}) {where}"
        reverse = self.rng.random() < 0.5
        it = db.iter(lo, end, reverse=reverse)
        probe = self.rng.choice(BOUNDS[1:])
        it.seek(probe)
        if reverse:
            seek_want = [r for r in rows[::-1] if r[0] <= probe]
        else:
            seek_want = [r for r in rows if r[0] >= probe]
        assert list(it) == seek_want, f"iter({lo!r}, {end!r}, {reverse}).seek({probe!r}) {where}"
        batches = [r for b in db.scan_batches(lo, end, batch_size=2) for r in b]
        assert batches == rows, f"scan_batches {where}"

    def check_views(self) -> None:
        where = f"seed {self.seed} after {self.log[-6:]}"
        for snapshot, want in self.snapshots:
            assert dict(snapshot.scan()) == want, f"snapshot {snapshot.seq} {where}"
            assert snapshot.get_many(KEYS) == [want.get(k) for k in KEYS], f"snap gm {where}"
            assert list(snapshot.scan(reverse=True)) == sorted(want.items(), reverse=True)
        for checkpoint, model in self.checkpoints:
            with DbReader.open(
                self.url,
                settings=self.settings,
                checkpoint=checkpoint,
                clock=self.clock,
                merge_operator=concat,
            ) as reader:
                want = visible(model, self.clock())
                assert dict(reader.scan()) == want, f"checkpoint {checkpoint} {where}"
                assert reader.get_many(KEYS) == [want.get(k) for k in KEYS]

    def snapshot(self) -> None:
        if len(self.snapshots) >= 2:
            snapshot, _ = self.snapshots.pop(0)
            snapshot.close()
        snapshot = self.db.snapshot()
        self.snapshots.append((snapshot, visible(self.model, self.clock())))
        self.log.append("snapshot")

    def reader_snapshot(self) -> None:
        """A snapshot of the reader (which pins its own manifest), held like the writer's."""
        self.read_reader()
        assert self.reader is not None
        if len(self.snapshots) >= 3:
            snapshot, _ = self.snapshots.pop(0)
            snapshot.close()
        self.snapshots.append((self.reader.snapshot(), visible(self.model, self.clock())))
        self.log.append("reader snapshot")

    def clone(self) -> None:
        """A clone of the durable state now, opened as a writer of its own."""
        self.clones += 1
        target = f"{self.url}-clone{self.clones}"
        clone(self.url, target, settings=self.settings)
        model = dict(self.model)
        with Db.open(target, settings=self.settings, clock=self.clock, merge_operator=concat) as db:
            want = visible(model, self.clock())
            assert dict(db.scan()) == want, f"clone seed {self.seed} after {self.log[-6:]}"
            assert db.get_many(KEYS) == [want.get(k) for k in KEYS]
            db.merge(b"m1", b"clone")  # the clone's writes are its own
        self.log.append("clone")

    def checkpoint(self) -> None:
        if len(self.checkpoints) >= 2:
            old, _ = self.checkpoints.pop(0)
            self.db.delete_checkpoint(old)
        checkpoint = self.db.create_checkpoint()
        self.checkpoints.append((checkpoint.id, dict(self.model)))
        self.log.append("checkpoint")

    def read_reader(self) -> None:
        if self.reader is None:
            self.reader = DbReader.open(
                self.url, settings=self.settings, clock=self.clock, merge_operator=concat
            )
        else:
            self.reader.refresh()
        want = visible(self.model, self.clock())
        where = f"seed {self.seed} after {self.log[-6:]}"
        assert dict(self.reader.scan()) == want, f"reader scan {where}"
        assert self.reader.get_many(KEYS) == [want.get(k) for k in KEYS], f"reader gm {where}"
        key = self.rng.choice(KEYS)
        assert self.reader.get(key) == want.get(key), f"reader get {key[:8]!r} {where}"
        self.log.append("reader")

    def transaction(self) -> None:
        isolation = self.rng.choice(["snapshot", "serializable"])
        want = visible(self.model, self.clock())
        where = f"seed {self.seed} after {self.log[-6:]}"
        txn = self.db.begin(isolation)  # type: ignore[arg-type]
        keys = self.rng.sample(KEYS, 3)
        for key in keys:
            assert txn.get(key) == want.get(key), f"txn get {key[:8]!r} {where}"
        lo, hi = sorted(self.rng.sample(BOUNDS, 2))
        rows = [(k, v) for k, v in want.items() if lo <= k < hi]
        assert list(txn.scan(lo, hi)) == rows, f"txn scan {where}"
        assert list(txn.scan(lo, hi, reverse=True)) == rows[::-1], f"txn rscan {where}"
        # Its own writes laid over its reads: bounded, reverse and limited scans.
        mine: dict[bytes, bytes | None] = {}
        for key in self.rng.sample(KEYS, 3):
            mine[key] = None if self.rng.random() < 0.4 else self.value()
            if mine[key] is None:
                txn.delete(key)
            else:
                txn.put(key, mine[key])  # type: ignore[arg-type]
        seen = {**want, **mine}
        over = {k: v for k, v in sorted(seen.items()) if v is not None}
        for key in KEYS:
            assert txn.get(key) == over.get(key), f"txn own get {key[:8]!r} {where}"
        lo, hi = sorted(self.rng.sample(BOUNDS, 2))
        rows = [(k, v) for k, v in over.items() if lo <= k < hi]
        limit = self.rng.choice([None, 1, 2])
        for reverse in (False, True):
            expect = rows[::-1] if reverse else rows
            expect = expect if limit is None else expect[:limit]
            got = list(txn.scan(lo, hi, reverse=reverse, limit=limit))
            assert got == expect, f"txn own scan({lo!r}, {hi!r}, {reverse}, {limit}) {where}"
        txn.commit()
        for key, mine_value in mine.items():
            if mine_value is None:
                self.model.pop(key, None)
            else:
                self.model[key] = (mine_value, None)
        self.log.append(f"txn {isolation} {sorted(k[:4] for k in mine)}")

    def held_iterator(self) -> None:
        """An iterator taken now, read after a compaction and a GC pass."""
        want = visible(self.model, self.clock())
        reverse = self.rng.random() < 0.5
        it = self.db.iter(reverse=reverse)
        first = next(it, None)
        self.batch()
        self.compact()
        self.gc()
        rest = list(it)
        rows = sorted(want.items(), reverse=reverse)
        got = ([] if first is None else [first]) + rest
        assert got == rows, f"held iterator seed {self.seed} after {self.log[-6:]}"

    def step(self) -> None:
        ops: list[tuple[Callable[[], None], int]] = [
            (self.batch, 30),
            (self.tick, 8),
            (self.flush, 4),
            (self.compact, 6),
            (self.gc, 3),
            (self.reopen, 3),
            (self.snapshot, 3),
            (self.checkpoint, 2),
            (self.read_reader, 4),
            (self.transaction, 4),
            (self.held_iterator, 2),
            (self.reader_snapshot, 2),
            (self.clone, 1),
        ]
        op = self.rng.choices([o for o, _ in ops], [w for _, w in ops])[0]
        op()
        self.check()
        if self.rng.random() < 0.2:
            self.check_views()

    def close(self) -> None:
        for snapshot, _ in self.snapshots:
            snapshot.close()
        if self.reader is not None:
            self.reader.close()
        self.db.close()


def run(url: str, seed: int, steps: int, seconds: float, settings: Settings = SETTINGS) -> int:
    """``steps`` steps of seed ``seed``, stopping early after ``seconds``; returns steps run."""
    state = Run(url, seed, settings)
    deadline = time.monotonic() + seconds
    done = 0
    try:
        while done < steps and time.monotonic() < deadline:
            state.step()
            done += 1
        state.check_views()
    finally:
        state.close()
    return done
