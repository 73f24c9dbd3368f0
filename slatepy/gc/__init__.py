"""Garbage collection: pure selection rules (``rules``) and the collector that deletes."""

from slatepy.gc.collector import GarbageCollector, GcReport
from slatepy.gc.rules import Deletion, Listing, active_manifest_ids, select_garbage

__all__ = [
    "Deletion",
    "GarbageCollector",
    "GcReport",
    "Listing",
    "active_manifest_ids",
    "select_garbage",
]
