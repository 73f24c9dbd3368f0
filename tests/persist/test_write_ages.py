"""GC at the age edge of the write path (issue 27, defects 1 and 2): GC passes run while
``compare_and_append``, ``append``, a batch write and a builder are in flight, each held
just after its part's PUT (a store wrapper), and while a batch append is held before its
consensus entry's PUT, on memory, file and S3 (moto). The clock then
jumps past ``batch_lease`` so GC deletes the unreferenced part: the write must be refused
(its parts are older than ``batch_lease / 2``), never commit a state naming a deleted part.
Also: a long-lived builder is dated by its first part, and ``write_stall_timeout`` is
bounded by ``batch_lease``."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slatepy.config import Settings
from slatepy.errors import InvalidArgument
from slatepy.persist import PersistClient, PersistSettings, UsageError, WriteHandle
from slatepy.persist.gc import collect
from slatepy.store.base import ObjectStore
from slatepy.store.url import open_store
from slatepy.testing.intercept import InterceptStore
from tests.conftest import make_backend
from tests.persist.compaction_kit import HOLLOW, manual, part_paths, referenced, snapshot, upd
from tests.persist.handles_kit import (  # noqa: F401 (fixtures)
    SHARD,
    Clock,
    state_of,
    url_fixture,
    validate_states,
)

HALF_LEASE = HOLLOW.batch_lease / 2
PAST_BATCH_LEASE = HOLLOW.batch_lease + 1
BIG = [upd(b"k%03d" % i, 1) for i in range(64)]
"""Updates at time 1 of about 2 KiB: one blob part (``HOLLOW`` inlines nothing)."""


@pytest.fixture(
    name="location", params=["memory", "file", pytest.param("s3", marks=pytest.mark.s3)]
)
def location_fixture(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[ObjectStore, Settings]]:
    """A raw store shared by the test's clients, and its store settings."""
    if request.param == "memory":
        yield open_store("memory://"), Settings()
    elif request.param == "file":
        yield open_store(f"file://{tmp_path}", create=True), Settings()
    else:
        backend = make_backend("s3", request, tmp_path)
        yield open_store(backend.url, backend.settings), backend.settings


class Pause:
    """Holds one PUT until released: the first part PUT once it landed, or (``at_cas``)
    the first consensus entry PUT after :meth:`arm`, before it lands."""

    def __init__(self, *, at_cas: bool = False) -> None:
        self.at_cas = at_cas
        self.armed = not at_cas
        self.reached = threading.Event()
        self.resume = threading.Event()

    def arm(self) -> None:
        self.armed = True

    def before_put(self, path: str) -> None:
        if self.at_cas and self.armed and path.startswith("consensus/"):
            self._hold()

    def after_put(self, path: str) -> None:
        if not self.at_cas and "/part/" in path:
            self._hold()

    def _hold(self) -> None:
        if not self.reached.is_set():
            self.reached.set()
            assert self.resume.wait(30), "nobody released the paused PUT"


def _caa(write: WriteHandle, pause: Pause) -> None:
    write.compare_and_append(BIG, 1, 2)


def _append(write: WriteHandle, pause: Pause) -> None:
    write.append(BIG, 1, 2)


def _batch(write: WriteHandle, pause: Pause) -> None:
    batch = write.batch(BIG, 1, 2)
    write.compare_and_append_batch([batch], 1, 2)


def _builder(write: WriteHandle, pause: Pause) -> None:
    builder = write.builder(1)
    builder.extend(BIG)  # spills: 2 KiB >= builder_buffer_bytes
    builder.add(b"late", b"v", 1, 1)
    write.compare_and_append_batch([builder.finish(2)], 1, 2)


def _batch_at_cas(write: WriteHandle, pause: Pause) -> None:
    batch = write.batch(BIG, 1, 2)
    pause.arm()  # held at its CAS: GC's fence lands first, then the retry checks the age
    write.compare_and_append_batch([batch], 1, 2)


WRITES: dict[str, Callable[[WriteHandle, Pause], None]] = {
    "compare_and_append": _caa,
    "append": _append,
    "batch": _batch,
    "builder": _builder,
    "batch_at_cas": _batch_at_cas,
}


@pytest.mark.parametrize("kind", WRITES)
def test_gc_during_a_write_in_flight_never_leaves_a_state_naming_a_deleted_part(
    location: tuple[ObjectStore, Settings], kind: str
) -> None:
    raw, store_settings = location
    clock = Clock(time.time())
    pause = Pause(at_cas=kind == "batch_at_cas")
    settings = dataclasses.replace(HOLLOW, builder_buffer_bytes=1024)
    with (
        manual(
            PersistClient.open(
                InterceptStore(raw, pause.before_put, after_put=pause.after_put),
                settings=store_settings,
                persist_settings=settings,
                clock=clock,
            )
        ) as client,
        manual(
            PersistClient.open(raw, settings=store_settings, persist_settings=settings, clock=clock)
        ) as collector,
    ):
        write = client.open_writer(SHARD)
        write.compare_and_append([], 0, 1)
        errors: list[BaseException] = []

        def run() -> None:
            try:
                WRITES[kind](write, pause)
            except BaseException as exc:  # the test inspects it
                errors.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        pause.reached.wait(30)
        (part,) = part_paths(collector)
        clock.advance(PAST_BATCH_LEASE)  # the part is now older than batch_lease
        assert collect(collector.machine(SHARD), claimant="gc").status == "done"
        assert part not in part_paths(collector)  # GC took it: unreferenced and old
        pause.resume.set()
        thread.join(30)
        assert not thread.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], UsageError), errors
        assert "too old" in str(errors[0])
        state = state_of(collector)
        assert state.upper == 1
        assert referenced(state) <= part_paths(collector)
        assert snapshot(collector, 0) == []


def test_a_builder_is_dated_by_its_first_part(url: str) -> None:
    clock = Clock()
    settings = dataclasses.replace(HOLLOW, builder_buffer_bytes=1024)
    with manual(PersistClient.open(url, settings=settings, clock=clock)) as client:
        write = client.open_writer(SHARD)
        builder = write.builder(0)
        builder.extend([upd(b"k%03d" % i, 0) for i in range(64)])  # spills a part now
        clock.advance(HALF_LEASE - 1)
        builder.add(b"late", b"v", 0, 1)
        batch = builder.finish(1)  # young enough still: the first part is 4 s old
        assert batch.record.written_ms == round((clock.now - (HALF_LEASE - 1)) * 1000)
        clock.advance(2)  # the first part is older than batch_lease / 2 now
        with pytest.raises(UsageError, match="too old"):
            write.compare_and_append_batch([batch], 0, 1)
        assert state_of(client).upper == 0


def test_a_builder_whose_first_part_is_too_old_refuses_and_cleans_up(url: str) -> None:
    clock = Clock()
    settings = dataclasses.replace(HOLLOW, builder_buffer_bytes=1024)
    with manual(PersistClient.open(url, settings=settings, clock=clock)) as client:
        write = client.open_writer(SHARD)
        builder = write.builder(0)
        builder.extend([upd(b"k%03d" % i, 0) for i in range(64)])
        assert len(part_paths(client)) == 1
        clock.advance(HALF_LEASE + 1)
        builder.add(b"late", b"v", 0, 1)
        with pytest.raises(UsageError, match="too old"):
            builder.finish(1)
        assert part_paths(client) == set()


def test_write_stall_timeout_is_bounded_by_batch_lease() -> None:
    short = {"batch_lease": 10.0, "consensus_min_age": 1.0, "allow_short_leases": True}
    with pytest.raises(InvalidArgument, match="batch_lease / 4"):
        PersistSettings(**short, write_stall_timeout=5.0)
    with pytest.raises(InvalidArgument, match="batch_lease / 4"):
        PersistSettings(write_stall_timeout=1000.0)  # batch_lease 3600: at most 900
    assert PersistSettings(**short, write_stall_timeout=2.5).stall_timeout == 2.5
    assert PersistSettings(**short).stall_timeout == 2.5  # default: min(60, lease / 4)
    assert PersistSettings().stall_timeout == 60.0
    assert PersistSettings.from_dict({"write_stall_timeout": "30"}).stall_timeout == 30.0
