"""Garbage collection: pure selection rules (``rules``), why the rest is kept (``holds``),
and the collector that deletes."""

from slatepy.gc.collector import GarbageCollector, GcReport
from slatepy.gc.holds import Hold, HoldReason, HoldSummary, explain_holds, summarize
from slatepy.gc.rules import Deletion, Listing, active_manifest_ids, select_garbage

__all__ = [
    "Deletion",
    "GarbageCollector",
    "GcReport",
    "Hold",
    "HoldReason",
    "HoldSummary",
    "Listing",
    "active_manifest_ids",
    "explain_holds",
    "select_garbage",
    "summarize",
]
