"""The compactor: claims ``compactor_epoch``, then plans, executes and publishes.

A compactor whose epoch was superseded (a zombie) loses at publish time: the pure
``apply_result`` raises ``FencedError`` inside the manifest update, so its outputs are never
referenced (GC collects them) and it stops.

Publishing races the garbage collector, which deletes unreferenced compacted SSTs once they
are ``gc_min_age`` old. The compactor checks its deadline (``gc_min_age / 2`` after it started
writing outputs) inside the update function, i.e. after reading the latest manifest and
before the PUT of the next; the collector writes a fence manifest before it deletes, so a
PUT that is slow for any reason either lands below the fence (the collector reads it and
keeps the outputs) or loses its compare-and-swap and checks again (RFC 0003, "A publish in
flight").

A superseded compactor need not stop for good: :meth:`Compactor.standby_check` watches the
holder's lease and takes the epoch back once the holder has left pending work untouched for
its lease (RFC 0013); the holder renews the lease with each publish and during long merges.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Literal, TypedDict, cast, get_args

from slatepy.compactor.executor import compact_plan
from slatepy.compactor.lease import (
    Takeover,
    Watch,
    claim,
    default_holder,
    describe_holder,
    renew,
    watch,
)
from slatepy.compactor.planner import (
    CLOSE_L0_TRIGGER,
    CompactionPolicy,
    L0ToRun,
    Plan,
    WalToL0,
    apply_result,
    plan,
    plan_full,
)
from slatepy.config import Settings
from slatepy.errors import CompactionAbandoned, FencedError, NotFound
from slatepy.format.compression import Compression
from slatepy.manifest.record import Manifest
from slatepy.manifest.store import ManifestStore, StoredManifest
from slatepy.store.base import ObjectStore
from slatepy.store.numbered import NumberedObjects, contiguous_end
from slatepy.store.retry import with_retries
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX
from slatepy.table.merge_operator import MergeOperator, Merging
from slatepy.table.reader import TableReader

log = logging.getLogger(__name__)

WAL_FIRST_MAX = 16
"""WAL compactions at most between two tries of an L0 merge that keeps failing (a damaged L0
SST, a store failing its reads): after the k-th failure in a row the WAL goes first for
2^(k-1) plans, up to this many, so writes keep nearly their whole compaction rate while the
merge is retried at least every 17 rounds (RFC 0006, stop 41)."""

SstOptionsSource = Literal["database", "settings"]


class SstBuildOptions(TypedDict):
    """The ``compact_plan`` arguments that say how output SSTs are built."""

    block_size: int
    bloom_bits_per_key: int
    compression: Compression
    compression_level: int


class Compactor:
    """Compacts one database. Construct it to claim the compactor epoch."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        settings: Settings | None = None,
        policy: CompactionPolicy | None = None,
        clock: Callable[[], float] = time.time,
        holder: str | None = None,
        takeover: Takeover = "always",
        expiry_clock: Callable[[], float] | None = None,
        merge_operator: MergeOperator | None = None,
        sst_options: SstOptionsSource = "database",
    ) -> None:
        """Claim the compactor epoch.

        Args:
            clock: Seconds since the epoch (tests move it forward). For safety it, the
                garbage collector's clock and the store's ``last_modified`` must each be
                within ``gc_min_age / 8`` of true time (RFC 0003).
            holder: Who this compactor is, recorded in the lease for logs and errors
                (default: pid and host).
            takeover: ``"unless-live"`` raises ``CompactorBusy`` instead of claiming while
                another compactor's lease is live (``slatepy compact`` without ``--force``).
            expiry_clock: The wall clock that says which TTL'd values have expired (RFC
                0019); ``clock`` by default (a writer passes the clock it writes with).
            merge_operator: The database's merge operator (RFC 0019). Without it a
                compaction that meets merge operands over a value fails with
                ``InvalidArgument`` (operands alone are carried over as they are).
            sst_options: ``"database"`` (default): outputs are built as the database's
                writer records in the manifest (compression, its level, block size, bloom
                bits; RFC 0026), or by ``settings`` where it records none (an older
                writer); ``"settings"``: by ``settings`` whatever the writer chose.

        Raises:
            NotFound: no database at ``store`` (a compactor never creates one).
        """
        self.settings = settings or Settings()
        self._sst_source = sst_options
        self.policy = policy or CompactionPolicy()
        self._wal_batch = self.policy.max_wal_ssts
        # After L0 merges fail, the WAL goes first for this many more plans (planner.plan):
        # 1 after the first failure, doubling with each failure in a row (WAL_FIRST_MAX).
        self._l0_failures = 0
        self._wal_first_left = 0
        self._clock = clock
        self._expiry_clock = clock if expiry_clock is None else expiry_clock
        self._merging = Merging(merge_operator, self._expiry_clock)
        store = with_retries(
            store, self.settings.request_attempts, give_up_after=self.settings.store_timeout
        )
        self.tables = TableReader(store, cache_bytes=8 * 1024 * 1024)
        self.manifests = ManifestStore(
            store,
            attempts=self.settings.manifest_update_attempts,
            probe_window=self.settings.gc_min_age / 2,
        )
        self._wal = NumberedObjects(store, WAL_DIR, WAL_SUFFIX)
        self.holder = holder or default_holder("compactor")
        self._watch: Watch | None = None
        # Claiming writes a manifest, which on an empty location would create a database:
        # `slatepy compact s3://bucket/typo` must fail, not make one (only Db.open creates).
        if self.manifests.load() is None:
            raise NotFound(
                f"no slatepy database at {store.url} (no manifest): nothing to compact; "
                "only a writer (Db.open) creates a database",
                path="manifest/",
            )
        claimed = self.manifests.update(
            lambda m, _: claim(
                m,
                holder=self.holder,
                now_s=self._clock(),
                duration_s=self.settings.compactor_lease,
                takeover=takeover,
            )
        )
        self._renewed_at = time.monotonic()
        self.epoch = claimed.manifest.compactor_epoch
        self.last_published: StoredManifest = claimed
        self._cancel = threading.Event()
        self._close_by: float | None = None
        self._close_budget_then = 0
        self._unbudgeted = 0  # input bytes of the merge in progress if planned budget-free
        self.preempted = False

    def sst_options(self, manifest: Manifest) -> SstBuildOptions:
        """How outputs are built against ``manifest`` (see the ``sst_options`` argument)."""
        settings = self.settings
        ours = SstBuildOptions(
            block_size=settings.block_size,
            bloom_bits_per_key=settings.bloom_bits_per_key,
            compression=settings.compression,
            compression_level=settings.compression_level,
        )
        recorded = manifest.sst_options
        if self._sst_source == "settings" or recorded is None:
            return ours
        codec = recorded.compression
        if codec not in get_args(Compression):
            log.warning(
                "the database's writer compresses SSTs with %r, which this slatepy does not "
                "know: compacting with compression=%r",
                codec,
                settings.compression,
            )
            return ours
        return SstBuildOptions(
            block_size=recorded.block_size,
            bloom_bits_per_key=recorded.bloom_bits_per_key,
            compression=cast(Compression, codec),
            compression_level=recorded.compression_level,
        )

    def closing(self, by: float) -> None:
        """The writer closes and stops this compactor at ``by`` (``time.monotonic()``): every
        later plan is made within what can be merged by then (``close_by`` of
        :meth:`run_once`), and an L0 merge in progress that was planned without that budget
        and exceeds it stops at its next progress check with ``CompactionAbandoned``
        (:attr:`preempted` set), so the close can plan one that it can finish instead of
        waiting it out to abandon it."""
        self._close_budget_then = self._close_budget(by)
        self._close_by = by

    def _close_budget(self, by: float) -> int:
        """What can be merged by ``by``, at ``Settings.close_merge_rate``. Assumed, not
        timed: merges timed while the writer writes run at its pace (the priority gate
        pauses them), many times slower than a close's (RFC 0006)."""
        return int(self.settings.close_merge_rate * max(0.0, by - time.monotonic()))

    def cancel(self) -> None:
        """Make a compaction in progress stop soon with ``CompactionAbandoned`` (its outputs
        are left to GC), and every later one at once. Closing a writer waits for nothing more
        than a few thousand merged entries, however large the compaction."""
        self._cancel.set()

    def run_once(
        self,
        *,
        recheck_manifest: bool = True,
        close_by: float | None = None,
        full: bool = False,
    ) -> Plan | None:
        """Plan and run one compaction; None when there was nothing to do.

        Args:
            recheck_manifest: Look for a newer manifest first (a GET); False plans on the
                newest one seen, which is enough to find new WAL SSTs (the background loop
                skips most manifest looks while idle: only ingestions and other compactors
                change what there is to do without writing WAL).
            close_by: The writer is closing (:meth:`BackgroundCompactor.close` draining)
                and stops this compactor at this ``time.monotonic()``: L0 is merged once it
                holds ``CLOSE_L0_TRIGGER`` SSTs rather than ``l0_trigger``, so the next open
                reads sorted runs, not overlapping L0 SSTs, with only what can be merged by
                then (``Settings.close_merge_rate``; the planner's ``close_budget``).
            full: Once nothing else is left, merge all of L0 and every run into one run
                (:func:`~slatepy.compactor.planner.plan_full`).

        Raises:
            FencedError: another compactor holds the epoch now (this one may stand by:
                :meth:`standby_check`).
            CompactionAbandoned: cancelled, or too slow to publish safely.
        """
        self.preempted = False
        stored = (None if recheck_manifest else self.manifests.newest_seen()) or (
            self.manifests.poll()
        )
        assert stored is not None  # the constructor wrote one
        manifest = stored.manifest
        close_by = self._close_by if close_by is None else close_by
        todo, wal_sizes = self._plan(manifest, close_by)
        if isinstance(todo, WalToL0) and self._wal_first_left:
            self._wal_first_left -= 1
        if todo is None and full:
            todo = plan_full(manifest)
        if todo is None:
            return None
        self._check_cancelled(todo)
        if close_by is None and isinstance(todo, L0ToRun):
            self._unbudgeted = input_bytes(todo, manifest)
        started = time.monotonic()
        # A standby's watch began no earlier than this work appeared, at most a pass before
        # now; renewing a third of a lease after starting (if still unpublished) is in time,
        # and a compaction that publishes sooner costs no renewal write at all.
        self._renewed_at = max(self._renewed_at, started)
        # GC deletes unreferenced outputs once they are gc_min_age old; publishing after half
        # of that would race it, so such a compaction is abandoned (RFC 0003). Read before
        # any output is written, so every output is at least this old.
        deadline = self._clock() + self.settings.gc_min_age / 2
        try:
            if isinstance(todo, L0ToRun):  # counted as failed until it has published
                self._l0_failures += 1
                self._wal_first_left = min(1 << (self._l0_failures - 1), WAL_FIRST_MAX)
            outputs = compact_plan(
                todo,
                manifest,
                self.tables,
                self.policy,
                **self.sst_options(manifest),
                clock=self._expiry_clock,
                merging=self._merging,
                progress=lambda: self._progress(todo),
                # A closing writer has no foreground left to hand the GIL to.
                hand_off=lambda: self._close_by is None,
            )
        finally:
            self._unbudgeted = 0

        def publish(latest: Manifest, _: int) -> Manifest:
            # Here, after the update read ``latest`` and before it PUTs the next manifest:
            # a collector's fence that this update saw was written after the collector read
            # its clock, so outputs it may delete fail this check (RFC 0003). Checking once
            # before the update would not do: its PUT could lose to the fence and retry.
            if self._clock() >= deadline:
                raise CompactionAbandoned(
                    f"compaction {todo} took longer than gc_min_age / 2; its outputs are "
                    "left for the garbage collector"
                )
            if latest.compactor_epoch != self.epoch:  # apply_result checks too; this names who
                raise FencedError(
                    f"compactor epoch {self.epoch} was superseded by {describe_holder(latest)}"
                )
            # Publishing renews the lease in the same write: a busy holder costs no more.
            return self._renewed(apply_result(latest, todo, tuple(outputs), self.epoch))

        try:
            self.last_published = self.manifests.update(publish)
        except CompactionAbandoned:
            self._wal_batch = max(1, self._wal_batch // 2)
            raise
        self._renewed_at = time.monotonic()
        if isinstance(todo, L0ToRun):
            self._l0_failures = self._wal_first_left = 0
        self._wal_batch = min(self.policy.max_wal_ssts, self._wal_batch * 2)
        log.info(
            "compactor epoch %d: %s -> %d SSTs (%d bytes) in %.2f s; manifest %d",
            self.epoch,
            describe_inputs(todo, manifest, wal_sizes),
            len(outputs),
            sum(h.object_size for h in outputs),
            time.monotonic() - started,
            self.last_published.id,
        )
        return todo

    def _plan(
        self, manifest: Manifest, close_by: float | None = None
    ) -> tuple[Plan | None, dict[int, int]]:
        """The next compaction on ``manifest`` and the sizes of the WAL SSTs after it: one HEAD
        of the next WAL SST, and a LIST only if it exists (an idle database costs no LIST)."""
        if self._wal.exists(manifest.wal_id_last_compacted + 1):
            listed = self._wal.entries(after=manifest.wal_id_last_compacted)
        else:
            listed = []
        end = contiguous_end([i for i, _ in listed], manifest.wal_id_last_compacted + 1)
        tail = end - 1 if end > manifest.wal_id_last_compacted + 1 else None
        # After an abandoned compaction the WAL batch shrinks, so a compactor that fell
        # behind converges instead of retrying an ever larger (ever slower) merge.
        policy = dataclasses.replace(self.policy, max_wal_ssts=self._wal_batch)
        budget = None
        if close_by is not None:
            policy = dataclasses.replace(
                policy, l0_trigger=min(policy.l0_trigger, CLOSE_L0_TRIGGER)
            )
            budget = self._close_budget(close_by)
        planned = plan(
            manifest, tail, policy, close_budget=budget, wal_first=self._wal_first_left > 0
        )
        return planned, {i: meta.size for i, meta in listed}

    def _renewed(self, manifest: Manifest) -> Manifest:
        return renew(
            manifest,
            self.epoch,
            holder=self.holder,
            now_s=self._clock(),
            duration_s=self.settings.compactor_lease,
        )

    def renew_if_due(self) -> None:
        """Renew the lease if a third of it passed since the last renewal or publish, so a
        standby watching a long compaction sees the holder is alive (one manifest write).

        Raises:
            FencedError: another compactor holds the epoch now; stop this compaction early.
        """
        if time.monotonic() - self._renewed_at < self.settings.compactor_lease / 3:
            return
        self.manifests.update(lambda m, _: self._renewed(m))
        self._renewed_at = time.monotonic()

    def release(self) -> None:
        """Hand the lease back on the way out (a lease of zero seconds), if the epoch is
        still ours: a standby then takes over at its next checks instead of after a whole
        lease, and ``slatepy compact`` needs no ``--force``. One manifest write, none if
        another compactor holds the epoch."""

        def zero(latest: Manifest, _: int) -> Manifest | None:
            if latest.compactor_epoch != self.epoch:
                return None
            return renew(
                latest, self.epoch, holder=self.holder, now_s=self._clock(), duration_s=0.0
            )

        self.manifests.update(zero)

    def standby_check(self, *, now: float | None = None) -> bool:
        """One look by a superseded compactor: True once it holds the epoch (again).

        Takes the epoch back when work stayed pending and the holder did nothing for its
        lease (:func:`slatepy.compactor.lease.watch`), with a claim that re-checks, inside
        its compare-and-swap, that the holder still did nothing. Costs a manifest GET (see
        ``ManifestStore.poll``) and a WAL HEAD; writes only to take over.

        Args:
            now: Monotonic seconds (tests pass their own); ``time.monotonic()`` if None.
        """
        stored = self.manifests.poll()
        assert stored is not None
        manifest = stored.manifest
        if manifest.compactor_epoch == self.epoch:
            self._watch = None
            return True
        pending = self._plan(manifest)[0] is not None
        self._watch, expired = watch(
            self._watch,
            manifest,
            pending=pending,
            now=time.monotonic() if now is None else now,
            default_duration=self.settings.compactor_lease,
        )
        if not expired or self._cancel.is_set():
            return False
        assert self._watch is not None
        expect = self._watch.activity
        self._watch = None
        won = False

        def take(latest: Manifest, _: int) -> Manifest | None:
            nonlocal won
            new = claim(
                latest,
                holder=self.holder,
                now_s=self._clock(),
                duration_s=self.settings.compactor_lease,
                expect=expect,
            )
            won = new is not None
            return new

        claimed = self.manifests.update(take)
        if not won:
            return False  # the holder acted just now: keep watching
        log.info(
            "compactor epoch %d (%s) takes compaction back from %s, which left work pending "
            "for its lease",
            claimed.manifest.compactor_epoch,
            self.holder,
            describe_holder(manifest),
        )
        self.epoch = claimed.manifest.compactor_epoch
        self.last_published = claimed
        self._renewed_at = time.monotonic()
        self._wal_batch = self.policy.max_wal_ssts
        return True

    def _check_cancelled(self, todo: Plan) -> None:
        if self._cancel.is_set():
            raise CompactionAbandoned(
                f"compaction {todo} cancelled: the compactor is closing; its outputs are left "
                "for the garbage collector"
            )

    def _progress(self, todo: Plan) -> None:
        """Called now and then during a compaction: stop if it was cancelled, and renew the
        lease (a long merge publishes nothing for a while; a standby must still see us
        alive)."""
        self._check_cancelled(todo)
        if self._close_by is not None and self._unbudgeted > self._close_budget_then:
            self.preempted = True
            raise CompactionAbandoned(
                f"compaction {todo} stopped: the writer is closing, and it would outlast "
                "close_compaction_wait; its outputs are left for the garbage collector"
            )
        self.renew_if_due()

    def run_until_idle(self, *, max_rounds: int = 1000, full: bool = False) -> int:
        """Run compactions until none is left (or ``max_rounds``); return how many ran.

        With ``full``, the database is merged into one sorted run once (see
        :meth:`run_once`), then compacted until idle as usual: a writer still writing
        meanwhile makes new L0 SSTs, which must not make it rewrite everything again."""
        merged = not full
        for done in range(max_rounds):
            todo = self.run_once(full=not merged)
            if todo is None:
                return done
            # An L0ToRun that drops tombstones took every run: all was one run after it.
            merged = merged or (isinstance(todo, L0ToRun) and todo.drop_tombstones)
        return max_rounds


def input_bytes(todo: L0ToRun, manifest: Manifest) -> int:
    """The bytes of the SSTs ``todo`` merges."""
    l0 = sum(h.object_size for h in manifest.l0 if h.id in todo.l0_ids)
    runs = sum(h.object_size for r in manifest.sorted_runs if r.id in todo.run_ids for h in r.ssts)
    return l0 + runs


def describe_inputs(todo: Plan, manifest: Manifest, wal_sizes: dict[int, int]) -> str:
    """What a compaction read, for its log line: which SSTs and how many bytes."""
    if isinstance(todo, WalToL0):
        count = todo.last_wal_id - todo.first_wal_id + 1
        size = sum(wal_sizes.get(i, 0) for i in range(todo.first_wal_id, todo.last_wal_id + 1))
        return f"WAL {todo.first_wal_id}..{todo.last_wal_id} ({count} SSTs, {size} bytes) into L0"
    dropped = ", tombstones dropped" if todo.drop_tombstones else ""
    return (
        f"{len(todo.l0_ids)} L0 SSTs and runs {list(todo.run_ids)} "
        f"({input_bytes(todo, manifest)} bytes) into "
        f"sorted run {todo.new_run_id}{dropped}"
    )
