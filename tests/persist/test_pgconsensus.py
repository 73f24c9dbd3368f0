"""PostgreSQL consensus beyond the conformance suite, on a real server: a killed, restarted or
unreachable server, connections terminated by the server, statement timeouts, and the locks
the one-statement compare-and-set relies on, each made to happen deterministically by a side
connection holding a lock in an open transaction."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql

from slatepy.errors import ClosedError, InvalidArgument, StoreUnavailable
from slatepy.persist.location.consensus import Committed, Mismatch, VersionedData
from slatepy.persist.location.pgconsensus import SCHEMA_LOCK, PostgresConsensus
from slatepy.testing.persist_conformance import append
from slatepy.testing.postgres import PostgresServer, free_port

KEY = "orders"
MakePg = Callable[..., PostgresConsensus]


@pytest.fixture
def app() -> str:
    """An application_name that picks out the consensus's own server session."""
    return f"consensus-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def pg_on() -> Iterator[MakePg]:
    """``pg_on(server, table, **options)``; everything it opens is closed at the end."""
    opened: list[PostgresConsensus] = []

    def make(url: str, table: str, **options: object) -> PostgresConsensus:
        consensus = PostgresConsensus(url, table=table, **options)  # type: ignore[arg-type]
        opened.append(consensus)
        return consensus

    yield make
    for consensus in opened:
        consensus.close()


@pytest.fixture
def watched(postgres: PostgresServer, pg_table: str, pg_on: MakePg, app: str) -> PostgresConsensus:
    """A consensus whose server session is named ``app`` (so ``side`` can watch it)."""
    return pg_on(f"{postgres.url()}?application_name={app}", pg_table)


@pytest.fixture
def side(postgres: PostgresServer) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A plain connection for the other actor (explicit transactions, locks)."""
    with psycopg.connect(postgres.url(), autocommit=True) as conn:
        yield conn


def wait_until_waiting(
    side: psycopg.Connection[tuple[object, ...]], app: str, event_type: str = "Lock"
) -> None:
    """Block until the session named ``app`` waits on a lock (at most 10 s)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = side.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = %s AND wait_event_type = %s",
            (app, event_type),
        ).fetchone()
        if row is not None and row[0]:
            return
        time.sleep(0.01)
    raise AssertionError(f"{app} never waited on a {event_type}")


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def finish(thread: threading.Thread, out: list[object]) -> object:
    thread.join(30)
    assert not thread.is_alive()
    return out[0]


# An unreachable, killed or restarted server.


def test_a_refused_connection_is_definite(pg_on: MakePg) -> None:
    consensus = pg_on(f"postgresql://postgres:s3cret@127.0.0.1:{free_port()}/postgres", "t")
    with pytest.raises(StoreUnavailable) as raised:
        consensus.head(KEY)
    assert raised.value.definite is True
    assert "s3cret" not in str(raised.value)
    with pytest.raises(StoreUnavailable) as raised:
        consensus.compare_and_set(KEY, None, b"v1")
    assert raised.value.definite is True  # nothing was ever sent


def test_a_killed_server_fails_calls_until_it_is_back(
    own_postgres: PostgresServer, pg_table: str, pg_on: MakePg
) -> None:
    consensus = pg_on(own_postgres.url(), pg_table)
    append(consensus, KEY, b"v1")
    own_postgres.stop(mode="immediate")
    # The INSERT went out on a connection that turned out dead, and the read-back cannot
    # connect: whether it landed is unknown.
    with pytest.raises(StoreUnavailable) as raised:
        consensus.compare_and_set(KEY, 1, b"v2")
    assert raised.value.definite is False
    # Now no connection is open: connecting is refused before anything is sent.
    with pytest.raises(StoreUnavailable) as raised:
        consensus.compare_and_set(KEY, 1, b"v2")
    assert raised.value.definite is True
    with pytest.raises(StoreUnavailable) as raised:
        consensus.head(KEY)
    assert raised.value.definite is True
    own_postgres.start()
    assert consensus.head(KEY) == VersionedData(1, b"v1")  # reconnected; committed data kept
    assert consensus.compare_and_set(KEY, 1, b"v2") == Committed()


def test_connections_terminated_by_the_server_are_replaced(
    postgres: PostgresServer,
    pg_table: str,
    pg_on: MakePg,
    side: psycopg.Connection[tuple[object, ...]],
    app: str,
) -> None:
    consensus = pg_on(f"{postgres.url()}?application_name={app}", pg_table)
    append(consensus, KEY, b"v1")

    def terminate() -> None:
        row = side.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s",
            (app,),
        ).fetchone()
        assert row is not None and row[0] == 1

    terminate()
    assert consensus.head(KEY) == VersionedData(1, b"v1")  # a read tries a new connection
    terminate()
    # The INSERT fails on the dead connection; the read-back (new connection) finds nothing,
    # so the insert is sent again and lands once.
    assert consensus.compare_and_set(KEY, 1, b"v2") == Committed()
    assert consensus.scan(KEY, 0, 10) == [VersionedData(1, b"v1"), VersionedData(2, b"v2")]
    terminate()
    assert consensus.truncate(KEY, 2) == 1


def test_statement_timeout_is_indefinite_for_a_write(
    postgres: PostgresServer,
    pg_table: str,
    pg_on: MakePg,
    side: psycopg.Connection[tuple[object, ...]],
) -> None:
    consensus = pg_on(postgres.url(), pg_table, statement_timeout=0.2)
    append(consensus, KEY, b"v1")
    with side.transaction():
        side.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(pg_table))
        )
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="statement timeout") as raised:
            consensus.compare_and_set(KEY, 1, b"v2")
        assert raised.value.definite is False  # cancelled, and so was the read-back
        with pytest.raises(StoreUnavailable, match="statement timeout") as raised:
            consensus.head(KEY)
        assert time.monotonic() - started < 10
    assert consensus.head(KEY) == VersionedData(1, b"v1")  # the cancelled insert never landed
    assert consensus.compare_and_set(KEY, 1, b"v2") == Committed()


# The locks the compare-and-set relies on.


@pytest.mark.parametrize(
    "case",
    [
        (then, outcome)
        for then in ("nothing", "append and truncate")
        for outcome in ("commit", "rollback")
    ],
    ids=lambda case: "-then-".join(case).replace(" ", "-"),
)
def test_a_first_insert_waits_for_a_concurrent_first_insert(
    watched: PostgresConsensus,
    side: psycopg.Connection[tuple[object, ...]],
    app: str,
    pg_table: str,
    case: tuple[str, str],
) -> None:
    """Another client's first insert (its claim of the key and row 1), maybe followed by an
    append and a truncation to 2, is in an open transaction while our first insert runs:
    ours waits on the claim. If theirs commits, ours writes nothing (even though row 1 is
    gone again, which a plain "no row for the key" check in our statement's snapshot
    would have missed); if theirs rolls back, ours commits."""
    then, outcome = case
    consensus = watched
    consensus.list_keys()  # the tables exist
    table, shards = sql.Identifier(pg_table), sql.Identifier(f"{pg_table}_shards")
    tx = side.transaction()
    tx.__enter__()
    side.execute(sql.SQL("INSERT INTO {} VALUES (%s)").format(shards), (KEY,))
    side.execute(sql.SQL("INSERT INTO {} VALUES (%s, 1, 'theirs 1')").format(table), (KEY,))
    if then == "append and truncate":
        side.execute(sql.SQL("INSERT INTO {} VALUES (%s, 2, 'theirs 2')").format(table), (KEY,))
        side.execute(sql.SQL("DELETE FROM {} WHERE shard = %s AND seqno < 2").format(table), (KEY,))
    thread, out = in_thread(lambda: consensus.compare_and_set(KEY, None, b"ours"))
    wait_until_waiting(side, app)
    if outcome == "commit":
        tx.__exit__(None, None, None)
        head = VersionedData(1, b"theirs 1") if then == "nothing" else VersionedData(2, b"theirs 2")
        assert finish(thread, out) == Mismatch(head)
        assert consensus.scan(KEY, 0, 10) == [head]
    else:
        tx.__exit__(RuntimeError, RuntimeError("roll back"), None)
        assert finish(thread, out) == Committed()
        assert consensus.scan(KEY, 0, 10) == [VersionedData(1, b"ours")]
    assert consensus.list_keys() == [KEY]


def test_a_cas_whose_predecessor_is_being_truncated_waits_and_writes_nothing(
    postgres: PostgresServer,
    pg_table: str,
    pg_on: MakePg,
    side: psycopg.Connection[tuple[object, ...]],
    app: str,
) -> None:
    """Another client appends 3 and 4 and truncates to 4 in one transaction while our CAS
    from head 2 runs. Our statement's snapshot still shows row 2 as the head; a plain
    ``EXISTS`` check would pass and insert a second row 3 after the other transaction's row 3
    was deleted. Reading row 2 ``FOR KEY SHARE`` waits for that transaction and, once it has
    committed, finds row 2 gone: nothing is inserted."""
    consensus = pg_on(f"{postgres.url()}?application_name={app}", pg_table)
    append(consensus, KEY, b"v1")
    append(consensus, KEY, b"v2")
    table = sql.Identifier(pg_table)
    with side.transaction():
        side.execute(sql.SQL("INSERT INTO {} VALUES (%s, 3, 'theirs 3')").format(table), (KEY,))
        side.execute(sql.SQL("INSERT INTO {} VALUES (%s, 4, 'theirs 4')").format(table), (KEY,))
        side.execute(sql.SQL("DELETE FROM {} WHERE shard = %s AND seqno < 4").format(table), (KEY,))
        thread, out = in_thread(lambda: consensus.compare_and_set(KEY, 2, b"ours 3"))
        wait_until_waiting(side, app)  # on row 2's lock
    assert finish(thread, out) == Mismatch(VersionedData(4, b"theirs 4"))
    assert consensus.scan(KEY, 0, 10) == [VersionedData(4, b"theirs 4")]


def test_schema_creation_is_serialized_by_the_advisory_lock(
    postgres: PostgresServer,
    pg_table: str,
    pg_on: MakePg,
    side: psycopg.Connection[tuple[object, ...]],
) -> None:
    apps = [f"schema-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
    instances = [pg_on(f"{postgres.url()}?application_name={a}", pg_table) for a in apps]
    side.execute("SELECT pg_advisory_lock(%s)", (SCHEMA_LOCK,))
    try:
        running = [in_thread(lambda c=c: c.head(KEY)) for c in instances]
        for a in apps:
            wait_until_waiting(side, a, "Lock")  # all three at the advisory lock
    finally:
        side.execute("SELECT pg_advisory_unlock(%s)", (SCHEMA_LOCK,))
    assert [finish(thread, out) for thread, out in running] == [None, None, None]
    assert instances[0].compare_and_set(KEY, None, b"v1") == Committed()


# Arguments and life cycle.


def test_bad_arguments_are_refused_before_connecting() -> None:
    with pytest.raises(InvalidArgument, match="table"):
        PostgresConsensus("postgresql://u@h/db", table="Robert'); DROP TABLE x;--")
    with pytest.raises(InvalidArgument, match="table"):
        PostgresConsensus("postgresql://u@h/db", table="x" * 57)  # + "_shards": over 63
    PostgresConsensus("postgresql://u@h/db", table="x" * 56).close()
    with pytest.raises(InvalidArgument):
        PostgresConsensus("postgresql://u@h/db", statement_timeout=0)
    with pytest.raises(InvalidArgument, match="not a PostgreSQL URL"):
        PostgresConsensus("postgresql://u@h/db?no_such_option=1")


def test_closed_refuses_calls(postgres: PostgresServer, pg_table: str) -> None:
    consensus = PostgresConsensus(postgres.url(), table=pg_table)
    append(consensus, KEY, b"v1")
    consensus.close()
    consensus.close()
    with pytest.raises(ClosedError):
        consensus.head(KEY)
