"""Compaction: pure planning (manifest in, plan out) and streaming execution."""

from slatepy.compactor.background import BackgroundCompactor
from slatepy.compactor.compactor import Compactor
from slatepy.compactor.lease import CompactorBusy, Takeover
from slatepy.compactor.planner import CompactionPolicy, L0ToRun, WalToL0, apply_result, plan

__all__ = [
    "BackgroundCompactor",
    "CompactionPolicy",
    "Compactor",
    "CompactorBusy",
    "L0ToRun",
    "Takeover",
    "WalToL0",
    "apply_result",
    "plan",
]
