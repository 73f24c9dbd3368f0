"""Words for a GC report: what was held back and when it becomes collectable (RFC 0017).

Pure formatting of :class:`~slatepy.gc.holds.HoldSummary` and :class:`~slatepy.gc.holds.Hold`
values, shared by ``slatepy gc``, ``slatepy inspect`` and the collector's log line.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from slatepy.gc.holds import Hold, HoldSummary
from slatepy.manifest.record import CLONE_CHECKPOINT_PREFIX

CLONE_RELEASES = "held by a clone: its GC releases it once it reads nothing here"


def human_bytes(size: int) -> str:
    """``512 B``, ``1.5 kB``, ``24.1 MB``, ``3.2 GB`` (powers of 1000)."""
    if size < 1000:
        return f"{size} B"
    value = float(size)
    for unit in ("kB", "MB", "GB", "TB"):
        value /= 1000
        if value < 1000 or unit == "TB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def when(at: dt.datetime, now: dt.datetime | None) -> str:
    """``10:32:05 UTC`` (with the date when it is not ``now``'s day), ``(in 31 min)`` after
    it when ``now`` is known; a time already past is ``now``."""
    at = at.astimezone(dt.UTC)
    if now is not None and at <= now:
        return "now"
    same_day = now is not None and at.date() == now.astimezone(dt.UTC).date()
    text = at.strftime("%H:%M:%S UTC" if same_day else "%Y-%m-%d %H:%M:%S UTC")
    if now is None:
        return text
    return f"{text} (in {_duration((at - now).total_seconds())})"


def describe_held(summaries: Sequence[HoldSummary], *, now: dt.datetime | None) -> str:
    """One line: ``held back: 24 objects, 24.1 MB by gc_min_age (collectable from ...,
    all by ...); 3 objects, 1.2 MB by snapshot <id> (expires ...)``."""
    if not summaries:
        return "held back: nothing"
    return "held back: " + "; ".join(_one(s, now) for s in summaries)


def describe_hold(hold: Hold, *, now: dt.datetime | None) -> str:
    """One object: ``path  (size, reason: detail, collectable at ...)``."""
    if hold.collectable_at is not None:
        at = f"collectable {when(hold.collectable_at, now)}"
    elif hold.reason == "checkpoint":
        at = "until " + (
            "the clone's GC releases it" if _by_clone(hold.detail) else "the checkpoint is deleted"
        )
    else:
        at = "not by time"
    return f"{hold.path}  ({human_bytes(hold.size)}, {_reason(hold.reason)}: {hold.detail}, {at})"


def _one(s: HoldSummary, now: dt.datetime | None) -> str:
    count = f"{s.objects} object{'s' if s.objects != 1 else ''}, {human_bytes(s.bytes)}"
    if s.reason == "min_age":
        return f"{count} by gc_min_age ({_span(s, now, 'collectable from')})"
    if s.reason in ("snapshot", "checkpoint"):
        if s.forever and s.reason == "checkpoint":
            release = CLONE_RELEASES if _by_clone(s.detail) else "delete it to release"
            expiry = f"no expiry: {release}"
        elif s.forever:
            expiry = "never"
        else:
            assert s.latest is not None
            expiry = f"expires {when(s.latest, now)}"
        return f"{count} by {s.reason} {s.detail} ({expiry})"
    if s.latest is None:
        return f"{count} kept: {s.detail}"
    return f"{count} kept: {s.detail} ({_span(s, now, 'until')})"


def _by_clone(detail: str) -> bool:
    """Whether a checkpoint hold's detail (``id (name)``) names a clone's checkpoint."""
    return f"({CLONE_CHECKPOINT_PREFIX}" in detail


def _span(s: HoldSummary, now: dt.datetime | None, lead: str) -> str:
    assert s.earliest is not None and s.latest is not None
    first, last = when(s.earliest, now), when(s.latest, now)
    return f"{lead} {first}" + (f", all by {last}" if last != first else "")


def _reason(reason: str) -> str:
    return "gc_min_age" if reason == "min_age" else reason


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    if seconds < 3600 * 2:
        return f"{round(seconds / 60)} min"
    if seconds < 86400 * 2:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
