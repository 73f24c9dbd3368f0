"""The two-phase CAS through DynamoDB (moto over HTTP on 127.0.0.1): races, crashes after each
of the five steps with recovery, request accounting. The whole engine behaviour suite also runs
with ``cas="dynamodb"`` (the ``s3-dynamodb`` backend in ``tests/conftest.py``)."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import msgspec
import pytest

from slatepy import Db, DbReader, Settings
from slatepy.errors import AlreadyExists, NotFound
from slatepy.format.sst import SstBuilder
from slatepy.gc import GarbageCollector
from slatepy.store import MetricsStore, ObjectStore, open_store
from slatepy.store.base import WrappingStore
from slatepy.store.cas import create_if_absent
from slatepy.store.twophase import TwoPhaseStore
from tests.conftest import Backend, make_backend
from tests.processes import spawn

pytestmark = pytest.mark.s3


class Crash(BaseException):
    """A process dying at an exact point (BaseException: nothing in slatepy catches it)."""


@pytest.fixture
def two_phase(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend("s3-dynamodb", request, tmp_path)


def twophase_of(store: ObjectStore) -> TwoPhaseStore:
    assert isinstance(store, TwoPhaseStore)
    return store


def test_losing_a_create_is_already_exists_and_leaves_no_temporary(two_phase: Backend) -> None:
    store = twophase_of(two_phase.store())
    store.put("x/dest", b"first", mode="create")
    with pytest.raises(AlreadyExists):
        store.put("x/dest", b"second", mode="create")
    assert store.get("x/dest") == b"first"
    assert [m.path for m in store.list("x/")] == ["x/dest"]
    assert store.records.pending() == []


def test_racing_threads_exactly_one_wins_every_time(two_phase: Backend) -> None:
    store = two_phase.store()
    for round_no in range(8):
        dest = f"race/{round_no}"
        results: dict[int, bytes | None] = {}

        def create(t: int, dest: str = dest, results: dict[int, bytes | None] = results) -> None:
            results[t] = create_if_absent(store, dest, b"thread-%d" % t)

        threads = [threading.Thread(target=create, args=(t,)) for t in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        winners = [t for t, existing in results.items() if existing is None]
        assert len(winners) == 1, results
        winner_bytes = b"thread-%d" % winners[0]
        assert all(v in (None, winner_bytes) for v in results.values())
        assert store.get(dest) == winner_bytes
    twophase_of(store).drain()  # the winners' temporaries go in the background
    assert [m.path for m in store.list("race/")] == [f"race/{i}" for i in range(8)]
    assert twophase_of(store).records.pending() == []


def test_racing_processes_exactly_one_wins_every_time(two_phase: Backend) -> None:
    count = 15
    settings = json.dumps(msgspec.to_builtins(two_phase.settings))
    procs = {
        tag: spawn(
            "tests.twophase.child_creator",
            two_phase.url,
            settings,
            tag,
            str(count),
            stdout=subprocess.PIPE,
        )
        for tag in ("A", "B", "C")
    }
    wins: dict[int, list[str]] = {i: [] for i in range(count)}
    for tag, proc in procs.items():
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        for verdict, i in (line.split() for line in out.splitlines()):
            if verdict == "WIN":
                wins[int(i)].append(tag)
    store = two_phase.store()
    for i, winners in wins.items():
        assert len(winners) == 1, (i, winners)
        assert store.get(f"race/{i}") == winners[0].encode() * 100
    assert len(store.list("race/")) == count  # no temporary object left behind


@pytest.mark.parametrize("step", [1, 2, 3, 4, 5])
def test_crash_after_each_step_then_recovery(two_phase: Backend, step: int) -> None:
    with Db.open(two_phase.url, settings=two_phase.settings) as db:
        db.put(b"k", b"v")  # a database around the object, so GC has a manifest to go by
    dest = "wal/00000000000000099999.sst"
    data = b"payload" * 1000
    base = twophase_of(two_phase.store())

    def crash(done: int, destination: str) -> None:
        if done == step and destination == dest:
            raise Crash

    crashing = TwoPhaseStore(base.inner, base.records, background=False, after_step=crash)
    with pytest.raises(Crash):
        crashing.put(dest, data, mode="create")

    recovering = twophase_of(two_phase.store())
    assert recovering.recover() == (1 if step in (2, 3) else 0)  # uncommitted records
    assert recovering.recover() == 0  # idempotent: nothing left to do

    # Another process sees nothing or the whole object, never a part of it.
    observer = two_phase.store()
    durable = step >= 2  # the record is the commit point
    if durable:
        assert observer.get(dest) == data
    else:
        with pytest.raises(NotFound):
            observer.get(dest)
    GarbageCollector(recovering, min_age=0).collect()  # temporaries of abandoned writes
    assert [m.path for m in recovering.list("wal/") if m.path.startswith(dest)] == (
        [dest] if durable else []
    )
    record = recovering.records.get(dest)
    assert (record is not None and record.committed) if durable else record is None
    if durable:
        assert recovering.get(dest) == data
        with pytest.raises(AlreadyExists):  # exactly once: the destination stays taken
            recovering.put(dest, b"other", mode="create")


def test_requests_per_create(two_phase: Backend) -> None:
    base = twophase_of(two_phase.store())
    s3 = MetricsStore(base.inner)
    store = TwoPhaseStore(s3, base.records, background=False)
    before = base.records.metrics.snapshot()
    store.put("count/one", b"x" * 300, mode="create")
    s3_ops = {k: v.requests for k, v in s3.metrics.snapshot().items()}
    after = base.records.metrics.snapshot()
    ddb_ops = {k: after[k].requests - (before[k].requests if k in before else 0) for k in after}
    assert s3_ops == {"put": 1, "copy": 1, "delete": 1}
    assert {k: v for k, v in ddb_ops.items() if v} == {
        "dynamodb.PutItem": 1,
        "dynamodb.UpdateItem": 1,
    }


def test_a_missing_table_is_a_clear_error(two_phase: Backend) -> None:
    settings = msgspec.structs.replace(two_phase.settings, dynamodb_table="no-such-table")
    store = open_store(two_phase.url, settings)
    with pytest.raises(NotFound, match="create-table"):
        store.put("a", b"b", mode="create")


def test_a_claimed_but_uncopied_wal_sst_is_visible_to_readers(two_phase: Backend) -> None:
    with Db.open(two_phase.url, settings=two_phase.settings) as db:
        db.put(b"a", b"1")
        epoch, next_id = db.epoch, db.next_wal_id
    base = twophase_of(two_phase.store())

    def crash(done: int, destination: str) -> None:
        if done == 2:
            raise Crash

    sst = SstBuilder(writer_epoch=epoch).add_all([(b"b", 10_000, b"2")]).finish().data
    with pytest.raises(Crash):
        TwoPhaseStore(base.inner, base.records, background=False, after_step=crash).put(
            f"wal/{next_id:020d}.sst", sst, mode="create"
        )
    reader_settings = msgspec.structs.replace(two_phase.settings, reader_poll_interval=3600.0)
    assert isinstance(reader_settings, Settings)
    with DbReader.open(two_phase.url, settings=reader_settings) as reader:
        assert reader.get(b"b") == b"2" and reader.wal_id == next_id
    with Db.open(two_phase.url, settings=two_phase.settings) as db:
        assert db.next_wal_id == next_id + 2  # the id was not reused: the fence went after it
        assert db.get(b"b") == b"2"


def test_cli_create_table_and_recover(
    two_phase: Backend, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from slatepy.cli.main import main

    s = two_phase.settings
    for name, value in {
        "SLATEPY_S3_ENDPOINT": s.s3_endpoint,
        "SLATEPY_S3_ACCESS_KEY_ID": s.s3_access_key_id,
        "SLATEPY_S3_SECRET_ACCESS_KEY": s.s3_secret_access_key,
        "SLATEPY_DYNAMODB_ENDPOINT": s.dynamodb_endpoint,
        "SLATEPY_DYNAMODB_TABLE": "cli-table",
        "SLATEPY_CAS": "dynamodb",
    }.items():
        assert value is not None
        monkeypatch.setenv(name, value)
    assert main(["dynamodb", "create-table"]) == 0
    assert "DynamoDB table cli-table created" in capsys.readouterr().out
    assert main(["dynamodb", "create-table"]) == 0  # idempotent, for bootstrap scripts
    assert "DynamoDB table cli-table exists" in capsys.readouterr().out
    settings = msgspec.structs.replace(s, dynamodb_table="cli-table")
    base = twophase_of(open_store(two_phase.url, settings))

    def crash(done: int, destination: str) -> None:
        if done == 3:
            raise Crash

    with pytest.raises(Crash):
        TwoPhaseStore(base.inner, base.records, background=False, after_step=crash).put(
            "x/y", b"z", mode="create"
        )
    assert main(["dynamodb", "recover", two_phase.url]) == 0
    assert "recovered 1 pending two-phase writes" in capsys.readouterr().out
    assert base.records.pending() == [] and base.get("x/y") == b"z"


def test_close_leaves_no_two_phase_write_half_done(two_phase: Backend) -> None:
    """Completions run in the background after a create; ``close`` waits for them."""
    store = twophase_of(two_phase.store())
    db = Db.open(store, settings=two_phase.settings)
    for i in range(5):
        db.put(b"k%d" % i, b"v")
    db.close()
    assert store.records.pending() == []
    strays = [m.path for m in store.list("") if m.path.count(".") > 1]
    assert strays == [], "temporaries left behind"


class SlowCopy(WrappingStore):
    """Holds every copy (step 3 of a background completion) until ``release`` is set."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.release = threading.Event()

    def copy(self, source: str, destination: str) -> None:
        assert self.release.wait(10)
        self.inner.copy(source, destination)


def test_a_delete_is_not_undone_by_a_completion_still_copying(two_phase: Backend) -> None:
    base = twophase_of(two_phase.store())
    slow = SlowCopy(base.inner)
    store = TwoPhaseStore(slow, base.records)
    store.put("slot", b"first", mode="create")  # durable; the copy waits in the background
    deleting = threading.Thread(target=store.delete, args=("slot",))
    deleting.start()
    deleting.join(0.3)  # the delete waits for the completion (before: it ran at once)
    slow.release.set()
    deleting.join(10)
    store.put("slot", b"again", mode="create")
    assert store.get("slot") == b"again"


class FirstGetMisses(WrappingStore):
    """The first ``get`` answers NotFound, as a read racing a background copy would."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.missed = False

    def get(self, path: str) -> bytes:
        if not self.missed:
            self.missed = True
            raise NotFound(f"object not found: {path}", path=path)
        return self.inner.get(path)


def test_a_read_that_misses_a_copy_completed_meanwhile_reads_again(two_phase: Backend) -> None:
    """Found in CI: the read missed, then the completion copied and marked the record
    committed before the read looked the record up; a committed record meant NotFound."""
    base = twophase_of(two_phase.store())
    TwoPhaseStore(base.inner, base.records, background=False).put("slot", b"v", mode="create")
    racing = TwoPhaseStore(FirstGetMisses(base.inner), base.records)
    assert racing.get("slot") == b"v"
