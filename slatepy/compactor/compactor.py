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
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator

import msgspec

from slatepy.compactor.executor import plan_inputs, write_outputs
from slatepy.compactor.planner import CompactionPolicy, L0ToRun, Plan, apply_result, plan
from slatepy.config import Settings
from slatepy.engine.fencing import WAL_DIR, WAL_SUFFIX
from slatepy.engine.merge import merge_newest
from slatepy.engine.table import TableReader
from slatepy.errors import CompactionAbandoned
from slatepy.format.block import Entry
from slatepy.manifest.record import Manifest
from slatepy.manifest.store import ManifestStore, StoredManifest
from slatepy.store.base import ObjectStore
from slatepy.store.numbered import NumberedObjects
from slatepy.store.retry import with_retries

CANCEL_CHECK_EVERY = 4096
"""Merged entries between two looks at the cancel flag (a few ms of merging)."""


class Compactor:
    """Compacts one database. Construct it to claim the compactor epoch."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        settings: Settings | None = None,
        policy: CompactionPolicy | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Claim the compactor epoch.

        Args:
            clock: Seconds since the epoch (tests move it forward). For safety it, the
                garbage collector's clock and the store's ``last_modified`` must each be
                within ``gc_min_age / 8`` of true time (RFC 0003).
        """
        self.settings = settings or Settings()
        self.policy = policy or CompactionPolicy()
        self._wal_batch = self.policy.max_wal_ssts
        self._clock = clock
        store = with_retries(store, self.settings.request_attempts)
        self.tables = TableReader(store, cache_bytes=8 * 1024 * 1024)
        self.manifests = ManifestStore(store, attempts=self.settings.manifest_update_attempts)
        self._wal = NumberedObjects(store, WAL_DIR, WAL_SUFFIX)
        claimed = self.manifests.update(
            lambda m, _: msgspec.structs.replace(m, compactor_epoch=m.compactor_epoch + 1)
        )
        self.epoch = claimed.manifest.compactor_epoch
        self.last_published: StoredManifest = claimed
        self._cancel = threading.Event()

    def cancel(self) -> None:
        """Make a compaction in progress stop soon with ``CompactionAbandoned`` (its outputs
        are left to GC), and every later one at once. Closing a writer waits for nothing more
        than a few thousand merged entries, however large the compaction."""
        self._cancel.set()

    def run_once(self) -> Plan | None:
        """Plan and run one compaction; None when there was nothing to do."""
        stored = self.manifests.load()
        assert stored is not None  # the constructor wrote one
        manifest = stored.manifest
        # After an abandoned compaction the WAL batch shrinks, so a compactor that fell
        # behind converges instead of retrying an ever larger (ever slower) merge.
        policy = dataclasses.replace(self.policy, max_wal_ssts=self._wal_batch)
        todo = plan(manifest, self._wal.contiguous_tail(manifest.wal_id_last_compacted), policy)
        if todo is None:
            return None
        self._check_cancelled(todo)
        # GC deletes unreferenced outputs once they are gc_min_age old; publishing after half
        # of that would race it, so such a compaction is abandoned (RFC 0003). Read before
        # any output is written, so every output is at least this old.
        deadline = self._clock() + self.settings.gc_min_age / 2
        outputs = write_outputs(
            self._until_cancelled(todo, merge_newest(plan_inputs(todo, manifest, self.tables))),
            self.tables,
            self.policy,
            drop_tombstones=isinstance(todo, L0ToRun) and todo.drop_tombstones,
            block_size=self.settings.block_size,
            bloom_bits_per_key=self.settings.bloom_bits_per_key,
        )

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
            return apply_result(latest, todo, tuple(outputs), self.epoch)

        try:
            self.last_published = self.manifests.update(publish)
        except CompactionAbandoned:
            self._wal_batch = max(1, self._wal_batch // 2)
            raise
        self._wal_batch = min(self.policy.max_wal_ssts, self._wal_batch * 2)
        return todo

    def _check_cancelled(self, todo: Plan) -> None:
        if self._cancel.is_set():
            raise CompactionAbandoned(
                f"compaction {todo} cancelled: the compactor is closing; its outputs are left "
                "for the garbage collector"
            )

    def _until_cancelled(self, todo: Plan, entries: Iterator[Entry]) -> Iterator[Entry]:
        for count, entry in enumerate(entries):
            if count % CANCEL_CHECK_EVERY == 0:
                self._check_cancelled(todo)
            yield entry

    def run_until_idle(self, *, max_rounds: int = 1000) -> int:
        """Run compactions until none is left (or ``max_rounds``); return how many ran."""
        for done in range(max_rounds):
            if self.run_once() is None:
                return done
        return max_rounds
