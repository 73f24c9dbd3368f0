"""The numbered manifest store: find the latest, read it, write the next with CAS.

An update is list → read latest → apply a pure function → create ``next`` if absent. Losing
the create means another process wrote ``next`` first; the loop starts over from the new
latest manifest and re-applies the function, so concurrent updates never overwrite each other.

Pollers (readers, compactors) that only want to know whether a newer manifest exists use
:meth:`ManifestStore.poll` instead of a listing: one GET of the next id, which on S3 costs a
twelfth of a LIST. A missing next id proves the known one is still the newest only if it
cannot have been created and then collected since the last look, so probes are trusted for
at most half of ``gc_min_age`` after the last listing or probe (``probe_window``); updates
always list (RFC 0021).
"""

from __future__ import annotations

import math
import random
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from slatepy.errors import (
    CorruptionError,
    ManifestConflictError,
    NotASlatepyDatabase,
    NotFound,
    SlatepyError,
    UnsupportedFormatVersion,
)
from slatepy.manifest.record import MANIFEST_FORMAT_VERSION, MANIFEST_MAGIC, Manifest
from slatepy.store.base import ObjectStore
from slatepy.store.numbered import NumberedObjects

MANIFEST_DIR = "manifest"
MANIFEST_SUFFIX = ".manifest"

FOREIGN_CHECK_LIMIT = 16
"""Other manifests whose first bytes are read to tell damage from foreign data."""
POLL_PROBES = 4
"""New manifests :meth:`ManifestStore.poll` fetches one by one before it lists instead."""
OURS = "ours"
FOREIGN = "foreign"


def header_kind(data: bytes) -> str:
    """Whether an object's first bytes are a slatepy manifest's (``ours``), something else
    (``foreign``), or too short to tell (``short``)."""
    if data[: len(MANIFEST_MAGIC)] == MANIFEST_MAGIC:
        return OURS
    return FOREIGN if len(data) >= len(MANIFEST_MAGIC) else "short"


Update = Callable[[Manifest, int], Manifest | None]
"""``(latest, next_id) -> new manifest`` or ``None`` for "nothing to change"."""


@dataclass(frozen=True, slots=True)
class StoredManifest:
    """A manifest together with the id it was read from or written to."""

    id: int
    manifest: Manifest


class ManifestStore:
    """Reads and writes the manifest sequence of one database."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        attempts: int = 64,
        probe_window: float = 0.0,
        cache_bytes: int = 0,
    ) -> None:
        """Args:
        store: Where the manifests are.
        attempts: Compare-and-swap attempts of an update before it gives up.
        probe_window: Seconds a missing next manifest, found by :meth:`poll`, is trusted
            to mean "nothing newer" after the last confirmation: at most half of
            ``gc_min_age`` (a collector deletes a superseded manifest only after that
            long, so a next manifest that appeared after the last look is still there).
            0 makes every poll list.
        """
        self.objects = NumberedObjects(store, MANIFEST_DIR, MANIFEST_SUFFIX)
        self._attempts = attempts
        self._probe_window = probe_window
        self._known: int | None = None
        self._confirmed_at = -math.inf  # monotonic time ``_known`` was last known newest
        self._cached: StoredManifest | None = None
        self._older = _ManifestCache(cache_bytes)

    def path(self, manifest_id: int) -> str:
        return self.objects.path(manifest_id)

    def latest_id(self) -> int | None:
        """Id of the newest manifest (lists only past the newest id seen so far)."""
        started = time.monotonic()
        newer = self.objects.latest(after=self._known)
        if newer is not None:
            self._known = newer
        if self._known is not None:
            self._confirmed_at = started
        return self._known

    def newest_seen(self) -> StoredManifest | None:
        """The newest manifest this store has read or written, if it still holds it decoded
        (no request)."""
        cached = self._cached
        return cached if cached is not None and cached.id == self._known else None

    def poll(self) -> StoredManifest | None:
        """The newest manifest, as cheaply as can be trusted: GETs of the ids after the newest
        known, so a poll that finds nothing new costs one request and one that finds a new
        manifest two. It lists instead when no manifest is known yet, after
        ``POLL_PROBES`` new ones in a row (a busy database), or once ``probe_window`` has
        passed since the last confirmation (see the module docstring)."""
        known, started = self._known, time.monotonic()
        if known is None or started - self._confirmed_at > self._probe_window:
            return self.load()
        for _ in range(POLL_PROBES):
            data = self.objects.probe(known + 1)
            if data is None:
                self._confirmed_at = started
                try:
                    return StoredManifest(known, self.read(known))  # usually cached: no GET
                except NotFound:
                    return self.load()
            known += 1
            try:
                self._cached = StoredManifest(known, Manifest.decode(data))
            except UnsupportedFormatVersion as exc:
                raise exc.at(self.path(known)) from exc
            except CorruptionError as exc:
                raise self._damaged(known, data, exc) from exc
            self._known = known
        return self.load()  # lists only past the newest found

    def read(self, manifest_id: int) -> Manifest:
        """Read and verify manifest ``manifest_id``.

        Raises:
            NotFound: there is no such manifest.
            CorruptionError: it is damaged; ``path`` names it.
            UnsupportedFormatVersion: a newer slatepy wrote it; ``path`` names it.
            NotASlatepyDatabase: it, and every other manifest-named object here, is not a
                slatepy manifest at all (another program's data).
        """
        cached = self._cached
        if cached is not None and cached.id == manifest_id:
            return cached.manifest
        older = self._older.get(manifest_id)
        if older is not None:
            return older
        data = self.objects.read(manifest_id)
        try:
            manifest = Manifest.decode(data)
        except UnsupportedFormatVersion as exc:
            raise exc.at(self.path(manifest_id)) from exc
        except CorruptionError as exc:
            raise self._damaged(manifest_id, data, exc) from exc
        self._cached = StoredManifest(manifest_id, manifest)
        self._older.add(manifest_id, manifest, len(data))
        return manifest

    def _damaged(self, manifest_id: int, data: bytes, exc: CorruptionError) -> SlatepyError:
        """The error for manifest ``manifest_id`` (``data``) failing to decode with ``exc``.

        Damage to our own manifest and someone else's data in our directory look alike to
        the decoder (the checksum fails first). Telling them apart matters: the first wants
        ``slatepy doctor``, the second a different URL. So the manifest-named objects are
        sorted by their first bytes: ours carry ``SLPM``; 4 or more bytes without it are
        foreign; a shorter (truncated) object is neither. Only when none is ours and some are
        foreign is this "not a slatepy database". Costs nothing unless a decode failed.
        """
        path = self.path(manifest_id)
        kinds = {header_kind(data)}
        if OURS not in kinds:
            others = [i for i in self.objects.ids() if i != manifest_id][-FOREIGN_CHECK_LIMIT:]
            for other in reversed(others):
                try:
                    kinds.add(header_kind(self.objects.read(other)))  # small; ranges fail on 0 B
                except NotFound:
                    continue
                if OURS in kinds:
                    break
        if OURS not in kinds and FOREIGN in kinds:
            return NotASlatepyDatabase(
                f"{path} is not a slatepy manifest (it starts with {bytes(data[:8])!r}, not "
                f"{MANIFEST_MAGIC!r}), and neither is any other object under {MANIFEST_DIR}/: "
                f"{self.objects.store.url} is not a slatepy database (a SlateDB database, or "
                "other files?). Check the URL; nothing was written.",
                path=path,
            )
        return CorruptionError(
            f"{path}: {exc}; the manifest is damaged. Run `slatepy doctor URL` to see what "
            "a repair (falling back to the newest intact manifest) would give up.",
            path=path,
        )

    def load(self) -> StoredManifest | None:
        """The newest manifest, or None if the database has none yet."""
        for _ in range(self._attempts):
            latest = self.latest_id()
            if latest is None:
                return None
            try:
                return StoredManifest(latest, self.read(latest))
            except NotFound:
                # A garbage collector may delete an old manifest we listed; list afresh.
                self._known = None
        raise CorruptionError("manifest: the latest manifest keeps disappearing")

    def put_after(self, latest_id: int, manifest: Manifest) -> StoredManifest | None:
        """Write ``manifest`` as id ``latest_id + 1`` if nobody has (the CAS of every update).

        For a repair, which cannot read the latest manifest (it is damaged) and so cannot use
        :meth:`update`. Returns None when another process took that id first.
        """
        new = msgspec.structs.replace(
            manifest, update_id=uuid.uuid4().hex, format_version=MANIFEST_FORMAT_VERSION
        )
        started = time.monotonic()
        if self.objects.create(latest_id + 1, new.encode()) is not None:
            return None
        self._known, self._confirmed_at = latest_id + 1, started
        self._cached = StoredManifest(latest_id + 1, new)
        return self._cached

    def update(self, fn: Update) -> StoredManifest:
        """Apply ``fn`` to the latest manifest and write the result as the next one.

        A database with no manifest starts from ``Manifest()`` at id 1. Returns the
        manifest now current (unchanged if ``fn`` returned None).

        Raises:
            ManifestConflictError: the CAS was lost ``attempts`` times in a row.
        """
        for attempt in range(self._attempts):
            current = self.load()
            base = current.manifest if current else Manifest()
            next_id = current.id + 1 if current else 1
            new = fn(base, next_id)
            if new is None:
                if current is None:
                    return StoredManifest(0, base)
                return current
            new = msgspec.structs.replace(
                new, update_id=uuid.uuid4().hex, format_version=MANIFEST_FORMAT_VERSION
            )
            started = time.monotonic()
            existing = self.objects.create(next_id, new.encode())
            if existing is None:
                self._known, self._confirmed_at = next_id, started
                self._cached = StoredManifest(next_id, new)
                return self._cached
            # Lost the race: back off a little so racing updaters spread out.
            time.sleep(random.uniform(0, 0.002 * min(attempt + 1, 20)))
        raise ManifestConflictError(
            f"manifest update lost the compare-and-swap {self._attempts} times; "
            "too many processes are updating this database's manifest at once"
        )


class _ManifestCache:
    """Decoded manifests by id, least recently used first out, bounded by encoded bytes."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[int, tuple[Manifest, int]] = OrderedDict()
        self._bytes = 0

    def get(self, manifest_id: int) -> Manifest | None:
        entry = self._entries.get(manifest_id)
        if entry is None:
            return None
        self._entries.move_to_end(manifest_id)
        return entry[0]

    def add(self, manifest_id: int, manifest: Manifest, size: int) -> None:
        if size > self._capacity or manifest_id in self._entries:
            return
        self._entries[manifest_id] = (manifest, size)
        self._bytes += size
        while self._bytes > self._capacity:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._bytes -= evicted
