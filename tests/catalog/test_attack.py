"""Regression tests of an outsider's attack on the catalog (RFC 0028 addendum D): corrupt
rows, two values for one key, objects this version cannot read, a newer version's
collections, names that cannot be stored, and reads racing a commit. Each failed before its
fix."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from slatepy.catalog import (
    CatalogError,
    IncompatibleCatalogVersion,
    InvalidCatalogObject,
    open_catalog,
)
from slatepy.catalog.open import open_storage
from slatepy.catalog.storage import Row
from slatepy.cli.main import main
from tests.catalog.conftest import Place, make_place

SETTING = b'{"name":"n"}'


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["catalog", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def write_raw(place: Place, rows: list[Row]) -> None:
    """Append ``rows`` as they are at the catalog's upper, past every check (what a bit flip,
    a hand-made SQL edit or another program could leave behind)."""
    storage = open_storage(place.url, shard=place.shard)
    try:
        storage.write(rows, expected_upper=storage.upper(), epoch=None)
    finally:
        storage.close()


def initialized(place: Place) -> None:
    with open_catalog(place.url, shard=place.shard) as state:
        state.open()
        tx = state.transaction()
        tx.set_setting("n", "v")
        state.commit_transaction(tx)


def shard_args(place: Place) -> list[str]:
    return ["--shard", place.shard]


@pytest.mark.parametrize("single", ["persist-file", "sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("stored", "why"),
    [(b"{{", "JSON is malformed"), (b'{"value":5}', "Expected `str`, got `int`")],
)
def test_a_corrupt_value_is_a_typed_error_naming_it_and_the_tool_repairs_it(
    single: Place, stored: bytes, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: msgspec's DecodeError (a traceback from the CLI) from open, open_read_only and
    dump, or (a value of the wrong type) an open that succeeded and an upgrade-check that
    said it would, with the typed reads failing later."""
    initialized(single)
    write_raw(
        single, [("settings", SETTING, b'{"value":"v"}', -1), ("settings", SETTING, stored, 1)]
    )
    json = stored != b"{{"  # the dump shows a catalog as stored, of any version
    for call in ("open", "open_read_only", "check_open", *([] if json else ["dump"])):
        with open_catalog(single.url, shard=single.shard) as state:
            with pytest.raises(CatalogError, match=r'corrupt: settings \{"name":"n"\}') as info:
                getattr(state, call)()
            assert why in str(info.value)
    for command in ("upgrade-check", *([] if json else ["dump"])):
        code, out, err = run(capsys, command, single.url, *shard_args(single))
        assert (code, out) == (1, "") and err.count("\n") == 1 and "corrupt" in err
    # The debug tool reaches the broken object (the repair) and shows what it held.
    code, out, _ = run(
        capsys, "delete", single.url, "settings", '{"name": "n"}', *shard_args(single)
    )
    assert code == 0 and out.startswith("previous value: {")
    with open_catalog(single.url, shard=single.shard) as state:
        state.open()
        assert state.settings() == {}


@pytest.mark.parametrize("single", ["persist-file", "sqlite"], indirect=True)
def test_two_live_values_for_one_key_are_corruption(single: Place) -> None:
    """Was: one of the two taken silently (which one: the storage's order), the other left
    live under the open's retraction, so the key's value could change with no commit."""
    initialized(single)
    write_raw(single, [("settings", SETTING, b'{"value":"w"}', 1)])
    for call in ("open", "open_read_only", "check_open", "dump"):
        with (
            open_catalog(single.url, shard=single.shard) as state,
            pytest.raises(CatalogError, match=r'corrupt: settings \{"name":"n"\} holds 2'),
        ):
            getattr(state, call)()


@pytest.mark.parametrize("single", ["persist-file", "sqlite"], indirect=True)
def test_a_catalog_of_a_newer_version_with_a_new_collection_says_so(
    single: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was (persist): "holds something that is not a catalog" for a catalog a newer slatepy
    wrote with a collection this code does not know, instead of the version error."""
    initialized(single)
    version = b'{"key":"catalog_version"}'
    rows: list[Row] = [
        ("config", version, b'{"value":2}', -1),
        ("config", version, b'{"value":3}', 1),
    ]
    write_raw(single, rows)
    storage = open_storage(single.url, shard=single.shard)
    try:  # a collection of version 3 (SQL: its own collection row, as that version made it)
        upper = storage.upper()
        if single.name == "sqlite":
            import sqlite3

            with sqlite3.connect(single.url.removeprefix("sqlite:///")) as conn:
                conn.execute(f"INSERT INTO {single.shard}_collections VALUES (99, 'clusters')")
                conn.execute(f"INSERT INTO {single.shard}_uppers VALUES (99, {upper})")
                conn.execute(
                    f"INSERT INTO {single.shard}_data VALUES (99, ?, ?, ?, 1)",
                    (b'{"id":1}', b'{"name":"c"}', upper - 1),
                )
            conn.close()
        else:
            from slatepy.catalog.persist import _key

            writer = storage._handle()  # type: ignore[attr-defined]
            update = ((_key("clusters", b'{"id":1}'), b'{"name":"c"}'), upper, 1)
            writer.compare_and_append([update], upper, upper + 1)
    finally:
        storage.close()
    for call in ("open", "open_read_only", "check_open"):
        with (
            open_catalog(single.url, shard=single.shard) as state,
            pytest.raises(IncompatibleCatalogVersion, match="version 3, newer"),
        ):
            getattr(state, call)()
    assert run(capsys, "epoch", single.url, *shard_args(single))[:2] == (0, "Epoch: 1\n")
    code, out, _ = run(capsys, "dump", single.url, *shard_args(single))
    assert code == 0 and '"clusters"' in out  # the whole catalog, its unknown part too


def test_an_unknown_collection_at_this_version_is_corruption(tmp_path: Path) -> None:
    place = Place("persist-file", f"file://{tmp_path}/p")
    initialized(place)
    write_raw(place, [("settings", SETTING, b'{"value":"v"}', -1)])
    storage = open_storage(place.url)
    try:
        from slatepy.catalog.persist import _key

        upper = storage.upper()
        update = ((_key("clusters", b'{"id":1}'), b'{"name":"c"}'), upper, 1)
        storage._handle().compare_and_append([update], upper, upper + 1)  # type: ignore[attr-defined]
    finally:
        storage.close()
    with open_catalog(place.url) as state, pytest.raises(CatalogError, match="clusters"):
        state.open()


def test_a_name_that_cannot_be_encoded_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: UnicodeEncodeError (a traceback) for a lone surrogate, which JSON input allows."""
    url = f"sqlite:///{tmp_path}/c.db"
    with open_catalog(url) as state:
        state.open()
        tx = state.transaction()
        with pytest.raises(InvalidCatalogObject, match="databases"):
            tx.create_database("\ud800", "memory://")
        tx.create_database("ok", "memory://")  # the transaction is still usable
        state.commit_transaction(tx)
    code, out, err = run(capsys, "edit", url, "settings", '{"name": "\\ud800"}', '{"value": "x"}')
    assert (code, out) == (1, "") and err.count("\n") == 1 and "does not fit" in err


def test_a_read_never_sees_half_a_commit(tmp_path: Path) -> None:
    """Was: a read of the cache in another thread while a commit was being applied saw the
    key retracted and not yet re-inserted: a catalog no commit ever made."""
    state = open_catalog(f"sqlite:///{tmp_path}/c.db")
    state.open()
    tx = state.transaction()
    tx.set_setting("n", "1")
    state.commit_transaction(tx)
    seen: list[object] = []
    threads: list[threading.Thread] = []
    cache = state._cache
    real_insert = cache._insert

    def insert_after_a_read(name: str, key: bytes, value: bytes) -> None:
        if not threads:  # the retraction is applied, the insertion not yet
            threads.append(threading.Thread(target=lambda: seen.append(state.settings())))
            threads[0].start()
            threads[0].join(timeout=0.5)
        real_insert(name, key, value)

    cache._insert = insert_after_a_read  # type: ignore[method-assign]
    tx = state.transaction()
    tx.set_setting("n", "2")
    state.commit_transaction(tx)
    threads[0].join(timeout=10)
    assert seen == [{"n": "2"}]
    state.close()


@pytest.mark.parametrize("call", ["debug_commit", "open"])
def test_lost_consensus_races_are_retried_like_lost_upper_races(call: str) -> None:
    """Was: persist's StateConflictError (its compare-and-set lost 64 races on the shard's
    consensus log to other actors' reader registrations: nothing committed) ended a debug
    edit or registration at once, though it promises to retry for 30 s while others win,
    and ended an open. Here another client registers a reader before each of the first 64
    consensus writes of this one."""
    from slatepy.catalog import persist_catalog
    from slatepy.config import Settings
    from slatepy.persist import PersistClient
    from slatepy.persist.location.objconsensus import ObjectConsensus
    from slatepy.persist.machine import MAX_ATTEMPTS
    from slatepy.store.stack import open_stack
    from slatepy.testing.persist_faults import InterceptConsensus

    store = open_stack("memory://", Settings())
    lost = [0]

    def another_actor_first(op: str, key: str | None) -> None:
        if op == "compare_and_set" and lost[0] < MAX_ATTEMPTS:
            lost[0] += 1
            other.open_leased_reader("catalog").expire()

    with (
        ObjectConsensus(store, min_age=0) as log,
        PersistClient.open(store, consensus=log) as other,
        PersistClient.open(
            store, consensus=InterceptConsensus(log, before=another_actor_first)
        ) as client,
    ):
        persist_catalog(other).open()
        state = persist_catalog(client)
        if call == "open":
            state.open()
            assert state.epoch == 2
        else:
            state.debug_commit(lambda tx: tx.set_setting("n", "v"), user="t")
        assert lost[0] == MAX_ATTEMPTS  # one whole persist call gave up
        reader = persist_catalog(other)
        reader.open_read_only()
        assert reader.settings() == ({} if call == "open" else {"n": "v"})


@pytest.mark.parametrize("single", ["sqlite", "postgres"], indirect=True)
def test_two_sql_shard_names_never_name_one_catalog(single: Place) -> None:
    """Was: the stash's table prefix lower-cased the shard and turned ``-`` and ``.`` into
    ``_``, so ``Prod-1``, ``prod.1`` and ``prod_1`` were one catalog (an open of one fenced
    the others' leader and each saw the others' objects), where persist has three shards."""
    from slatepy.errors import InvalidArgument

    with open_catalog(single.url, shard="prod_1") as state:
        state.open()
    for alias in ("prod-1", "prod.1", "Prod_1"):
        with pytest.raises(InvalidArgument, match="prod_1"):
            open_catalog(single.url, shard=alias)


@pytest.mark.parametrize(
    ("kind", "point"),
    [
        ("sqlite", "in-sql-transaction"),
        ("postgres", "in-sql-transaction"),
        ("persist-file", "before-consensus"),
        ("persist-file", "after-write"),
    ],
)
def test_an_open_killed_mid_migration_leaves_the_old_catalog_or_the_new_one(
    kind: str, point: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """No defect found: a process SIGKILLed inside an open that migrates leaves version 1
    at epoch 1 or version 2 at epoch 2, never a mix, and the next open completes it."""
    import os
    import subprocess
    import sys

    import msgspec

    from slatepy.catalog.snapshot import diff_objects
    from slatepy.catalog.upgrade import v1

    place = make_place(kind, request, tmp_path)
    url, shard = place.url, place.shard
    objects = v1.initial_objects()
    old = v1.SourceV1("s", "postgres", url="postgresql://u:hunter2@h/d")
    objects["sources"] = {b'{"id":1}': msgspec.json.encode(old)}
    storage = open_storage(url, shard=shard)
    try:
        storage.write(diff_objects({}, objects), expected_upper=0, epoch=0, new_epoch=1)
    finally:
        storage.close()
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    child = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("crash_child.py")), url, shard, point],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert child.returncode == -9, (child.stdout, child.stderr)
    with open_catalog(url, shard=shard) as state:
        found, _ = state.check_open()
        landed = point == "after-write"
        assert (found, state.current().epoch) == ((2, 2) if landed else (1, 1))
    with open_catalog(url, shard=shard) as state:
        state.open()
        assert state.epoch == (3 if landed else 2)
        [(_, source)] = state.sources()
        assert source.connection == "postgresql://u@h/d"
        events = [(e.event_type, e.key["epoch"]) for _, e in state.audit_log()]
        assert events == ([("migrate", 2), ("open", 3)] if landed else [("migrate", 2)])


@pytest.mark.parametrize("single", ["postgres"], indirect=True)
def test_a_retried_serialization_failure_logs_nothing(
    single: Place, caplog: pytest.LogCaptureFixture
) -> None:
    """Was: a serialization failure inside the batch's INSERT (psycopg's pipelined
    ``executemany``) was retried, but psycopg logged ``error ignored terminating
    <psycopg.Pipeline ...>: pipeline aborted`` (a WARNING: on the CLI's standard error, a
    successful edit printed it). Seen with 3 editors and 2 openers on one catalog; here the
    server refuses the third row of a batch of 2,000 (a pipeline still sending) with SQLSTATE
    40001, once."""
    import psycopg

    initialized(single)
    data = f"{single.shard}_data"
    with psycopg.connect(single.url, autocommit=True) as pg:
        pg.execute(f"CREATE SEQUENCE {single.shard}_tries")  # type: ignore[arg-type]
        pg.execute(  # type: ignore[arg-type]
            f"""CREATE FUNCTION {single.shard}_refuse() RETURNS trigger AS $$
            BEGIN
                IF nextval('{single.shard}_tries') = 3 THEN  -- not rolled back
                    RAISE EXCEPTION 'injected' USING ERRCODE = '40001';
                END IF;
                RETURN NEW;
            END $$ LANGUAGE plpgsql"""
        )
        pg.execute(  # type: ignore[arg-type]
            f"CREATE TRIGGER refuse BEFORE INSERT ON {data} "
            f"FOR EACH ROW EXECUTE FUNCTION {single.shard}_refuse()"
        )
    caplog.set_level("WARNING")
    with open_catalog(single.url, shard=single.shard) as state:
        state.debug_commit(lambda tx: [tx.set_setting(f"k{i}", "v") for i in range(1000)], user="t")
    with open_catalog(single.url, shard=single.shard) as state:
        state.open_read_only()
        assert len(state.settings()) == 1001
    assert [r.getMessage() for r in caplog.records] == []


CORRUPTIONS = [
    ("DELETE FROM catalog_fence", "catalog_fence holds 0 rows"),
    ("INSERT INTO catalog_fence VALUES (5, x'00', 'x')", "catalog_fence holds 2 rows"),
    ("UPDATE catalog_fence SET epoch = 'abc'", "catalog_fence"),
    ("DELETE FROM catalog_uppers", "catalog_uppers"),
    ("UPDATE catalog_uppers SET upper = 0", "upper 0"),
    ("DELETE FROM catalog_collections WHERE name = 'settings'", "collection id 7"),
]


@pytest.mark.parametrize(("sql", "message"), CORRUPTIONS)
def test_a_corrupt_stash_table_is_a_typed_error_and_loses_nothing(
    sql: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: TypeError or ValueError tracebacks (no fence row, no uppers, an epoch that is
    not a number), a KeyError from an edit (a collection's row gone), a second fence row
    taken silently, and, with every upper at 0, an open that took the catalog for a new
    one and retracted everything in it."""
    import sqlite3

    place = Place("sqlite", f"sqlite:///{tmp_path}/c.db")
    initialized(place)
    with sqlite3.connect(tmp_path / "c.db") as conn:
        conn.execute(sql)
        before = conn.execute("SELECT key, value, diff FROM catalog_data").fetchall()
    conn.close()
    for call in ("open", "dump", "check_open"):
        with (
            open_catalog(place.url) as state,
            pytest.raises(CatalogError, match=f"corrupt: .*{message}"),
        ):
            getattr(state, call)()
    for argv in (["dump"], ["epoch"], ["edit", "settings", '{"name": "a"}', '{"value": "b"}']):
        code, out, err = run(capsys, argv[0], place.url, *argv[1:])
        assert (code, out) == (1, "") and err.count("\n") == 1 and "corrupt" in err, (argv, err)
    with sqlite3.connect(tmp_path / "c.db") as conn:
        assert conn.execute("SELECT key, value, diff FROM catalog_data").fetchall() == before
    conn.close()


@pytest.mark.parametrize("single", ["sqlite", "postgres"], indirect=True)
def test_a_stash_made_without_a_collection_gets_it_at_its_first_write(single: Place) -> None:
    """Was: KeyError from the write (a stash made by a version that had fewer collections,
    here without ``system_configurations``, could not store one)."""
    import psycopg

    initialized(single)
    statements = [
        f"DELETE FROM {single.shard}_uppers WHERE collection_id = 8",
        f"DELETE FROM {single.shard}_collections WHERE collection_id = 8",
    ]
    if single.name == "sqlite":
        import sqlite3

        with sqlite3.connect(single.url.removeprefix("sqlite:///")) as conn:
            for sql in statements:
                conn.execute(sql)
        conn.close()
    else:
        with psycopg.connect(single.url, autocommit=True) as pg:
            for sql in statements:
                pg.execute(sql)  # type: ignore[arg-type]
    with open_catalog(single.url, shard=single.shard) as state:
        state.open()
        tx = state.transaction()
        tx.set_system_configuration("max_tables", "9")
        state.commit_transaction(tx)
    with open_catalog(single.url, shard=single.shard) as state:
        state.open_read_only()
        assert state.system_configurations() == {"max_tables": "9"}
        assert state.settings() == {"n": "v"}


def test_a_damaged_sqlite_file_is_called_corrupt_not_foreign(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: "database disk image is malformed: not a catalog" for a truncated catalog."""
    import sqlite3

    url = f"sqlite:///{tmp_path}/c.db"
    place = Place("sqlite", url)
    initialized(place)
    for i in range(20):  # a few pages
        write_raw(place, [("settings", b'{"name":"%d"}' % i, b'{"value":"%s"}' % (b"v" * 3000), 1)])
    with sqlite3.connect(tmp_path / "c.db") as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = (tmp_path / "c.db").read_bytes()
    (tmp_path / "c.db").write_bytes(data[: len(data) // 2])
    code, out, err = run(capsys, "dump", url)
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert "corrupt" in err and "not a catalog" not in err


def test_the_tool_takes_a_plain_directory_path_as_every_command_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: "unsupported store URL 'plain'", where docs/cli-conventions.md has every
    command take a plain directory path for a location (the ``location`` argument type)."""
    monkeypatch.chdir(tmp_path)
    assert run(capsys, "init", "plain")[0] == 0
    assert run(capsys, "epoch", f"file://{tmp_path}/plain")[:2] == (0, "Epoch: 1\n")
    assert run(capsys, "epoch", str(tmp_path / "plain"))[:2] == (0, "Epoch: 1\n")


def test_a_closed_persist_shard_is_a_typed_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: AssertionError (a traceback; nothing at all under ``python -O``) when the tool
    was pointed at a closed shard (a wrong ``--shard``, or the catalog closed by hand)."""
    from slatepy.persist import PersistClient

    url = f"file://{tmp_path}/p"
    with PersistClient.open(url) as client:
        writer = client.open_writer("closed")
        writer.compare_and_append([((b"k", b"v"), 0, 1)], 0, None)
        writer.expire()
    for command in ("dump", "epoch", "upgrade-check", "init"):
        code, out, err = run(capsys, command, url, "--shard", "closed")
        assert (code, out) == (1, "") and err.count("\n") == 1, (command, err)
        assert "CatalogError" in err and "closed" in err


def test_a_consensus_for_a_sql_catalog_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: ``--consensus`` (help: "persist only") silently ignored for a SQL catalog."""
    url = f"sqlite:///{tmp_path}/c.db"
    code, out, err = run(capsys, "init", url, "--consensus", "postgresql://h/db")
    assert (code, out) == (1, "") and "consensus" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("single", ["persist-file", "sqlite"], indirect=True)
def test_an_object_too_large_for_any_implementation_is_refused_when_set(
    single: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: SQL took a 70 kB setting that persist refused at commit with "update 0: key and
    value are too large together" (naming no object; the transaction spent), so the two
    held different catalogs. Now both refuse it when set, naming it, and take the largest
    that fits."""
    from slatepy.catalog.objects import MAX_KEY_BYTES, MAX_OBJECT_BYTES
    from slatepy.errors import InvalidArgument

    initialized(single)
    with open_catalog(single.url, shard=single.shard) as state:
        state.open()
        with pytest.raises(InvalidArgument, match="at most 1024 bytes"):
            state.transaction(user="u" * 1025)  # audit events repeat it
        tx = state.transaction(user="u" * 1024)
        with pytest.raises(InvalidCatalogObject, match=r'settings \{"name":"big"\}.* too large'):
            tx.set_setting("big", "x" * 70_000)
        with pytest.raises(InvalidCatalogObject, match=r"key .* too large"):
            tx.set_setting("k" * (MAX_KEY_BYTES + 1), "v")
        largest = MAX_OBJECT_BYTES - len(b'{"name":"big"}{"value":""}')
        tx.set_setting("big", "x" * largest)  # the transaction is still usable
        tx.set_setting("k" * (MAX_KEY_BYTES - len(b'{"name":""}')), "v")
        state.commit_transaction(tx)
    with open_catalog(single.url, shard=single.shard) as state:
        state.open_read_only()
        assert len(state.settings()["big"]) == largest
    value = json.dumps({"value": "x" * 70_000})
    code, out, err = run(capsys, "edit", single.url, "settings", '{"name": "b"}', value)
    assert (code, out) == (1, "") and err.count("\n") == 1 and "too large" in err


@pytest.mark.parametrize("single", ["persist-file", "sqlite"], indirect=True)
def test_two_objects_of_one_unique_name_are_corruption(single: Place) -> None:
    """Was: opened silently, the uniqueness index holding one of the two (so a rename of the
    other could make a third)."""
    initialized(single)
    rows: list[Row] = [
        ("databases", b'{"id":%d}' % i, b'{"name":"twin","url":"memory://","owner":""}', 1)
        for i in (1, 2)
    ]
    write_raw(single, rows)
    for call in ("open", "open_read_only", "check_open"):
        with (
            open_catalog(single.url, shard=single.shard) as state,
            pytest.raises(CatalogError, match=r"corrupt: databases .*'twin'.* \{\"id\":1\}"),
        ):
            getattr(state, call)()


def test_an_open_whose_since_downgrade_fails_is_open() -> None:
    """Was: the open's write landed (epoch 2, the migration, the audit event) and then the
    failed downgrade of the critical since (a compaction hint) failed the open: the state
    stayed unopened over a catalog it had changed, and a retry took epoch 3."""
    from slatepy.catalog import persist_catalog
    from slatepy.config import Settings
    from slatepy.errors import StoreUnavailable
    from slatepy.persist import PersistClient
    from slatepy.persist.location.objconsensus import ObjectConsensus
    from slatepy.store.stack import open_stack
    from slatepy.testing.persist_faults import InterceptConsensus

    store = open_stack("memory://", Settings())
    armed = [False]

    def refuse_once(op: str, key: str | None) -> None:
        if op == "compare_and_set" and armed[0]:
            armed[0] = False
            raise StoreUnavailable("injected: refused", definite=True)

    with (
        ObjectConsensus(store, min_age=0) as log,
        PersistClient.open(store, consensus=InterceptConsensus(log, before=refuse_once)) as client,
    ):
        persist_catalog(client).open()
        state = persist_catalog(client)
        storage = state._storage
        real_downgrade = storage._downgrade_since  # type: ignore[attr-defined]

        def arm_then_downgrade(since: int) -> None:
            armed[0] = True  # the next consensus write (this downgrade's) is refused
            real_downgrade(since)

        storage._downgrade_since = arm_then_downgrade  # type: ignore[attr-defined]
        state.open()
        assert state.epoch == 2 and not armed[0]
        tx = state.transaction()
        tx.set_setting("n", "v")
        state.commit_transaction(tx)
        assert state.settings() == {"n": "v"}


def test_two_persist_fence_rows_are_corruption(tmp_path: Path) -> None:
    """Was: the last one read taken silently as the epoch (the open then retracted that one
    only), as two SQL fence rows were."""
    place = Place("persist-file", f"file://{tmp_path}/p")
    initialized(place)
    write_raw(place, [("_fence", b"{}", b'{"epoch":7,"holder":"x"}', 1)])
    for call in ("open", "dump", "check_open"):
        with (
            open_catalog(place.url) as state,
            pytest.raises(CatalogError, match="corrupt: it holds 2 fence rows"),
        ):
            getattr(state, call)()


@pytest.mark.parametrize("single", ["postgres"], indirect=True)
def test_serialization_failures_without_end_are_a_typed_error_and_lose_nothing(
    single: Place,
) -> None:
    """Was: psycopg's own SerializationFailure (a traceback from the CLI) once the stash's
    20 immediate retries were spent. Now a CatalogContention (nothing written), which a
    debug edit retries until its timeout as a lost race, and the leader stays usable."""
    import psycopg

    from slatepy.catalog.errors import CatalogContention

    initialized(single)
    refuse = f"""CREATE FUNCTION {single.shard}_refuse() RETURNS trigger AS $$
        BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END $$ LANGUAGE plpgsql"""
    trigger = (
        f"CREATE TRIGGER refuse BEFORE INSERT ON {single.shard}_data "
        f"FOR EACH ROW EXECUTE FUNCTION {single.shard}_refuse()"
    )
    with open_catalog(single.url, shard=single.shard) as state:
        state.open()
        with psycopg.connect(single.url, autocommit=True) as pg:
            pg.execute(refuse)  # type: ignore[arg-type]
            pg.execute(trigger)  # type: ignore[arg-type]
        tx = state.transaction()
        tx.set_setting("m", "w")
        with pytest.raises(CatalogContention, match="serialization"):
            state.commit_transaction(tx)
        with (
            open_catalog(single.url, shard=single.shard) as editor,
            pytest.raises(CatalogContention),
        ):
            editor.debug_commit(lambda t: t.set_setting("e", "x"), user="t", timeout=0.2)
        with psycopg.connect(single.url, autocommit=True) as pg:
            pg.execute(f"DROP TRIGGER refuse ON {single.shard}_data")  # type: ignore[arg-type]
        tx = state.transaction()
        tx.set_setting("m", "w")
        state.commit_transaction(tx)  # still the leader: nothing was written
        assert state.settings() == {"m": "w", "n": "v"}


@pytest.mark.parametrize("single", ["postgres"], indirect=True)
def test_a_role_without_privileges_is_told_so_not_that_it_is_no_catalog(
    single: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: "permission denied for table ...: not a catalog" (every ProgrammingError was
    taken for tables of another program)."""
    import psycopg

    with psycopg.connect(single.url, autocommit=True) as pg:
        pg.execute(
            "DO $$ BEGIN CREATE ROLE weak LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
    weak = single.url.replace("postgres@", "weak@", 1)
    assert weak != single.url
    code, out, err = run(capsys, "init", weak, "--shard", single.shard)
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert "StoreUnavailable" in err and "permission denied" in err and "not a catalog" not in err
    initialized(single)
    code, out, err = run(capsys, "dump", weak, "--shard", single.shard)
    assert (code, out) == (1, "") and "permission denied" in err and "not a catalog" not in err


@pytest.mark.parametrize("single", ["postgres"], indirect=True)
def test_a_lost_commit_reply_is_an_indefinite_error(single: Place) -> None:
    """Was: StoreUnavailable with ``definite=True`` ("certainly had no effect") when the
    connection was lost at the COMMIT of an open that had landed (its epoch was taken)."""
    from slatepy.errors import StoreUnavailable
    from slatepy.testing.persist_faults import ProxyWriteFaults

    initialized(single)
    server = single.url.rsplit(":", 1)[1].split("/")[0]
    proxy = ProxyWriteFaults(int(server))
    try:
        url = single.url.replace(f":{server}/", f":{proxy.port}/")
        with open_catalog(url, shard=single.shard) as state:
            state.check_open()  # connected before the fault is armed
            storage = state._storage
            real_compact = storage._compact  # type: ignore[attr-defined]

            def compact_then_lose_the_commits_reply(cur: object) -> None:
                real_compact(cur)
                proxy.arm("lost_reply")  # the next request is the COMMIT

            storage._compact = compact_then_lose_the_commits_reply  # type: ignore[attr-defined]
            with pytest.raises(StoreUnavailable) as info:
                state.open()
            assert info.value.definite is False
        proxy.heal()
        with open_catalog(single.url, shard=single.shard) as state:
            assert state.current().epoch == 2  # it had landed
    finally:
        proxy.close()


def test_an_edit_that_changes_nothing_warns_of_no_fence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: "a leader still running there is fenced by this change" for an edit or delete
    that wrote nothing (the same value, a missing key), which fences nobody."""
    url = f"sqlite:///{tmp_path}/c.db"
    initialized(Place("sqlite", url))
    with open_catalog(url) as leader:
        leader.open()
        for argv in (
            ["delete", url, "settings", '{"name": "missing"}'],
            ["edit", url, "settings", '{"name": "n"}', '{"value": "v"}'],
        ):
            code, out, err = run(capsys, *argv)
            assert code == 0 and out.startswith("previous value:") and err == "", (argv, err)
        leader.confirm_leadership()  # nothing fenced it
        code, _, err = run(capsys, "edit", url, "settings", '{"name": "n"}', '{"value": "w"}')
        assert code == 0 and "fenced by this change" in err
