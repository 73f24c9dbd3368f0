"""The torture workload's fixed views: snapshots, checkpoints and clones (RFCs 0017, 0018)."""

from __future__ import annotations

import uuid

from slatepy.engine import checkpoint as checkpoints
from slatepy.engine.clone import clone, with_external
from slatepy.engine.db import Db
from slatepy.engine.reader import DbReader
from slatepy.errors import (
    CorruptionError,
    NotFound,
    SlatepyError,
)
from slatepy.manifest.store import ManifestStore
from slatepy.store.url import open_store
from slatepy.testing.faults import FaultyStore, uniform
from slatepy.testing.torture.model import (
    BATCH_KEYS,
    CHECKPOINT_LIFETIMES,
    KEYS,
    MAX_CHECKPOINTS,
    MAX_CLONES,
    MERGE_KEYS,
    HeldCheckpoint,
    HeldClone,
    Violation,
    concat,
)
from slatepy.testing.torture.ops_data import DataOps


class ViewOps(DataOps):
    """Snapshots, checkpoints and clones, each read against the model frozen when made."""

    def op_snapshot(self) -> None:
        """Take a snapshot and remember what it showed; release an old one now and then."""
        if self.snapshots and (len(self.snapshots) > 3 or self.rng.random() < 0.3):
            snap, _ = self.snapshots.pop(self.rng.randrange(len(self.snapshots)))
            try:
                snap.close()
            except SlatepyError:
                self.report.failed["snapshot release"] += 1
        try:
            snap = self.writer().snapshot()
        except SlatepyError:
            self.report.failed["snapshot"] += 1
            return
        try:
            rows = list(snap.scan())
        except SlatepyError:
            self.report.failed["snapshot read"] += 1
            snap._pin = None  # the pin expires on its own (faults would fail its release)
            snap.close()
            return
        self._check_view(dict(rows), "snapshot")
        self.snapshots.append((snap, rows))

    def op_snapshot_read(self) -> None:
        """A held snapshot reads what it read when taken, whatever was written, compacted
        and collected since (GC runs with ``min_age=0`` here)."""
        if not self.snapshots:
            return
        snap, rows = self.rng.choice(self.snapshots)
        try:
            now = list(snap.scan(reverse=True))
            key = self.rng.choice(KEYS + BATCH_KEYS)
            value = snap.get(key)
        except CorruptionError as exc:
            raise Violation(f"a snapshot lost data it pinned: {exc}") from exc
        except SlatepyError:
            self.report.failed["snapshot read"] += 1
            return
        if now != rows[::-1] or value != dict(rows).get(key):
            raise Violation(f"a snapshot changed: {rows} then {now[::-1]}")

    def release_snapshots(self) -> None:
        for snap, _ in self.snapshots:
            try:
                snap.close()
            except SlatepyError:
                self.report.failed["snapshot release"] += 1
        self.snapshots.clear()

    def _frozen_merged(self) -> dict[bytes, set[bytes | None]]:
        return {k: set(v) for k, v in self.merged.items()}

    def op_checkpoint(self) -> None:
        """Make a checkpoint and remember the model as it is now: by the writer (it flushes
        first, so every write so far is in it) or by the module function (what is durable
        now: unflushed writes may or may not be, as the model's unknown values say)."""
        if len(self.checkpoints) >= MAX_CHECKPOINTS:
            return
        lifetime = self.rng.choice(CHECKPOINT_LIFETIMES)
        by_writer = self.rng.random() < 0.6
        try:
            if by_writer:
                made = self.writer().create_checkpoint(lifetime=lifetime, name="torture")
            else:
                made = checkpoints.create_checkpoint(
                    self.faulty, self.settings, lifetime=lifetime, name="torture"
                )
        except SlatepyError:
            self.report.failed["checkpoint"] += 1
            if by_writer:
                self.crash()  # its flush may have failed: a writer then refuses all writes
            return
        if by_writer:
            self._acknowledge_pending()
        expires = None if made.expire_time is None else made.expire_time.timestamp()
        self.checkpoints.append(
            HeldCheckpoint(made.id, self.model.frozen(), self._frozen_merged(), expires)
        )

    def op_checkpoint_read(self) -> None:
        """A checkpoint reads the model frozen when it was made, whatever was written,
        compacted and collected since; a deleted one is ``NotFound``."""
        if self.deleted_checkpoints and self.rng.random() < 0.2:
            self._read_deleted_checkpoint(self.rng.choice(self.deleted_checkpoints))
        elif self.checkpoints:
            self._read_checkpoint(self.rng.choice(self.checkpoints))

    def _read_checkpoint(self, held: HeldCheckpoint) -> None:
        who = f"checkpoint {held.id}"
        try:
            with DbReader.open(
                self.faulty,
                settings=self.settings,
                checkpoint=held.id,
                clock=self.clock,
                merge_operator=concat,
            ) as reader:
                rows = dict(reader.scan())
                key = self.rng.choice(KEYS + BATCH_KEYS + MERGE_KEYS)
                value = reader.get(key)
        except NotFound as exc:
            if held.may_be_gone():
                self.report.checks["checkpoint gone"] += 1
                return
            raise Violation(f"{who} is live but reads as gone: {exc}") from exc
        except CorruptionError as exc:
            raise Violation(f"{who} lost data it holds: {exc}") from exc
        except SlatepyError:
            self.report.failed["checkpoint read"] += 1
            return
        if value != rows.get(key):
            raise Violation(f"{who}: get({key!r}) = {value!r}, its scan {rows.get(key)!r}")
        self._check_view(rows, who, held.model, held.merged)
        self.report.checks["checkpoint read"] += 1

    def _read_deleted_checkpoint(self, checkpoint_id: str) -> None:
        try:
            with DbReader.open(
                self.faulty, settings=self.settings, checkpoint=checkpoint_id, clock=self.clock
            ) as reader:
                rows = list(reader.scan())
        except NotFound:
            self.report.checks["deleted checkpoint"] += 1
            return
        except SlatepyError:
            self.report.failed["checkpoint read"] += 1
            return
        raise Violation(f"deleted checkpoint {checkpoint_id} still reads: {rows!r}")

    def op_checkpoint_drop(self) -> None:
        """Delete a checkpoint (the next collections may take what only it held: nothing
        live may go with it), or now and then refresh one."""
        if not self.checkpoints:
            return
        held = self.rng.choice(self.checkpoints)
        if self.rng.random() < 0.3:
            lifetime = self.rng.choice([None, 3600.0])
            try:
                made = checkpoints.refresh_checkpoint(self.faulty, self.settings, held.id, lifetime)
            except NotFound as exc:
                if not held.may_be_gone():
                    raise Violation(f"refreshing live checkpoint {held.id}: {exc}") from exc
                self.checkpoints.remove(held)
                return
            except SlatepyError:
                self.report.failed["checkpoint refresh"] += 1  # the earliest expiry stands
                return
            held.maybe_gone = False  # it was there to refresh
            held.expires = None if made.expire_time is None else made.expire_time.timestamp()
            return
        try:
            checkpoints.delete_checkpoint(self.faulty, self.settings, held.id)
        except NotFound as exc:
            if not held.may_be_gone():
                raise Violation(f"deleting live checkpoint {held.id}: {exc}") from exc
        except SlatepyError:
            self.report.failed["checkpoint delete"] += 1
            held.maybe_gone = True  # a lost reply: deleted, or not
            return
        self.checkpoints.remove(held)
        self.deleted_checkpoints.append(held.id)

    def op_clone(self) -> None:
        """Clone the database (now, or one of its checkpoints) into a new location, write
        to the clone, and check it reads the source's frozen model plus its own writes while
        the source still reads its own model."""
        if self.clone_root is None or len(self.clones) >= MAX_CLONES:
            return
        self.writer()  # a database to clone
        source = self.rng.choice([None, *self.checkpoints])
        location = open_store(
            f"{self.clone_root.rstrip('/')}/clone-{uuid.uuid4().hex[:12]}",
            self.store_settings,
            create=True,
        )
        dst = FaultyStore(location, uniform(self.fault_rate), seed=self.rng.randrange(2**32))
        if source is None:
            model, merged = self.model.frozen(), self._frozen_merged()
        else:
            model = source.model.frozen()
            merged = {k: set(v) for k, v in source.merged.items()}
        try:
            clone(
                self.faulty,
                dst,
                checkpoint=None if source is None else source.id,
                settings=self.settings,
            )
        except NotFound as exc:
            if source is not None and source.may_be_gone():
                return
            raise Violation(f"clone of a live database or checkpoint: {exc}") from exc
        except SlatepyError:
            self.report.failed["clone"] += 1
            self._check_failed_clone(dst)
            return
        held = HeldClone(dst, model, merged)
        self.clones.append(held)
        self._use_clone(held, writes=self.rng.randint(1, 4))
        self.op_scan()  # the source reads its own model still

    def _check_failed_clone(self, dst: FaultyStore) -> None:
        """A clone that raised left no database, or one whose checkpoint still holds what
        it shares (never a database that breaks when the source collects)."""
        self.faulty.enabled = dst.enabled = False
        try:
            stored = ManifestStore(dst).load()
            if stored is None:
                return
            live = {c.id for c in checkpoints.list_checkpoints(self.faulty, self.settings)}
            for external in stored.manifest.external_dbs:
                if external.checkpoint_id not in live:
                    raise Violation(
                        f"a clone that raised left a database at {dst.url} whose checkpoint "
                        f"{external.checkpoint_id} in the source is gone"
                    )
            self.report.checks["failed clone left a usable database"] += 1
        finally:
            self.faulty.enabled = dst.enabled = True

    def _use_clone(self, held: HeldClone, *, writes: int) -> None:
        """Open the clone's writer, make ``writes`` durable puts and deletes, read it whole."""
        try:
            db = Db.open(
                held.store, settings=self.settings, clock=self.clock, merge_operator=concat
            )
        except SlatepyError:
            self.report.failed["clone open"] += 1
            return
        try:
            for _ in range(writes):
                key = self.rng.choice(KEYS)
                value = self._value(key) if self.rng.random() < 0.8 else None
                held.model.written(key, value)
                if value is None:
                    db.delete(key)
                else:
                    db.put(key, value)
                held.model.acknowledged(key, value)
            rows = dict(db.scan())
        except CorruptionError as exc:
            db._crash()
            raise Violation(f"clone {held.store.url}: {exc}") from exc
        except SlatepyError:
            self.report.failed["clone write"] += 1
            db._crash()
            return
        try:
            db.close()
        except SlatepyError:
            self.report.failed["clone close"] += 1
        self._check_view(rows, f"clone {held.store.url}", held.model, held.merged)
        self.report.checks["clone read"] += 1

    def op_clone_read(self) -> None:
        """Compact and collect a clone, or write to it, then read it with a fresh reader:
        its model still holds after the source's compactions and collections."""
        if not self.clones:
            return
        held = self.rng.choice(self.clones)
        roll = self.rng.random()
        if roll < 0.3:
            self._compact_and_collect(held.store)
        elif roll < 0.6:
            self._use_clone(held, writes=self.rng.randint(1, 3))
        self._read_clone(held)

    def _read_clone(self, held: HeldClone) -> None:
        who = f"clone reader {held.store.url}"
        try:
            with DbReader.open(
                held.store, settings=self.settings, clock=self.clock, merge_operator=concat
            ) as reader:
                rows = dict(reader.scan())
        except (CorruptionError, NotFound) as exc:
            raise Violation(f"{who}: {exc}") from exc
        except SlatepyError:
            self.report.failed["clone read"] += 1
            return
        self._check_view(rows, who, held.model, held.merged)
        self.report.checks["clone read"] += 1

    def _compact_and_collect(self, store: FaultyStore) -> None:
        self._compact(with_external(store, self.settings))
        self._collect(store)
