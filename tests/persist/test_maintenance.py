"""The maintenance runner (RFC 0015 §8.3): merges and GC on one background thread, fed by
``Maintenance`` records and by scans of watched writers' claims; failures logged and
retried, never raised into a writer; a bounded queue; ``close`` stops a running merge."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slatepy.errors import StoreUnavailable
from slatepy.persist import PersistClient, PersistSettings
from slatepy.persist import compactor as compactor_module
from slatepy.persist.location.consensus import Consensus
from slatepy.persist.machine import Turns
from slatepy.persist.maintenance import MaintenanceRunner
from slatepy.persist.state.outcome import Maintenance, MergeReq
from slatepy.persist.write import SLOWDOWN_BATCHES
from slatepy.store.base import ObjectStore
from slatepy.testing.intercept import InterceptStore
from tests.persist.compaction_kit import (
    HOLLOW,
    claims,
    is_output,
    manual,
    part_paths,
    referenced,
    snapshot,
    upd,
)
from tests.persist.handles_kit import (  # noqa: F401 (fixtures)
    SHARD,
    state_of,
    url_fixture,
    validate_states,
)


def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def test_submitted_merges_run_in_the_background(url: str) -> None:
    with manual(PersistClient.open(url, settings=HOLLOW)) as client:
        runner = MaintenanceRunner(client._tables, poll_interval=0.05)
        try:
            write = client.open_writer(SHARD)
            write.compare_and_append([upd(b"a", 0)], 0, 1)
            write.compare_and_append([upd(b"b", 1)], 1, 2)
            requests = tuple(claims(state_of(client), write.writer_id))
            runner.submit(client.machine(SHARD), write.writer_id, Maintenance(merges=requests))
            eventually(lambda: len(state_of(client).trace) == 1)
            assert snapshot(client, 1) == [upd(b"a", 1), upd(b"b", 1)]
        finally:
            runner.close()


def test_a_watched_writers_claims_and_due_gc_run_without_being_submitted(url: str) -> None:
    settings = PersistSettings(
        batch_lease=10.0, consensus_min_age=1.0, allow_short_leases=True, gc_min_versions=4
    )
    with manual(PersistClient.open(url, settings=settings)) as client:
        runner = MaintenanceRunner(client._tables, poll_interval=0.02)
        try:
            write = client.open_writer(SHARD)
            runner.watch(client.machine(SHARD), write.writer_id, owner=write)
            for t in range(8):
                write.compare_and_append([upd(b"k%d" % t, t)], t, t + 1)
            eventually(lambda: not state_of(client).merges and state_of(client).last_gc_seqno > 0)
            assert len(state_of(client).trace) <= 2
            assert snapshot(client, 7) == [upd(b"k%d" % t, 7) for t in range(8)]
        finally:
            runner.close()


def test_a_failed_merge_is_logged_and_retried_and_never_reaches_the_writer(
    store: ObjectStore, log: Consensus, caplog: pytest.LogCaptureFixture
) -> None:
    failures = [2]

    def before_put(path: str) -> None:
        if is_output(path) and failures[0]:
            failures[0] -= 1
            raise StoreUnavailable("injected: output PUT failed", definite=True)

    flaky = InterceptStore(store, before_put=before_put)
    with manual(PersistClient.open(flaky, consensus=log, settings=HOLLOW)) as client:
        runner = MaintenanceRunner(client._tables, poll_interval=0.02, retry_after=0.05)
        try:
            write = client.open_writer(SHARD)
            runner.watch(client.machine(SHARD), write.writer_id, owner=write)
            with caplog.at_level(logging.WARNING, logger="slatepy.persist.maintenance"):
                write.compare_and_append([upd(b"a", 0)], 0, 1)
                write.compare_and_append([upd(b"b", 1)], 1, 2)  # claims; no error here
                eventually(lambda: len(state_of(client).trace) == 1)
            assert failures == [0]
            assert any("retrying later" in r.getMessage() for r in caplog.records)
        finally:
            runner.close()


def test_the_queue_is_bounded_and_submit_never_blocks(store: ObjectStore, log: Consensus) -> None:
    entered, release = threading.Event(), threading.Event()

    def before_list(prefix: str) -> None:
        if "/part/" in prefix:
            entered.set()
            release.wait(10)

    blocking = InterceptStore(store, before_list=before_list)
    with manual(PersistClient.open(blocking, consensus=log, settings=HOLLOW)) as client:
        runner = MaintenanceRunner(client._tables, queue_limit=2, poll_interval=60)
        try:
            write = client.open_writer(SHARD)
            write.compare_and_append([upd(b"a", 0)], 0, 1)
            machine = client.machine(SHARD)
            runner.submit(machine, write.writer_id, Maintenance(gc=True))
            entered.wait(10)  # the thread is busy in a GC pass
            state = state_of(client)
            requests = tuple(MergeReq(merge_id, state.trace) for merge_id in range(1, 6))
            started = time.monotonic()
            runner.submit(machine, write.writer_id, Maintenance(merges=requests))
            assert time.monotonic() - started < 0.5
            assert len(runner._queue) == 2
        finally:
            release.set()
            runner.close()


def test_close_stops_a_running_merge_and_deletes_its_outputs(
    store: ObjectStore, log: Consensus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compactor_module, "CHECK_EVERY", 1)
    entered = threading.Event()
    runner_box: list[MaintenanceRunner] = []

    def before_put(path: str) -> None:
        if is_output(path) and not entered.is_set():
            entered.set()
            runner_box[0]._stop.wait(10)  # held until close() asked the merge to stop

    settings = PersistSettings(
        small_merge_batches=2,
        batch_lease=10.0,
        consensus_min_age=1.0,
        allow_short_leases=True,
        inline_part_max_bytes=0,
        part_target_bytes=1024,
    )
    hooked = InterceptStore(store, before_put=before_put)
    with manual(PersistClient.open(hooked, consensus=log, settings=settings)) as client:
        runner = MaintenanceRunner(client._tables, poll_interval=60)
        runner_box.append(runner)
        write = client.open_writer(SHARD)
        for t in range(2):
            write.compare_and_append([upd(b"k%03d" % i, t) for i in range(200)], t, t + 1)
        requests = tuple(claims(state_of(client), write.writer_id))
        runner.submit(client.machine(SHARD), write.writer_id, Maintenance(merges=requests))
        assert entered.wait(10)
        thread = runner._thread
        runner.close()
        assert thread is not None and not thread.is_alive() and runner.idle()
        assert len(state_of(client).trace) == 2  # not applied
        assert not [key for key in part_paths(client) if is_output(key)]


def test_background_merges_and_gc_collect_the_inputs_after_batch_lease(url: str) -> None:
    # Real time: a fake clock ahead of the store's last_modified would make parts written
    # during a pass look older than they are (GC assumes clocks agree within the lease).
    settings = PersistSettings(
        small_merge_batches=2,
        batch_lease=0.5,
        consensus_min_age=0.5,
        allow_short_leases=True,
        inline_part_max_bytes=0,
        gc_min_versions=4,
    )
    with manual(PersistClient.open(url, settings=settings)) as client:
        runner = MaintenanceRunner(client._tables, poll_interval=0.02, retry_after=0.05)
        try:
            write = client.open_writer(SHARD)
            runner.watch(client.machine(SHARD), write.writer_id, owner=write)
            for t in range(6):
                write.compare_and_append([upd(b"k%d" % t, t)], t, t + 1)
            eventually(lambda: not state_of(client).merges and runner.idle())
            inputs = part_paths(client) - referenced(state_of(client))
            assert inputs
            time.sleep(settings.batch_lease + 0.1)
            for t in range(6, 12):  # GC comes due again, now past the inputs' batch_lease
                write.compare_and_append([upd(b"k%d" % t, t)], t, t + 1)
            eventually(lambda: runner.idle() and not inputs & part_paths(client))
            assert referenced(state_of(client)) <= part_paths(client)
            assert snapshot(client, 11) == sorted(upd(b"k%d" % t, 11) for t in range(12))
        finally:
            runner.close()


def test_a_writer_appending_in_a_loop_does_not_starve_its_merges() -> None:
    """Merges are handed to the runner at commit, run before GC passes, get their turn on
    the shard, and the writer slows down while the trace is long: the trace stays near
    ``SLOWDOWN_BATCHES`` instead of growing with every append (before: 600 appends left
    ~580 batches)."""
    with PersistClient.open("memory://") as client:
        write = client.open_writer(SHARD)
        deadline = time.monotonic() + 60
        longest = 0
        for t in range(600):
            write.compare_and_append([upd(b"k%d" % t, t)], t, t + 1)
            longest = max(longest, len(client.machine(SHARD).state.trace))
            assert time.monotonic() < deadline
        assert longest < 3 * SLOWDOWN_BATCHES
        assert snapshot(client, 599) == sorted(((b"k%d" % t, b"v"), 599, 1) for t in range(600))


def test_turns_serve_commands_in_arrival_order() -> None:
    turns = Turns()
    order: list[str] = []
    with turns:
        with turns:  # reentrant for the thread whose turn it is
            order.append("first")
        waiters = []
        for name in ("second", "third"):
            started = threading.Event()

            def run(name: str = name, started: threading.Event = started) -> None:
                started.set()
                with turns:
                    order.append(name)

            thread = threading.Thread(target=run)
            thread.start()
            started.wait(5)
            time.sleep(0.05)  # the waiter has taken its ticket
            waiters.append(thread)
    for thread in waiters:
        thread.join(5)
    assert order == ["first", "second", "third"]


def test_close_does_not_wait_out_a_poll_interval() -> None:
    """Found by the open/close hygiene test: a ``close()`` that notified the thread between
    its scan and its wait was not seen, so every other client took a whole ``poll_interval``
    (1 s) to close."""
    for _ in range(5):
        with PersistClient.open("memory://") as client:
            write = client.open_writer(SHARD)  # starts the thread, which scans at once
            write.compare_and_append([upd(b"a", 0)], 0, 1)
            started = time.monotonic()
        assert time.monotonic() - started < 0.5


def test_retry_times_that_passed_are_forgotten(url: str) -> None:
    """Issue 27, defect 9: every merge that was skipped or failed kept its retry time for
    the runner's life; a scan now forgets the times that passed."""
    with manual(PersistClient.open(url, settings=HOLLOW)) as client:
        runner = MaintenanceRunner(client._tables, poll_interval=0.02, retry_after=0.01)
        try:
            machine = client.machine(SHARD)
            for merge_id in range(40):  # no inputs: skipped, to be retried later
                runner.submit(machine, "w", Maintenance(merges=(MergeReq(merge_id, ()),)))
                eventually(runner.idle)
            eventually(lambda: not runner._not_before, timeout=5.0)
        finally:
            runner.close()


def test_a_full_trace_claimed_by_a_dead_writer_does_not_stall_writes(tmp_path: Path) -> None:
    """Issue 27, defect 5: the trace at ``max_trace_batches``, every span claimed by a writer
    that died. Appends were refused before anything committed, so nobody took the claims
    over; the runner of a live writer now claims them once they expire."""
    settings = PersistSettings(
        max_trace_batches=8, small_merge_batches=2, merge_lease=1.0, write_stall_timeout=20.0
    )
    url = f"file://{tmp_path}"
    with manual(PersistClient.open(url, settings=settings)) as dead:
        gone = dead.open_writer(SHARD)
        for t in range(8):
            gone.compare_and_append([upd(b"k%d" % t, t)], t, t + 1)
        state = state_of(dead)
        assert len(state.trace) == 8 and state.merges
        claimed = {i for claim in state.merges.values() for i in claim.inputs}
        assert {b.id for b in state.trace} <= claimed  # nothing left for anyone else
    with PersistClient.open(url, settings=settings) as client:
        runner = MaintenanceRunner(client._tables, poll_interval=0.05)
        client._maintenance.close()
        client._maintenance = runner
        try:
            write = client.open_writer(SHARD)
            start = time.monotonic()
            write.compare_and_append([upd(b"late", 8)], 8, 9)  # stalls, then goes through
            assert time.monotonic() - start < 15.0
            assert snapshot(client, 8)[-1] == upd(b"late", 8)
        finally:
            runner.close()
