"""The persist client: locations, sharing between handles, closing, finalization
(RFC 0015 §9, §10)."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import threading
import time
from pathlib import Path

import pytest

from slatepy.config import Settings
from slatepy.errors import ClosedError, NotFound
from slatepy.persist import (
    PersistClient,
    PersistSettings,
    Progress,
    UpperMismatch,
    UsageError,
    aio,
)
from slatepy.persist.location.objconsensus import ObjectConsensus
from slatepy.store.metrics import MetricsStore
from slatepy.store.stack import open_stack
from tests.persist.handles_kit import (  # noqa: F401 (fixtures)
    SHARD,
    TEST_SETTINGS,
    client_fixture,
    nothing_committed,
    state_of,
    url_fixture,
    validate_states,
)


def test_memory_locations_are_private_to_one_client() -> None:
    with PersistClient.open("memory://") as a, PersistClient.open("memory://") as b:
        a.open_writer(SHARD).compare_and_append([], 0, 3)
        assert a.open_writer(SHARD).upper == 3  # handles of one client share it
        assert b.open_writer(SHARD).upper == 0


def test_file_locations_are_shared_by_clients(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    with PersistClient.open(url) as a, PersistClient.open(url) as b:
        a.open_writer(SHARD).compare_and_append([((b"k", b"v"), 1, 1)], 0, 3)
        assert b.open_leased_reader(SHARD).snapshot(2) == [((b"k", b"v"), 2, 1)]
        assert b.list_shards() == [SHARD]


def test_a_closed_client_refuses_new_handles(url: str) -> None:
    with PersistClient.open(url) as client:
        write = client.open_writer(SHARD)
    client.close()  # idempotent
    with pytest.raises(ClosedError):
        client.open_writer(SHARD)
    with pytest.raises(ClosedError):
        write.compare_and_append([], 0, 1)


def test_a_consensus_instance_is_used_as_is_and_left_open() -> None:
    store = open_stack("memory://", Settings())
    with ObjectConsensus(store, min_age=0) as log:
        with PersistClient.open(store, consensus=log) as client:
            client.open_writer(SHARD).compare_and_append([], 0, 1)
        head = log.head(SHARD)  # still open
        # 2: the close expired the writer (issue 32: no registration is left behind).
        assert head is not None and head.seqno == 2


def test_invalid_shard_ids_are_usage_errors(client: PersistClient) -> None:
    with nothing_committed(client):
        for bad in ("", "a/b", ".hidden", 7):
            with pytest.raises(UsageError):
                client.open_writer(bad)  # type: ignore[arg-type]


def close_everything(client: PersistClient) -> None:
    client.open_writer(SHARD).compare_and_append([((b"k", b"v"), 0, 1)], 0, None)
    read = client.open_leased_reader(SHARD)
    read.downgrade_since(None)
    read.expire()


def test_finalize_needs_since_and_upper_none(client: PersistClient) -> None:
    client.open_writer(SHARD).compare_and_append([], 0, None)
    with nothing_committed(client), pytest.raises(UsageError, match="since and upper both None"):
        client.finalize_shard(SHARD)  # since is still 0
    read = client.open_leased_reader(SHARD)
    read.downgrade_since(None)
    client.finalize_shard(SHARD)
    assert state_of(client).finalized


def test_finalize_with_an_open_upper_is_refused(client: PersistClient) -> None:
    client.open_critical_since(SHARD, "c").compare_and_downgrade_since(b"", b"", None)
    with pytest.raises(UsageError):
        client.finalize_shard(SHARD)
    assert not state_of(client).finalized


def test_finalize_is_idempotent_and_then_nothing_is_written(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    close_everything(client)
    client.finalize_shard(SHARD)
    seqno = state_of(client).seqno
    client.finalize_shard(SHARD)
    assert state_of(client).seqno == seqno
    with pytest.raises(UpperMismatch) as info:
        write.compare_and_append([], 0, 1)
    assert info.value.current is None
    for open_handle in (
        lambda: client.open_writer(SHARD),
        lambda: client.open_leased_reader(SHARD),
        lambda: client.open_critical_since(SHARD, "c"),
    ):
        with pytest.raises(UsageError, match="finalized"):
            open_handle()
    assert state_of(client).seqno == seqno


def test_settings_reach_the_machines(client: PersistClient) -> None:
    assert client.machine(SHARD).settings is TEST_SETTINGS


def test_the_asyncio_facade_mirrors_the_api() -> None:
    async def scenario() -> None:
        async with await aio.PersistClient.open("memory://", settings=TEST_SETTINGS) as client:
            write = await client.open_writer(SHARD)
            read = await client.open_leased_reader(SHARD)
            listen = await read.listen(0)
            await write.compare_and_append([((b"a", b"v"), 0, 1)], 0, 2)
            batch = await write.batch([((b"b", b"v"), 2, 1)], 2, 3)
            await write.compare_and_append_batch([batch], 2, 3)
            builder = write.builder(3)
            await builder.add(b"c", b"v", 3, 1)
            await write.compare_and_append_batch([await builder.finish(None)], 3, None)
            assert write.upper is None and await write.fetch_recent_upper() is None
            assert await read.snapshot(5) == [
                ((b"a", b"v"), 5, 1),
                ((b"b", b"v"), 5, 1),
                ((b"c", b"v"), 5, 1),
            ]
            events = [event async for event in listen]
            assert events[-1] == Progress(None)
            since = await client.open_critical_since(SHARD, "c")
            assert await since.compare_and_downgrade_since(b"", b"1", None) is None
            assert await read.downgrade_since(None) is None
            await read.expire()
            await client.finalize_shard(SHARD)
            assert await client.list_shards() == [SHARD]

    asyncio.run(scenario())


def heartbeat_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "slatepy-persist-heartbeats"]


def test_heartbeats_keep_idle_handles_alive_and_stop_with_the_client(url: str) -> None:
    settings = PersistSettings(
        reader_lease=0.4,
        writer_lease=0.4,
        batch_lease=10.0,
        consensus_min_age=1.0,
        allow_short_leases=True,
    )
    with PersistClient.open(url, settings=settings) as client:
        write = client.open_writer(SHARD)
        read = client.open_leased_reader(SHARD)
        write.compare_and_append([((b"k", b"v"), 0, 1)], 0, 1)
        time.sleep(1.0)  # over two leases, idle but for the heartbeats
        write.compare_and_append([], 1, 2)  # would expire lapsed leases
        assert read.reader_id in state_of(client).leased_readers
        assert read.snapshot(1) == [((b"k", b"v"), 1, 1)]
        assert heartbeat_threads()
    assert not heartbeat_threads()


def test_a_reader_heartbeat_holds_the_seqno_of_a_snapshot_in_progress(
    client: PersistClient,
) -> None:
    write = client.open_writer(SHARD)
    write.compare_and_append([((b"k", b"v"), 0, 1)], 0, 1)
    read = client.open_leased_reader(SHARD)
    stream = read.snapshot_iter(0)
    pinned = state_of(client).seqno
    for upper in range(2, 5):
        write.compare_and_append([], upper - 1, upper)
    read.heartbeat()
    assert state_of(client).leased_readers[read.reader_id].seqno == pinned
    assert list(stream) == [((b"k", b"v"), 0, 1)]  # exhausted: the hold is released
    read.heartbeat()
    held = state_of(client).leased_readers[read.reader_id].seqno
    assert held > pinned


def requests(client: PersistClient) -> dict[str, int]:
    assert isinstance(client.blob, MetricsStore)
    return {kind: stats.requests for kind, stats in client.blob.metrics.snapshot().items()}


def test_requests_per_operation_on_the_object_store_consensus(url: str) -> None:
    # No background merges: they would add their own requests to the counts.
    quiet = dataclasses.replace(TEST_SETTINGS, compaction="off")
    with PersistClient.open(url, settings=quiet) as client:
        write = client.open_writer(SHARD)
        write.compare_and_append([((b"k", b"v"), 0, 1)], 0, 1)  # registers, warms the cache
        before = requests(client)
        write.compare_and_append([((b"k", b"v"), 1, 1)], 1, 2)  # small, inline
        after = requests(client)
        assert {k: after[k] - before.get(k, 0) for k in after} == {
            **{k: 0 for k in after},
            "put": 1,
        }
        before = requests(client)
        assert write.fetch_recent_upper() == 2
        after = requests(client)
        assert {k: after[k] - before.get(k, 0) for k in after} == {
            **{k: 0 for k in after},
            "list": 1,
        }


def test_close_wakes_a_blocked_listen_with_closed_error(url: str) -> None:
    client = PersistClient.open(url, settings=TEST_SETTINGS)
    listen = client.open_leased_reader(SHARD).listen(0)
    raised: list[BaseException] = []

    def block() -> None:
        try:
            listen.fetch_next()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=block)
    thread.start()
    time.sleep(0.05)
    client.close()
    thread.join(10)
    assert not thread.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], ClosedError)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_open_close_cycles_leave_no_threads_or_files_behind(url: str) -> None:
    """100 cycles of client + writer + leased reader + listen (RFC 0015 §13.4 hygiene)."""

    def cycle(n: int) -> None:
        with PersistClient.open(url, settings=TEST_SETTINGS) as client:
            write = client.open_writer(SHARD)
            upper = write.fetch_recent_upper() or 0
            write.compare_and_append([((b"k%d" % n, b"v"), upper, 1)], upper, upper + 1)
            read = client.open_leased_reader(SHARD)
            listen = read.listen(upper)
            listen.fetch_next(timeout=0.0)
            assert read.snapshot(upper)
            listen.close()
            read.expire()
            write.expire()

    cycle(0)  # first-use imports, pools and caches are not leaks
    gc.collect()
    threads, fds = threading.active_count(), open_fds()
    for n in range(1, 100):
        cycle(n)
    gc.collect()
    assert threading.active_count() <= threads, [t.name for t in threading.enumerate()]
    assert open_fds() <= fds


def test_open_creates_a_file_location_unless_told_not_to(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        PersistClient.open(f"file://{tmp_path}/absent", create=False)
    assert not (tmp_path / "absent").exists()
    with PersistClient.open(f"file://{tmp_path}/new") as client:
        client.open_writer("s").compare_and_append([((b"k", b"v"), 0, 1)], 0, 1)
    with PersistClient.open(f"file://{tmp_path}/new", create=False) as client:
        assert client.open_leased_reader("s").snapshot(0) == [((b"k", b"v"), 0, 1)]


def test_a_writers_client_merges_its_shard_in_the_background(tmp_path: Path) -> None:
    """With ``compaction="on"`` (the default) the client that writes a shard runs the merges
    its appends claim, so the trace stays short without anyone asking."""
    with PersistClient.open(f"file://{tmp_path}/bg") as client:
        write = client.open_writer("s")
        for t in range(40):
            write.compare_and_append([((b"k%d" % t, b"v"), t, 1)], t, t + 1)
        machine = client.machine("s")
        deadline = time.monotonic() + 20
        # 40 single-update appends merge 8 at a time: 5 batches of 8 (not 40 batches).
        while len(machine.fetch().trace) > 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(machine.fetch().trace) == 5
        rows = client.open_leased_reader("s").snapshot(39)
        assert sorted(rows) == sorted(((b"k%d" % t, b"v"), 39, 1) for t in range(40))
