"""The numbered manifest store: find the latest, read it, write the next with CAS.

An update is list → read latest → apply a pure function → create ``next`` if absent. Losing
the create means another process wrote ``next`` first; the loop starts over from the new
latest manifest and re-applies the function, so concurrent updates never overwrite each other.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from slatepy.errors import CorruptionError, ManifestConflictError, NotFound
from slatepy.manifest.record import Manifest
from slatepy.store.base import ObjectStore
from slatepy.store.numbered import NumberedObjects

MANIFEST_DIR = "manifest"
MANIFEST_SUFFIX = ".manifest"

Update = Callable[[Manifest, int], Manifest | None]
"""``(latest, next_id) -> new manifest`` or ``None`` for "nothing to change"."""


@dataclass(frozen=True, slots=True)
class StoredManifest:
    """A manifest together with the id it was read from or written to."""

    id: int
    manifest: Manifest


class ManifestStore:
    """Reads and writes the manifest sequence of one database."""

    def __init__(self, store: ObjectStore, *, attempts: int = 64) -> None:
        self.objects = NumberedObjects(store, MANIFEST_DIR, MANIFEST_SUFFIX)
        self._attempts = attempts
        self._known: int | None = None
        self._cached: StoredManifest | None = None

    def path(self, manifest_id: int) -> str:
        return self.objects.path(manifest_id)

    def latest_id(self) -> int | None:
        """Id of the newest manifest (lists only past the newest id seen so far)."""
        newer = self.objects.latest(after=self._known)
        if newer is not None:
            self._known = newer
        return self._known

    def read(self, manifest_id: int) -> Manifest:
        cached = self._cached
        if cached is not None and cached.id == manifest_id:
            return cached.manifest
        manifest = Manifest.decode(self.objects.read(manifest_id))
        self._cached = StoredManifest(manifest_id, manifest)
        return manifest

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
            new = msgspec.structs.replace(new, update_id=uuid.uuid4().hex)
            existing = self.objects.create(next_id, new.encode())
            if existing is None:
                self._known = next_id
                self._cached = StoredManifest(next_id, new)
                return self._cached
            # Lost the race: back off a little so racing updaters spread out.
            time.sleep(random.uniform(0, 0.002 * min(attempt + 1, 20)))
        raise ManifestConflictError(
            f"manifest update lost the compare-and-swap {self._attempts} times; "
            "too many processes are updating this database's manifest at once"
        )
