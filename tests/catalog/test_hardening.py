"""Regression tests of the catalog's review (RFC 0028 addendum B): threads, things that are
not catalogs, malformed URLs, secrets in errors, id allocators, the audit rule, the stash's
nonce, failed migrations and edits of an old catalog. Each failed before its fix."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from slatepy.catalog import (
    CatalogError,
    IncompatibleCatalogVersion,
    InvalidCatalogObject,
    ReadOnlyCatalog,
    Sink,
    Source,
    StorageUsage,
    open_catalog,
    strip_password,
)
from slatepy.catalog.open import open_storage
from slatepy.catalog.snapshot import diff_objects
from slatepy.catalog.storage import Row
from slatepy.catalog.upgrade import v1
from slatepy.cli.main import main
from slatepy.errors import FencedError, StoreUnavailable, TransactionConflict
from slatepy.persist import PersistClient
from tests.catalog.conftest import Place
from tests.catalog.test_open import _drop


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["catalog", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("single", ["persist-file", "sqlite"], indirect=True)
def test_a_commit_losing_to_another_threads_conflicts_and_never_fences_the_leader(
    single: Place,
) -> None:
    state = single.state()
    state.open()
    first, second = state.transaction(), state.transaction()
    first.set_setting("first", "1")
    second.set_setting("second", "2")
    outcome: list[BaseException | None] = []
    threads: list[threading.Thread] = []

    def commit_second() -> None:
        try:
            state.commit_transaction(second)
            outcome.append(None)
        except BaseException as exc:  # recorded for the assertion below
            outcome.append(exc)

    storage = state._storage
    real_write = storage.write

    def write_after_the_other_thread(rows: list[Row], **kwargs: object) -> int:
        # The other thread commits while this commit is between its check and its write
        # (before the fix it wrote first and this one was fenced by its own state).
        storage.write = real_write  # type: ignore[method-assign]
        threads.append(threading.Thread(target=commit_second))
        threads[0].start()
        threads[0].join(timeout=0.5)
        return real_write(rows, **kwargs)  # type: ignore[arg-type]

    storage.write = write_after_the_other_thread  # type: ignore[method-assign]
    state.commit_transaction(first)
    threads[0].join(timeout=10)
    (error,) = outcome
    assert isinstance(error, TransactionConflict)
    state.confirm_leadership()  # still the leader
    assert state.settings() == {"first": "1"}


def test_a_persist_shard_that_is_not_a_catalog_is_neither_read_nor_edited(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path}/p"
    with PersistClient.open(url) as client:
        writer = client.open_writer("catalog")
        writer.compare_and_append([((b"hello", b"world"), 0, 1)], 0, 1)
        writer.expire()
    for argv in (
        ["dump", url],
        ["epoch", url],
        ["edit", url, "settings", '{"name": "a"}', '{"value": "b"}'],
    ):
        code, out, err = run(capsys, *argv)
        assert (code, out) == (1, ""), argv
        assert err.count("\n") == 1 and "not a catalog" in err
    with PersistClient.open(url) as client:
        writer = client.open_writer("catalog")
        assert writer.fetch_recent_upper() == 1  # the edit wrote nothing
        writer.expire()
    with open_catalog(url) as state, pytest.raises(CatalogError, match="not a catalog"):
        state.open()


def test_a_sqlite_file_that_is_no_database_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "text.db"
    path.write_text("hello\n")
    code, out, err = run(capsys, "dump", f"sqlite:///{path}")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and "not a catalog" in err
    assert path.read_text() == "hello\n"


def test_reading_a_sqlite_database_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    before = path.read_bytes()
    for command in ("dump", "epoch", "upgrade-check"):
        assert run(capsys, command, f"sqlite:///{path}")[0] == 1
    assert path.read_bytes() == before  # was: switched to WAL mode by a read
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def test_a_malformed_postgres_url_is_one_line_without_its_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for url in (
        "postgresql://u:hunter2@127.0.0.1:1/db?bogus=1",
        "postgresql://u:hunter2@127.0.0.1:1/db",  # nothing listens: a multi-line error
    ):
        code, out, err = run(capsys, "dump", url)
        assert (code, out) == (1, ""), err
        assert err.count("\n") == 1 and "hunter2" not in err


def test_a_value_that_does_not_fit_is_refused_without_printing_its_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    run(capsys, "init", url)
    value = '{"name": "a", "url": "s3://key:hunter2@bucket", "bogus": 1}'
    code, out, err = run(capsys, "edit", url, "databases", '{"id": 1}', value)
    assert (code, out) == (1, "")
    assert "does not fit" in err and "hunter2" not in err


def test_libpq_key_value_connection_strings_lose_their_password() -> None:
    assert strip_password("host=h user=u password=hunter2 dbname=d") == "host=h user=u dbname=d"
    assert strip_password("password='a b\\' c' host=h") == "host=h"
    assert strip_password("/data/x=1") == "/data/x=1"
    source = Source("s", "postgres", connection="host=h PASSWORD = hunter2 dbname=d")
    assert "hunter2" not in source.connection


def test_id_allocators_never_rewind_and_a_create_never_replaces(place: Place) -> None:
    state = place.make()
    state.open()
    tx = state.transaction()
    tx.create_database("a", "memory://")
    tx.set("databases", {"id": 2}, {"name": "by-hand", "url": "memory://"})
    state.commit_transaction(tx)
    tx = state.transaction()
    with pytest.raises(InvalidCatalogObject, match="never moves backwards"):
        tx.set("id_allocators", {"name": "database"}, {"next_id": 1})
    with pytest.raises(InvalidCatalogObject, match="never moves backwards"):
        tx.delete("id_allocators", {"name": "database"})
    with pytest.raises(InvalidCatalogObject, match=r"id 2 .* is taken"):
        tx.create_database("b", "memory://")  # was: replaced "by-hand"
    tx.set("id_allocators", {"name": "database"}, {"next_id": 3})  # forwards: allowed
    assert tx.create_database("b", "memory://") == 3
    state.commit_transaction(tx)
    assert [v["name"] for _, v in state.entries("databases")] == ["a", "by-hand", "b"]


def test_every_committed_change_appends_an_audit_event(place: Place) -> None:
    state = place.make()
    state.open()
    tx = state.transaction(user="ids")
    tx.allocate_ids("sink", 3)  # an allocation alone was a change without an event
    state.commit_transaction(tx)
    tx = state.transaction(user="usage")
    tx.record_storage_usage(StorageUsage("s", "memory://", 1, 0))
    state.commit_transaction(tx)
    events = [(v["event_type"], v["collection"], v["user"]) for _, v in state.entries("audit_log")]
    assert events[1:] == [
        ("update", "id_allocators", "ids"),
        ("update", "id_allocators", "usage"),
        ("create", "storage_usage", "usage"),
    ]


def test_a_debug_edit_of_an_id_allocator_is_audited(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    run(capsys, "init", url)
    code, out, _ = run(capsys, "edit", url, "id_allocators", '{"name": "sink"}', '{"next_id": 9}')
    assert (code, out) == (0, 'previous value: {"next_id": 1}\n')
    with open_catalog(url) as state:
        (_, event), = state.audit_log()[-1:]  # fmt: skip
    assert (event.event_type, event.collection, event.key) == (
        "update",
        "id_allocators",
        {"name": "sink"},
    )


@pytest.mark.parametrize("single", ["sqlite"], indirect=True)
def test_a_leader_that_reads_a_catalog_made_again_is_still_fenced(single: Place) -> None:
    old = single.state()
    old.open()
    _drop(single)
    new = single.state()
    new.open()
    old.dump()  # a read: it used to adopt the new catalog's nonce as its own
    tx = old.transaction()
    tx.set_setting("a", "b")
    with pytest.raises(FencedError):
        old.commit_transaction(tx)
    with pytest.raises(FencedError):
        old.confirm_leadership()
    assert new.settings() == {}


def _write_v1(url: str, source: bytes) -> None:
    objects = v1.initial_objects()
    objects["sources"] = {b'{"id":1}': source}
    storage = open_storage(url)
    try:
        storage.write(diff_objects({}, objects), expected_upper=0, epoch=0, new_epoch=1)
    finally:
        storage.close()


def test_a_migration_that_fails_is_a_typed_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    _write_v1(url, b'{"name": "s", "kind": "k", "surprise": 1}')
    code, out, err = run(capsys, "upgrade-check", url)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and "from version 1 to 2 failed" in err
    with open_catalog(url) as state, pytest.raises(CatalogError, match="failed"):
        state.open()


def test_the_debug_tool_edits_no_objects_of_another_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    old = v1.SourceV1("s", "k", url="postgresql://u@h/d")
    _write_v1(url, msgspec.json.encode(old))
    new = '{"name": "s", "kind": "k", "connection": "postgresql://u@h/d"}'
    code, out, err = run(capsys, "edit", url, "sources", '{"id": 1}', new)
    assert (code, out) == (1, "")
    assert "IncompatibleCatalogVersion" in err and "version 1" in err
    # Config (and id allocators) are every version's: the tool may still repair them.
    key, value = '{"key": "deploy_generation"}', '{"value": 3}'
    assert run(capsys, "edit", url, "config", key, value)[0] == 0
    with open_catalog(url) as state:
        state.open()  # the v1 source migrates (before the fix: a v2 value broke it)
        assert state.sources()[0][1].connection == "postgresql://u@h/d"
        assert state.deploy_generation() == 3
    with open_catalog(url) as state, pytest.raises(IncompatibleCatalogVersion):
        state.debug_commit(lambda tx: tx.set_config("catalog_version", 1), user="t")
        state.debug_commit(lambda tx: tx.set_setting("a", "b"), user="t")


def test_the_shadow_has_the_typed_reads(tmp_path: Path) -> None:
    from slatepy.catalog import open_shadow

    with open_shadow(
        open_catalog(f"sqlite:///{tmp_path}/a.db"), open_catalog(f"file://{tmp_path}/p")
    ) as shadow:
        shadow.open()
        tx = shadow.transaction()
        tx.create_database("a", "memory://")
        shadow.commit_transaction(tx)
        assert [d.name for _, d in shadow.databases()] == ["a"]
        assert shadow.id_allocators()["database"] == 2


def test_a_password_stored_by_version_1_is_never_dumped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    _write_v1(url, msgspec.json.encode(v1.SourceV1("s", "k", url="postgresql://u:hunter2@h/d")))
    code, out, _ = run(capsys, "dump", url)
    assert code == 0 and "hunter2" not in out and "postgresql://u@h/d" in out


def test_an_opened_state_makes_no_debug_edits(place: Place) -> None:
    leader = place.make()
    leader.open()
    reader = place.make()
    reader.open_read_only()
    for state in (leader, reader):
        target = getattr(state, "primary", state)  # the shadow has no debug edits
        with pytest.raises(ReadOnlyCatalog):
            target.debug_commit(lambda tx: tx.set_setting("a", "b"), user="t")
    leader.confirm_leadership()  # not fenced: nothing was written
    assert leader.settings() == {}


def test_a_dump_target_that_cannot_be_written_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    run(capsys, "init", url)
    code, out, err = run(capsys, "dump", url, "--target", str(tmp_path / "no" / "dump.json"))
    assert (code, out) == (1, "") and err.count("\n") == 1 and "--target" in err


@pytest.mark.parametrize("landed", [True, False])
@pytest.mark.parametrize("single", ["persist-file", "sqlite"], indirect=True)
def test_an_open_whose_write_fails_opens_nothing_and_can_be_retried(
    single: Place, landed: bool
) -> None:
    """A crash (here: an error) in an open after or before its one write landed: the state
    stays unopened, a retry takes a newer epoch, the older leader is fenced either way."""
    old = single.state()
    old.open()
    state = single.state()
    storage = state._storage
    real_write = storage.write

    def fail(rows: list[Row], **kwargs: object) -> int:
        storage.write = real_write  # type: ignore[method-assign]
        if landed:
            real_write(rows, **kwargs)  # type: ignore[arg-type]
        raise StoreUnavailable("the reply was lost")

    storage.write = fail  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable):
        state.open()
    assert state.epoch is None
    with pytest.raises(CatalogError, match="not open"):
        state.transaction()
    state.open()
    assert state.epoch == (3 if landed else 2)
    with pytest.raises(FencedError):
        old.confirm_leadership()
    opens = [(v["event_type"], v["key"]["epoch"]) for _, v in state.entries("audit_log")]
    assert opens == [("initialize", 1), *([("open", 2)] if landed else []), ("open", state.epoch)]


def test_secret_options_are_not_stored() -> None:
    source = Source("s", "k", options={"user": "u", "Password": "hunter2", "dsn": "x://u:pw@h"})
    assert source.options == {"user": "u", "dsn": "x://u@h"}


def test_typed_reads_of_an_unmigrated_catalog_are_a_typed_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    _write_v1(url, msgspec.json.encode(v1.SourceV1("s", "k", url="postgresql://u@h/d")))
    with open_catalog(url) as state:
        assert state.deploy_generation() == 0  # readable before opening, at any version
        with pytest.raises(CatalogError, match="cannot read"):
            state.sources()
    with pytest.raises(CatalogError, match="closed"):
        state.is_initialized()


def test_a_corrupt_stash_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    run(capsys, "init", url)
    with sqlite3.connect(tmp_path / "c.db") as conn:  # a row counted twice
        conn.execute("INSERT INTO catalog_data SELECT * FROM catalog_data LIMIT 1")
    conn.close()
    code, out, err = run(capsys, "dump", url)
    assert (code, out) == (1, "") and err.count("\n") == 1 and "corrupt" in err


def test_a_persist_read_racing_an_open_reads_the_newer_catalog(tmp_path: Path) -> None:
    """An open lands between a read's state fetch and its part reads (moving the since past
    that state's upper; before addendum E, between reading the upper and registering the
    reader): the read still reads its state, the open that made it loses the upper and
    retries."""
    url = f"file://{tmp_path}/p"
    with open_catalog(url) as first:
        first.open()
    state = open_catalog(url)
    machine = state._storage._client.machine("catalog")  # type: ignore[attr-defined]
    real_fetch = machine.fetch

    def fetch_then_an_open(*, maintain: bool = True) -> Any:
        machine.fetch = real_fetch  # type: ignore[method-assign]
        found = real_fetch(maintain=maintain)
        with open_catalog(url) as other:  # moves the since past the upper just read
            other.open()
        return found

    machine.fetch = fetch_then_an_open  # type: ignore[method-assign]
    state.open()  # was: persist's SinceError, where an open should simply win or retry
    assert state.epoch == 3
    state.close()


@pytest.mark.parametrize("single", ["sqlite", "postgres"], indirect=True)
def test_tables_of_the_catalogs_names_that_are_not_a_catalog_are_refused(single: Place) -> None:
    import psycopg

    sql = f"CREATE TABLE {single.shard}_uppers (something text)"
    if single.name == "sqlite":
        with sqlite3.connect(single.url.removeprefix("sqlite:///")) as conn:
            conn.execute(sql)
        conn.close()
    else:
        with psycopg.connect(single.url, autocommit=True) as pg:
            pg.execute(sql)  # type: ignore[arg-type]
    state = single.state()
    for call in (state.dump, state.check_open, state.open):
        with pytest.raises(CatalogError, match="not a catalog"):
            call()


def test_a_transaction_made_while_a_commit_is_applied_reads_that_commit(tmp_path: Path) -> None:
    """No lost update: a transaction made between a commit's write and its cache update used
    to get the new upper with the old cache, read stale values and commit anyway."""
    state = open_catalog(f"sqlite:///{tmp_path}/c.db")
    state.open()
    seen: list[object] = []
    threads: list[threading.Thread] = []
    cache = state._cache
    real_apply = cache.apply

    def read_in_another_thread() -> None:
        tx = state.transaction()
        seen.append(tx.get("settings", {"name": "n"}))

    def apply_after_a_read(rows: list[Row]) -> None:
        cache.apply = real_apply  # type: ignore[method-assign]
        threads.append(threading.Thread(target=read_in_another_thread))
        threads[0].start()
        threads[0].join(timeout=0.5)
        real_apply(rows)

    cache.apply = apply_after_a_read  # type: ignore[method-assign]
    tx = state.transaction()
    tx.set_setting("n", "1")
    state.commit_transaction(tx)
    threads[0].join(timeout=10)
    assert seen == [{"value": "1"}]
    state.close()


def test_an_unparsable_url_is_one_line_without_its_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert strip_password("postgresql://u:hunter2@[::1/db") == "postgresql://u@[::1/db"
    code, out, err = run(capsys, "dump", "postgresql://u:hunter2@[::1/db")
    assert (code, out) == (1, "") and err.count("\n") == 1 and "hunter2" not in err


def test_persists_errors_do_not_show_the_urls_password(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "dump", "file://u:hunter2@/no/such/place")
    assert (code, out) == (1, "") and "hunter2" not in err


def test_secrets_in_query_parameters_and_options_are_not_stored() -> None:
    signed = "https://acct.blob.core.windows.net/c?sv=2022&sig=SIGNED&se=2030"
    assert strip_password(signed) == "https://acct.blob.core.windows.net/c?sv=2022&se=2030"
    assert strip_password("az://c/p?sas_token=TOKEN&x=1") == "az://c/p?x=1"
    sink = Sink("k", "kv", "s3://b/p?aws_secret_access_key=S", {"aws_session_token": "T"})
    assert (sink.target, sink.options) == ("s3://b/p", {})
