"""An external compactor and the writer's in-process one cooperate (issue 12, finding 3).

``slatepy compact`` against a live writer used to supersede the writer's compactor for good:
it logged one INFO line and stopped, and ``wal_id_last_compacted`` never moved again. Now the
superseded compactor stands by (WARNING) and takes the epoch back once the holder leaves work
pending for its lease; ``slatepy compact`` refuses while another compactor's lease is live
unless ``--force``; fencing still keeps two compactors from publishing under one epoch
(RFC 0013).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slatepy import Db, FencedError, Settings
from slatepy.cli.main import main
from slatepy.compactor import Compactor
from slatepy.compactor.lease import CompactorBusy, activity, claim, live_lease, renew, watch
from slatepy.manifest.record import CompactorLease, Manifest
from slatepy.manifest.store import ManifestStore
from slatepy.store import ObjectStore, open_store
from slatepy.store.numbered import NumberedObjects
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX
from slatepy.testing.intercept import InterceptStore

LEASE = 0.3
FAST = Settings(flush_interval=60, compaction_interval=0.02, compactor_lease=LEASE)
"""A writer whose compactor checks every 20 ms and hands over after 0.3 s."""

QUIET = Settings(
    flush_interval=60, compactor="off", compaction_interval=0.02, compactor_lease=LEASE
)


def manifest(store: ObjectStore) -> Manifest:
    stored = ManifestStore(store).load()
    assert stored is not None
    return stored.manifest


def last_wal(store: ObjectStore) -> int:
    latest = NumberedObjects(store, WAL_DIR, WAL_SUFFIX).latest()
    assert latest is not None
    return latest


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.01)


def caught_up(store: ObjectStore) -> Callable[[], bool]:
    """True once the current manifest compacted every WAL SST written so far."""
    target = last_wal(store)
    return lambda: manifest(store).wal_id_last_compacted >= target


def backlog(store: ObjectStore, count: int = 3) -> None:
    """``count`` durable writes (one WAL SST each) with no compactor running."""
    with Db.open(store, settings=QUIET) as db:
        for i in range(count):
            db.put(b"k%d" % i, b"v%d" % i)


# (a) The writer's compactor takes compaction back after an external run.


def test_the_writers_compactor_takes_back_after_an_external_compaction(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="slatepy.compactor")
    store = open_store("memory://")
    with Db.open(store, settings=FAST) as db:
        db.put(b"a", b"1")
        wait_until(caught_up(store), "the writer's compactor")
        writers_epoch = manifest(store).compactor_epoch

        # What `slatepy compact` does: claim the epoch, compact until idle, exit. It does not
        # release its lease (a killed run would not either), so the lease must run out.
        external = Compactor(store, settings=FAST)
        assert external.epoch == writers_epoch + 1
        db.put(b"b", b"2")
        external.run_until_idle()

        for round_ in range(2):  # writes go on, and compaction with them, twice over
            for i in range(3):
                db.put(b"k%d-%d" % (round_, i), b"v")
            wait_until(caught_up(store), f"compaction to move on (round {round_})")

        assert manifest(store).compactor_epoch > external.epoch, "the writer took it back"
        assert db.get(b"b") == b"2" and db.get(b"k1-2") == b"v"

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("stops compacting" in r.getMessage() for r in warnings), caplog.text
    assert any("takes compaction back" in r.getMessage() for r in caplog.records)
    assert any("into L0" in r.getMessage() for r in caplog.records), "one INFO per compaction"


# (b) `slatepy compact` refuses while another compactor is live, unless --force.


def test_slatepy_compact_refuses_a_live_writers_compactor_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="slatepy.compactor")
    url = f"file://{tmp_path}/db"
    # A long lease: the writer's compactor stays live for the whole test.
    settings = Settings(compaction_interval=0.02, compactor_lease=30.0, file_sync="off")
    with Db.open(url, settings=settings) as db:
        store = open_store(url)
        db.put(b"a", b"1")
        wait_until(caught_up(store), "the writer's compactor")
        before = manifest(store)

        assert main(["compact", url]) == 1
        err = capsys.readouterr().err
        assert "CompactorBusy" in err and "--force" in err, err
        assert manifest(store).compactor_epoch == before.compactor_epoch, "wrote nothing"

        assert main(["compact", "--force", url]) == 0
        assert "compactions; wal_id_last_compacted=" in capsys.readouterr().out
        forced = manifest(store).compactor_epoch
        assert forced == before.compactor_epoch + 1

        # The forced run released its lease on exit: the writer's compactor, superseded,
        # takes compaction back at its next checks, not 30 s later.
        db.put(b"c", b"3")
        wait_until(caught_up(store), "the writer's compactor to take back", timeout=3.0)
        assert manifest(store).compactor_epoch > forced
    assert any(r.levelno == logging.WARNING for r in caplog.records)

    # A closed writer released its lease: no --force needed now.
    assert main(["compact", url]) == 0


# (c) Fencing still holds: two compactors never publish under one epoch.


def test_a_standby_takes_over_a_stuck_holder_whose_publish_then_fails() -> None:
    store = open_store("memory://")
    backlog(store)
    standby = Compactor(store, settings=QUIET)
    armed, publishing, resume = threading.Event(), threading.Event(), threading.Event()

    def pause_publish(path: str) -> None:
        if path.startswith("manifest/") and armed.is_set() and not publishing.is_set():
            publishing.set()
            assert resume.wait(10)

    holder = Compactor(InterceptStore(store, pause_publish), settings=QUIET)
    armed.set()  # past the holder's claim: the next manifest PUT is its publish
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            holder.run_once()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        # The holder merged and wrote its output; its publishing PUT hangs.
        assert publishing.wait(10)
        assert not standby.standby_check(now=0.0)  # work pending: the watch starts
        assert not standby.standby_check(now=LEASE / 2)
        assert standby.standby_check(now=LEASE)  # nothing moved for a lease
        assert standby.epoch == holder.epoch + 1
        assert standby.run_once() is not None
    finally:
        resume.set()
        thread.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], FencedError), outcome

    final = manifest(store)
    assert final.compactor_epoch == standby.epoch
    assert final.wal_id_last_compacted == last_wal(store)
    assert len(final.l0) == 1, "only the standby's output is published"
    epochs = [manifest_at(store, i).compactor_epoch for i in manifest_ids(store)]
    assert epochs == sorted(epochs), "compactor epochs never go back"
    claims = [
        m.compactor_lease.epoch
        for m in map(lambda i: manifest_at(store, i), manifest_ids(store))
        if m.compactor_lease is not None and m.compactor_lease.renewals == 0
    ]
    assert len(claims) == len(set(claims)), "every epoch was claimed once"


def test_a_holder_acting_during_a_standbys_claim_keeps_the_epoch() -> None:
    store = open_store("memory://")
    backlog(store)
    holder_box: list[Compactor] = []
    armed = threading.Event()

    def holder_publishes_first(path: str) -> None:
        # The standby decided to take over and is about to PUT its claim: the holder
        # publishes just before, so the claim loses its compare-and-swap.
        if path.startswith("manifest/") and armed.is_set():
            armed.clear()
            assert holder_box[0].run_once() is not None

    standby = Compactor(InterceptStore(store, holder_publishes_first), settings=QUIET)
    holder = Compactor(store, settings=QUIET)
    holder_box.append(holder)

    assert not standby.standby_check(now=0.0)
    armed.set()
    assert not standby.standby_check(now=LEASE), "the claim re-checked and stood down"
    assert not armed.is_set(), "the holder published during the claim"
    final = manifest(store)
    assert final.compactor_epoch == holder.epoch
    assert final.wal_id_last_compacted == last_wal(store)


class SlowFirstWalRead(InterceptStore):
    """The first read of a WAL SST takes ``delay`` seconds (a slow merge)."""

    def __init__(self, inner: ObjectStore, delay: float) -> None:
        super().__init__(inner, before_read=self._maybe_slow)
        self.delay = delay
        self.slowed = False

    def _maybe_slow(self, path: str) -> None:
        if path.startswith("wal/") and not self.slowed:
            self.slowed = True
            time.sleep(self.delay)


def test_a_long_compaction_renews_the_lease_before_it_publishes() -> None:
    store = open_store("memory://")
    backlog(store)
    holder = Compactor(SlowFirstWalRead(store, delay=LEASE / 3 + 0.02), settings=QUIET)
    assert holder.run_once() is not None
    seen = [manifest_at(store, i) for i in manifest_ids(store)]
    mine = [m for m in seen if m.compactor_epoch == holder.epoch]
    claimed, *rest = mine
    assert claimed.compactor_lease is not None and claimed.compactor_lease.renewals == 0
    # Before the publish, a manifest that only renews: same levels, renewals up by one.
    renewal, published = rest
    assert activity(renewal)[2:] == activity(claimed)[2:]
    assert renewal.compactor_lease is not None and renewal.compactor_lease.renewals == 1
    assert published.wal_id_last_compacted > claimed.wal_id_last_compacted


def manifest_ids(store: ObjectStore) -> list[int]:
    return ManifestStore(store).objects.ids()


def manifest_at(store: ObjectStore, manifest_id: int) -> Manifest:
    return ManifestStore(store).read(manifest_id)


# The pure lease decisions.


def test_the_watch_runs_out_only_with_work_pending_and_the_holder_still() -> None:
    m = claim(Manifest(), holder="h", now_s=1000.0, duration_s=2.0)
    assert m is not None
    w, expired = watch(None, m, pending=True, now=0.0, default_duration=9.0)
    assert w is not None and not expired
    assert watch(w, m, pending=True, now=1.9, default_duration=9.0) == (w, False)
    assert watch(w, m, pending=True, now=2.0, default_duration=9.0) == (w, True)
    # No work pending: a holder with nothing to do owes no sign of life.
    assert watch(w, m, pending=False, now=50.0, default_duration=9.0) == (None, False)
    # The holder renewed: the watch starts over.
    renewed = renew(m, m.compactor_epoch, holder="h", now_s=1001.0, duration_s=2.0)
    w2, expired = watch(w, renewed, pending=True, now=3.0, default_duration=9.0)
    assert w2 is not None and w2.since == 3.0 and not expired
    # A released lease (zero seconds) runs out at the next look.
    released = renew(renewed, m.compactor_epoch, holder="h", now_s=1002.0, duration_s=0.0)
    w3, _ = watch(None, released, pending=True, now=4.0, default_duration=9.0)
    assert watch(w3, released, pending=True, now=4.0, default_duration=9.0)[1]


def test_a_stale_or_missing_lease_falls_back_to_the_own_duration() -> None:
    # An older slatepy claimed epoch 3 without a lease; the recorded one is epoch 2's.
    old = Manifest(compactor_epoch=3, compactor_lease=CompactorLease(2, "h", 5, 0.0, 1.0))
    w, _ = watch(None, old, pending=True, now=0.0, default_duration=9.0)
    assert not watch(w, old, pending=True, now=8.9, default_duration=9.0)[1]
    assert watch(w, old, pending=True, now=9.0, default_duration=9.0)[1]
    assert live_lease(old, now_s=0.5) is None


def test_claims_check_the_lease_inside_the_update() -> None:
    m = claim(Manifest(), holder="writer", now_s=100.0, duration_s=30.0)
    assert m is not None and m.compactor_epoch == 1
    with pytest.raises(CompactorBusy, match="--force"):
        claim(m, holder="cli", now_s=110.0, duration_s=30.0, takeover="unless-live")
    later = claim(m, holder="cli", now_s=131.0, duration_s=30.0, takeover="unless-live")
    assert later is not None and later.compactor_epoch == 2
    forced = claim(m, holder="cli", now_s=110.0, duration_s=30.0, takeover="always")
    assert forced is not None and forced.compactor_lease == CompactorLease(2, "cli", 0, 110.0, 30.0)
    # A take-over expects the holder's activity it watched; any change cancels it.
    seen = activity(m)
    moved = renew(m, 1, holder="writer", now_s=101.0, duration_s=30.0)
    assert claim(moved, holder="x", now_s=200.0, duration_s=1.0, expect=seen) is None
    assert claim(m, holder="x", now_s=200.0, duration_s=1.0, expect=seen) is not None
    with pytest.raises(FencedError):
        renew(forced, 1, holder="writer", now_s=111.0, duration_s=30.0)


def test_old_manifests_decode_without_a_lease_and_new_ones_round_trip() -> None:
    import msgspec

    from slatepy.format.envelope import seal
    from slatepy.manifest.record import MANIFEST_MAGIC
    from tests.manifest.test_manifest_versions import version_1_fields

    # A manifest as written (format version 1) before the lease existed: no such key at all.
    fields = version_1_fields(Manifest(compactor_epoch=4))
    del fields["compactor_lease"]
    legacy = seal(MANIFEST_MAGIC, 1, msgspec.msgpack.encode(fields))
    decoded = Manifest.decode(legacy)
    assert decoded.compactor_epoch == 4 and decoded.compactor_lease is None
    lease = CompactorLease(4, "h", 2, 1.5, 30.0)
    m = Manifest(compactor_epoch=4, compactor_lease=lease)
    assert Manifest.decode(m.encode()) == m
