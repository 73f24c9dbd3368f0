"""``Db``'s manifest adoption: refreshing the view, adopting what the compactor published
(pruning the memtable), waiting for compaction, and the checkpoints (RFC 0017)."""

from __future__ import annotations

import logging
import time

from slatepy.engine import checkpoint as checkpoints
from slatepy.engine.checkpoint import Checkpoint
from slatepy.engine.db_state import DbState
from slatepy.engine.memtable import Version
from slatepy.engine.view import (
    get_compacted,
    missing_sst,
)
from slatepy.errors import (
    NotFound,
    SlatepyError,
    WriteStalled,
)
from slatepy.manifest.record import Manifest

log = logging.getLogger("slatepy.engine.db")  # the logger these messages always had

STALL_POLL_SECONDS = 0.05


class ManifestAdoption(DbState):
    """How :class:`~slatepy.engine.db.Db` follows the manifest (see there)."""

    def refresh(self) -> None:
        """Pick up compactions published since open (and release compacted memtable data)."""
        self._check_open()
        stored = self._manifests.load()
        if stored is not None:
            self._apply_manifest(stored.manifest)

    def _compacted_version(self, key: bytes) -> Version | None:
        """The newest version of ``key`` in the view's SSTs: what merge operands written over
        a memtable version older than an ingestion fold over if it is newer (the memtable
        asks, under the writer's lock, before the write is in the WAL; rare)."""
        try:
            return get_compacted(self._tables, self._view, key)
        except NotFound as exc:
            raise missing_sst(exc) from exc

    def _wait_for_compaction(self) -> None:
        """Backpressure: block until compaction shrinks the memtable below the limit."""
        deadline = time.monotonic() + self._settings.write_stall_timeout
        while time.monotonic() < deadline:
            self._check_open()
            self._pruned.clear()
            self.refresh()  # adopts compactions published by any compactor
            if self._memtable.size_bytes < self._settings.max_unflushed_bytes:
                return
            # The in-process compactor's publication prunes the memtable (_apply_manifest)
            # and ends the wait at once; another compactor's is found by the next refresh.
            # A wait that short may end before the wake before it can be repeated, so the
            # stalled writer keeps its compactor awake (still once per flush_interval).
            if self._compactor is not None:
                self._compactor.wake(min_interval=self._settings.flush_interval)
            self._pruned.wait(min(STALL_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        failed = None if self._compactor is None else self._compactor.last_error
        raise WriteStalled(
            f"{self._memtable.size_bytes} bytes are written but not compacted "
            f"(max_unflushed_bytes={self._settings.max_unflushed_bytes}) and compaction did "
            f"not catch up in {self._settings.write_stall_timeout} s; "
            + (
                "is a compactor running?"
                if failed is None
                else f"the in-process compactor's passes fail: {failed}"
            )
        ) from failed

    def _refresh_stale_view(self) -> None:
        """Keep the read view younger than a quarter of GC's grace period (RFC 0003)."""
        if time.monotonic() - self._view_time > self._stale_view_seconds:
            self.refresh()

    def _adopt_published(self, manifest: Manifest) -> None:
        if not self._closed:
            self._apply_manifest(manifest)

    def _apply_manifest(self, manifest: Manifest) -> None:
        """Adopt ``manifest`` as the read view and prune what it has compacted."""
        with self._lock:
            if manifest.wal_id_last_compacted < self._view.wal_id_last_compacted:
                return  # an older manifest than the one we have
            self._view = manifest
            self._view_time = time.monotonic()
            cutoff = manifest.wal_id_last_compacted
            known = {**self._replayed_max_seq, **dict(list(self._wal.max_seq_by_id.items()))}
            compacted = [seq for wal_id, seq in known.items() if wal_id <= cutoff]
            if manifest.writer_epoch > self.epoch and self._retain_bytes:
                # A newer writer fenced this one: what it keeps may be overwritten or
                # deleted since, so it keeps nothing compacted from now on.
                self._retain_bytes = 0
                compacted.append(0)
            if compacted:
                # A closing writer drops its whole memtable when the close's compactions
                # are done: pruning it after each of them (8% of a close's CPU) is wasted.
                if not self._closed:
                    self._memtable.prune(
                        max(compacted),
                        retain_bytes=self._retain_bytes,
                        floor_seq=manifest.last_ingest_seq,
                    )
                self._pruned.set()
            for wal_id in [i for i in known if i <= cutoff]:
                self._replayed_max_seq.pop(wal_id, None)
                self._wal.max_seq_by_id.pop(wal_id, None)
            try:
                self._memtable.adopt_ingestion(manifest.last_ingest_seq)
            except SlatepyError as exc:  # tried again at the next refresh
                log.warning("re-folding merges over a new ingestion failed: %s", exc)

    def create_checkpoint(
        self, *, lifetime: float | None = None, name: str | None = None
    ) -> Checkpoint:
        """Flush the WAL, then register a checkpoint of the database (RFC 0017).

        The checkpoint holds the newest manifest and the WAL prefix after it, so it contains
        every write made before this call; GC keeps what it reaches until it is deleted or
        expires. Read it with ``DbReader.open(url, checkpoint=cp.id)``; clone from it with
        ``slatepy.clone``.

        Args:
            lifetime: Seconds until it expires (:meth:`refresh_checkpoint` extends it);
                None: it never expires.
            name: A label for humans.
        """
        self.flush()
        return checkpoints.create_checkpoint(
            self._store, self._settings, lifetime=lifetime, name=name
        )

    def list_checkpoints(self) -> list[Checkpoint]:
        """The database's unexpired checkpoints, oldest first."""
        self._check_open()
        return checkpoints.list_checkpoints(self._store, self._settings)

    def refresh_checkpoint(self, checkpoint_id: str, lifetime: float | None) -> Checkpoint:
        """Make a checkpoint expire ``lifetime`` seconds from now (None: never)."""
        self._check_open()
        return checkpoints.refresh_checkpoint(self._store, self._settings, checkpoint_id, lifetime)

    def delete_checkpoint(self, checkpoint_id: str) -> None:
        """Remove a checkpoint (``NotFound`` if there is none); GC may then collect what only
        it held."""
        self._check_open()
        checkpoints.delete_checkpoint(self._store, self._settings, checkpoint_id)
