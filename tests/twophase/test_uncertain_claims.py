"""Regressions for "no acknowledged write lost, no wedged database" (two-phase CAS, RFC 0004).

* An uncertain claim (step 2's PutItem timed out) is resolved by retrying the same claim; if it
  stays unknown the temporary object is kept, so a claim that lands late still completes.
* A record whose source and destination are both gone (left by a late claim whose temporary
  was deleted) is dropped instead of wedging every read and open with ``CorruptionError``.
* Step 4 never re-creates a record that was collected meanwhile, and a malformed item is a
  typed ``CorruptionError``, never a ``KeyError``.

Races are made deterministic by a DynamoDB client whose PutItem follows a script: the request
is answered, lands and loses its reply, is lost, or is held back and lands later on command.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal, cast

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from slatepy import Db
from slatepy.errors import AlreadyExists, CorruptionError, NotFound, StoreUnavailable
from slatepy.store import ObjectStore
from slatepy.store.dynamodb import DynamoRecords, dynamodb_client
from slatepy.store.twophase import TwoPhaseStore
from tests.conftest import Backend, make_backend

pytestmark = pytest.mark.s3

Fate = Literal["ok", "reply-lost", "dropped", "held", "land-held-first"]
"""What happens to one PutItem: ``ok`` as usual; ``reply-lost`` lands but the caller sees a
timeout; ``dropped`` never lands; ``held`` is kept back (the caller sees a timeout) until
:meth:`ScriptedPutItem.land_held` sends it; ``land-held-first`` lands the held requests, then
sends this one (a late request overtaking the retry)."""


class ScriptedPutItem:
    """A boto3 DynamoDB client whose ``put_item`` calls follow ``script``, then ``then``."""

    def __init__(self, client: Any, script: list[Fate], *, then: Fate = "ok") -> None:
        self._client = client
        self._script = list(script)
        self._then = then
        self.held: list[dict[str, Any]] = []
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def put_item(self, **request: Any) -> Any:
        fate = self._script.pop(0) if self._script else self._then
        self.calls += 1
        if fate == "land-held-first":
            self.land_held()
        if fate in ("ok", "land-held-first"):
            return self._client.put_item(**request)
        if fate == "reply-lost":
            self._client.put_item(**request)
        elif fate == "held":
            self.held.append(request)
        raise ReadTimeoutError(endpoint_url="http://dynamodb.test")

    def land_held(self) -> None:
        """Deliver the held requests in order (a conditional put that fails changes nothing)."""
        held, self.held = self.held, []
        for request in held:
            try:
                self._client.put_item(**request)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                    raise


@pytest.fixture
def two_phase(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend("s3-dynamodb", request, tmp_path)


def twophase_of(store: ObjectStore) -> TwoPhaseStore:
    assert isinstance(store, TwoPhaseStore)
    return store


def scripted(two_phase: Backend, script: list[Fate], *, then: Fate = "ok") -> ScriptedPutItem:
    return ScriptedPutItem(dynamodb_client(two_phase.settings), script, then=then)


def store_with(two_phase: Backend, client: ScriptedPutItem) -> TwoPhaseStore:
    """A foreground two-phase store on ``two_phase`` whose DynamoDB client is ``client``."""
    base = twophase_of(two_phase.store())
    records = DynamoRecords(cast(Any, client), base.records.table, base.records.namespace)
    return TwoPhaseStore(base.inner, records, background=False)


def temporaries(store: TwoPhaseStore, dest: str) -> list[str]:
    """The temporary objects of ``dest`` (listing is by directory, so filter the names)."""
    directory = dest.rsplit("/", 1)[0] + "/"
    return [m.path for m in store.inner.list(directory) if m.path.startswith(dest + ".")]


def orphan_source(dest: str) -> str:
    """A temporary name that was never written (or was deleted): what a late claim left."""
    return f"{dest}.{'0' * 32}.{'0' * 16}"


# --- 6. uncertain claims -------------------------------------------------------------------


@pytest.mark.parametrize(
    "script",
    [
        pytest.param(["reply-lost"], id="landed-reply-lost"),
        pytest.param(["held", "land-held-first"], id="first-lands-before-the-retry"),
        pytest.param(["dropped"], id="first-lost-retry-lands"),
    ],
)
def test_an_uncertain_claim_is_retried_until_known(two_phase: Backend, script: list[Fate]) -> None:
    client = scripted(two_phase, script)
    store = store_with(two_phase, client)
    dest, data = "x/dest", b"payload" * 100

    store.put(dest, data, mode="create")  # acknowledged: exactly one claim is ours

    assert client.calls == 2
    assert store.get(dest) == data
    record = store.records.get(dest)
    assert record is not None and record.committed and record.source.startswith(dest + ".")
    assert temporaries(store, dest) == []  # step 5 removed the one temporary
    assert store.records.pending() == []
    with pytest.raises(AlreadyExists):  # the destination is taken exactly once
        twophase_of(two_phase.store()).put(dest, b"other", mode="create")
    assert store.get(dest) == data


@pytest.mark.parametrize("later", ["read", "recover"])
def test_a_claim_that_lands_after_put_gave_up_still_completes(
    two_phase: Backend, later: str
) -> None:
    client = scripted(two_phase, [], then="held")  # no attempt is ever answered
    store = store_with(two_phase, client)
    dest, data = "wal/00000000000000000042.sst", b"late" * 500

    with pytest.raises(StoreUnavailable) as raised:
        store.put(dest, data, mode="create")
    assert raised.value.definite is False  # it may have landed: the caller must re-check
    assert dest in str(raised.value)
    assert client.calls >= 2  # the claim was retried before giving up
    [temporary] = temporaries(store, dest)  # kept: a late claim still needs it

    client.land_held()  # the first attempt reaches DynamoDB after ``put`` raised
    record = store.records.get(dest)
    assert record is not None and record.source == temporary and not record.committed

    observer = twophase_of(two_phase.store())  # another process, later
    if later == "recover":
        assert observer.recover() == 1
    assert observer.get(dest) == data  # no CorruptionError: the write completed
    assert observer.recover() == 0
    assert temporaries(observer, dest) == []
    record = observer.records.get(dest)
    assert record is not None and record.committed


def test_losing_after_an_uncertain_claim_is_already_exists(two_phase: Backend) -> None:
    winner = twophase_of(two_phase.store())
    client = scripted(two_phase, ["dropped"])
    loser = store_with(two_phase, client)
    dest = "x/contended"

    def win_meanwhile(step: int, destination: str) -> None:
        if step == 1:  # our temporary is written; the other writer claims first
            winner.put(dest, b"winner", mode="create")

    racing = TwoPhaseStore(loser.inner, loser.records, background=False, after_step=win_meanwhile)
    with pytest.raises(AlreadyExists):
        racing.put(dest, b"loser", mode="create")
    winner.drain()
    assert racing.get(dest) == b"winner"
    assert temporaries(racing, dest) == []  # the loser removed its temporary


# --- 6. orphan records (defence in depth) ----------------------------------------------------


@pytest.mark.parametrize("found_by", ["get", "head", "list", "recover"])
def test_a_record_whose_source_and_destination_are_gone_is_dropped(
    two_phase: Backend, found_by: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = twophase_of(two_phase.store())
    dest = "x/orphan"
    store.records.claim(dest, orphan_source(dest))  # the state the old defect left behind

    with caplog.at_level(logging.WARNING, logger="slatepy.store.twophase"):
        if found_by == "get":
            with pytest.raises(NotFound):
                store.get(dest)
        elif found_by == "head":
            with pytest.raises(NotFound):
                store.head(dest)
        elif found_by == "list":
            assert store.list("x/") == []
        else:
            assert store.recover() == 0  # nothing was completed
    assert store.records.get(dest) is None
    assert any(dest in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)

    store.put(dest, b"fresh", mode="create")  # the destination is free again
    store.drain()
    assert store.get(dest) == b"fresh"


def test_a_database_opens_over_an_orphan_wal_record(two_phase: Backend) -> None:
    with Db.open(two_phase.url, settings=two_phase.settings) as db:
        db.put(b"a", b"1")
        next_id = db.next_wal_id
    store = twophase_of(two_phase.store())
    dest = f"wal/{next_id:020d}.sst"
    store.records.claim(dest, orphan_source(dest))

    for _ in range(2):  # every open used to fail with CorruptionError
        with Db.open(two_phase.url, settings=two_phase.settings) as db:
            assert db.get(b"a") == b"1"
            db.put(b"b", b"2")
    with Db.open(two_phase.url, settings=two_phase.settings) as db:
        assert db.get(b"a") == b"1" and db.get(b"b") == b"2"


def test_delete_if_source_only_deletes_that_claim(two_phase: Backend) -> None:
    records = twophase_of(two_phase.store()).records
    dest = "x/conditional"
    records.claim(dest, "x/conditional.new")
    assert records.delete_if_source(dest, "x/conditional.old") is False  # a newer claim stays
    record = records.get(dest)
    assert record is not None and record.source == "x/conditional.new"
    assert records.delete_if_source(dest, "x/conditional.new") is True
    assert records.get(dest) is None
    assert records.delete_if_source(dest, "x/conditional.new") is False  # already gone


# --- 7. step 4 on a collected record; malformed items ----------------------------------------


@pytest.mark.parametrize("collected", ["record", "object-and-record"])
def test_a_record_collected_before_step_4_is_not_recreated(
    two_phase: Backend, collected: str
) -> None:
    base = twophase_of(two_phase.store())
    dest, data = "x/collected", b"data" * 100

    def collect(step: int, destination: str) -> None:
        if step == 3 and destination == dest:
            if collected == "record":
                base.records.delete(dest)
            else:
                base.delete(dest)  # GC's order: the object, then its record

    store = TwoPhaseStore(base.inner, base.records, background=False, after_step=collect)
    store.put(dest, data, mode="create")

    if collected == "record":  # later reads and scans: no KeyError on a sourceless record
        assert base.get(dest) == data
    else:
        with pytest.raises(NotFound):
            base.get(dest)
    assert base.records.get(dest) is None
    assert base.records.pending() == []
    raw = dynamodb_client(two_phase.settings).get_item(
        TableName=base.records.table,
        Key={"pk": {"S": base.records.namespace}, "sk": {"S": dest}},
        ConsistentRead=True,
    )
    assert "Item" not in raw  # step 4 did not upsert a record without a source
    assert temporaries(base, dest) == []


def test_an_item_without_source_is_a_corruption_error(two_phase: Backend) -> None:
    records = twophase_of(two_phase.store()).records
    store = twophase_of(two_phase.store())
    dest = "x/malformed"
    dynamodb_client(two_phase.settings).put_item(
        TableName=records.table,
        Item={
            "pk": {"S": records.namespace},
            "sk": {"S": dest},
            "committed": {"BOOL": False},
            "created": {"N": "0"},
        },
    )
    with pytest.raises(CorruptionError, match=dest):
        records.get(dest)
    with pytest.raises(CorruptionError, match=dest):
        records.pending("x/")
    with pytest.raises(CorruptionError, match=dest):
        store.get(dest)


def test_mark_committed_only_marks_that_claim(two_phase: Backend) -> None:
    records = twophase_of(two_phase.store()).records
    dest = "x/marked"
    assert records.mark_committed(dest, "x/marked.a") is False  # no record: none is created
    assert records.get(dest) is None
    records.claim(dest, "x/marked.b")
    assert records.mark_committed(dest, "x/marked.a") is False  # a newer claim is not ours
    record = records.get(dest)
    assert record is not None and not record.committed
    assert records.mark_committed(dest, "x/marked.b") is True
    assert records.mark_committed(dest, "x/marked.b") is True  # idempotent
    record = records.get(dest)
    assert record is not None and record.committed
