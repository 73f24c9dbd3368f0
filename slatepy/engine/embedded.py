"""What a writer's own process still reads, for its collector when no one else can read
(RFC 0029: an embedded ``file://`` database stays near its live size).

Every read view the writer hands out (an iterator, a scan, a batch scan, a transaction's
scan) is a :class:`TrackedView`, held weakly in :class:`LiveViews` while the caller keeps
it; point reads use the writer's current view and retry once on a collected SST. The
collector spares what these views' manifests reference.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator

import msgspec

from slatepy.config import Settings
from slatepy.engine.iterator import View
from slatepy.manifest.record import Manifest
from slatepy.store.attach import Attachment


class TrackedView(View):
    """A :class:`View` that can be referenced weakly (the base class has slots only), and
    is hashed by identity (two views of equal fields are two uses)."""

    __hash__ = object.__hash__
    __eq__ = object.__eq__


class LiveViews:
    """The views a writer handed out that are still referenced."""

    def __init__(self) -> None:
        """An empty registry."""
        self._views: weakref.WeakSet[TrackedView] = weakref.WeakSet()

    def track(self, view: TrackedView) -> TrackedView:
        """Record ``view`` (under the writer's lock) and return it."""
        self._views.add(view)
        return view

    def manifests(self) -> list[Manifest]:
        """The manifests of the views still referenced."""
        return [view.manifest for view in list(self._views)]


@contextlib.contextmanager
def alone(
    attachment: Attachment | None, lock: threading.Lock, in_use: Callable[[], list[Manifest]]
) -> Iterator[list[Manifest] | None]:
    """While no other process has the database open, hold the writer's ``lock`` (no view
    is made or adopted meanwhile) and yield the manifests its process reads; else None."""
    if attachment is None:
        yield None
        return
    with attachment.alone() as sole:
        if not sole:
            yield None
            return
        with lock:
            yield in_use()


EMBEDDED_GC_INTERVAL = 1.0
"""Seconds between a ``file://`` writer's GC passes (backing off while they delete nothing):
a pass lists three local directories, and alone it returns what compaction freed."""


def embedded_gc(settings: Settings, attachment: Attachment | None) -> Settings:
    """``settings`` for a writer's in-process compactor: on ``file://`` (an ``attachment``),
    GC every :data:`EMBEDDED_GC_INTERVAL` at most, so an embedded database stays near its
    live size (RFC 0029); elsewhere unchanged (a pass costs requests)."""
    if attachment is None or settings.gc_interval <= EMBEDDED_GC_INTERVAL:
        return settings
    return msgspec.structs.replace(settings, gc_interval=EMBEDDED_GC_INTERVAL)
