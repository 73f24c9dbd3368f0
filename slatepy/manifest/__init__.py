"""The manifest record, its numbered CAS store, epochs and snapshots."""

from slatepy.manifest.record import Manifest, Snapshot, SortedRun, SstHandle
from slatepy.manifest.store import ManifestStore, StoredManifest

__all__ = ["Manifest", "ManifestStore", "Snapshot", "SortedRun", "SstHandle", "StoredManifest"]
