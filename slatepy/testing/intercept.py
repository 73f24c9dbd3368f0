"""A store wrapper that runs a hook before chosen writes, for deterministic interleavings.

Protocol tests use it to stop one actor just before a specific PUT (say, its fencing SST),
let another actor act, then let the first continue, reproducing the seed's timelines exactly.
"""

from __future__ import annotations

from collections.abc import Callable

from slatepy.store.base import ObjectStore, PutMode, WrappingStore

Hook = Callable[[str], None]


class InterceptStore(WrappingStore):
    """Delegates everything to ``inner``; calls ``before_put(path)`` before each put."""

    def __init__(self, inner: ObjectStore, before_put: Hook | None = None) -> None:
        super().__init__(inner)
        self.before_put = before_put

    def put(self, path: str, data: bytes, *, mode: PutMode = "overwrite") -> str | None:
        if self.before_put is not None:
            self.before_put(path)
        return self.inner.put(path, data, mode=mode)
