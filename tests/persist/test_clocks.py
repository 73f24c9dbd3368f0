"""Clients on skewed clocks (issue 27, defect 6; RFC 0015, issue 27 addendum on clocks).

State walltime was ``max(previous + 1 ms, committer's clock)``: one commit from a host a day
ahead expired every lease and idempotency key at once, and then froze expiry for a day
(everyone else's commits moved the walltime by 1 ms). Now a commit moves it at most
``max_clock_skew`` beyond what its committer has seen pass since it first read the state,
and at least by that: a host ahead cannot push it further however often it commits, and a
walltime ahead of every clock still advances as time passes. A process whose clock was more
than ``max_clock_skew`` ahead of the walltime it first read counts only time it saw pass, so
a fast host's fresh clients cannot each add the skew again.
"""

from __future__ import annotations

from pathlib import Path

from slatepy.persist import PersistClient, PersistSettings
from slatepy.persist.state.gc_rules import ClaimGc, claim_gc
from tests.persist.compaction_kit import manual, upd
from tests.persist.handles_kit import SHARD, Clock, state_of

DAY = 86_400.0

SKEWED = PersistSettings(
    reader_lease=300.0,
    writer_lease=300.0,
    merge_lease=10.0,
    idempotency_ttl=3600.0,
    small_merge_batches=2,
    compaction="on",
)
"""Leases and a key TTL far shorter than the skew (a day) and longer than ``max_clock_skew``
(60 s, the assumed bound); merges in pairs."""


def skewed(base: Clock, offset: float) -> Clock:
    """A clock ``offset`` seconds off ``base`` that moves with it."""

    class Skewed(Clock):
        def __call__(self) -> float:
            return base() + offset

    return Skewed()


def test_a_clock_a_day_ahead_expires_no_lease_and_no_key_early(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    base = Clock()
    with (
        manual(PersistClient.open(url, settings=SKEWED, clock=base)) as honest,
        manual(PersistClient.open(url, settings=SKEWED, clock=skewed(base, DAY))) as ahead,
    ):
        write = honest.open_writer(SHARD)
        write.compare_and_append([upd(b"a", 0)], 0, 1)
        reader = honest.open_leased_reader(SHARD)
        batch = write.batch([upd(b"k", 1)], 1, 2)
        assert write.compare_and_append_batch([batch], 1, 2, idempotency=("sink", 1))
        fast = ahead.open_writer(SHARD)
        for t in range(2, 6):  # however often it commits
            fast.compare_and_append([upd(b"f%d" % t, t)], t, t + 1)
        walltime = state_of(honest).walltime_ms
        assert walltime <= (base() + SKEWED.max_clock_skew + 1) * 1000, walltime - base() * 1000
        # The reader's lease and the key outlive the fast host's commits.
        assert reader.snapshot(5)[0] == upd(b"a", 5)
        replay = write.batch([upd(b"k", 6)], 6, 7)
        assert not write.compare_and_append_batch([replay], 6, 7, idempotency=("sink", 1))
        assert reader.reader_id in state_of(honest).leased_readers


def test_expiry_goes_on_after_a_fast_host_with_a_slow_host_committing(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    base = Clock()
    with manual(PersistClient.open(url, settings=SKEWED, clock=base)) as honest:
        honest.open_writer(SHARD).compare_and_append([], 0, 1)
    with manual(PersistClient.open(url, settings=SKEWED, clock=skewed(base, DAY))) as ahead:
        # A host a day ahead registers a reader, claims a merge and a GC pass, and dies.
        dead_reader = ahead.open_leased_reader(SHARD)
        dead = ahead.open_writer(SHARD)
        for t in range(1, 3):
            dead.compare_and_append([upd(b"d%d" % t, t)], t, t + 1)
        assert {c.claimant for c in state_of(ahead).merges.values()} == {dead.writer_id}
        assert ahead.machine(SHARD).run(claim_gc, ClaimGc("gdead")) > 0
    with manual(PersistClient.open(url, settings=SKEWED, clock=skewed(base, -DAY))) as behind:
        slow = behind.open_writer(SHARD)
        assert behind.machine(SHARD).run(claim_gc, ClaimGc("gslow")) == 0  # still held
        # Past every lease and claim (GC claims last 5 x merge_lease), plus the skew bound.
        base.advance(SKEWED.reader_lease + SKEWED.max_clock_skew + 1)
        slow.compare_and_append([upd(b"s", 3)], 3, 4)
        state = state_of(behind)
        assert dead_reader.reader_id not in state.leased_readers
        assert dead.writer_id not in state.writers
        assert {c.claimant for c in state.merges.values()} <= {slow.writer_id}
        assert behind.machine(SHARD).run(claim_gc, ClaimGc("gslow")) > 0


def test_a_fast_host_reopening_its_client_does_not_ratchet_the_walltime(tmp_path: Path) -> None:
    """Each fresh client anchors the skew bound at the walltime it first reads: when that
    walltime was already pushed ``max_clock_skew`` ahead by the same fast host's previous
    client, it could push another ``max_clock_skew``: a host a day ahead whose clients come
    and go (CLI runs, Spark tasks) took honest leases over in ``lease / skew`` reopenings."""
    url = f"file://{tmp_path}"
    base = Clock()
    with manual(PersistClient.open(url, settings=SKEWED, clock=base)) as honest:
        write = honest.open_writer(SHARD)
        write.compare_and_append([upd(b"a", 0)], 0, 1)
        reader = honest.open_leased_reader(SHARD)
        reopenings = int(SKEWED.reader_lease // SKEWED.max_clock_skew) + 2
        for t in range(1, 1 + reopenings):
            with manual(PersistClient.open(url, settings=SKEWED, clock=skewed(base, DAY))) as c:
                c.open_writer(SHARD).compare_and_append([upd(b"f%d" % t, t)], t, t + 1)
        walltime = state_of(honest).walltime_ms
        assert walltime <= (base() + SKEWED.max_clock_skew + 1) * 1000, walltime - base() * 1000
        write.compare_and_append([], 1 + reopenings, 2 + reopenings)  # a commit judges expiry
        assert reader.reader_id in state_of(honest).leased_readers
