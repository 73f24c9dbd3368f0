"""A store wrapper that runs a hook before chosen requests, for deterministic interleavings.

Protocol tests use it to stop one actor just before a specific PUT (say, its fencing SST),
let another actor act, then let the first continue, reproducing the seed's timelines exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from slatepy.store.base import ObjectMeta, ObjectStore, PutData, PutMode, WrappingStore

Hook = Callable[[str], None]


class InterceptStore(WrappingStore):
    """Delegates everything to ``inner``; calls a hook with the path before chosen requests.

    ``before_put(path)`` runs before each put, ``before_list(prefix)`` before each list,
    ``after_put(path)`` once a put has landed (before its caller hears of it) and
    ``before_read(path)`` before each read (``get``, ``get_range``, ``get_ranges``,
    ``get_suffix``). A hook may block (to pause an actor at that step), act, or raise (to
    fail the request).
    """

    def __init__(
        self,
        inner: ObjectStore,
        before_put: Hook | None = None,
        *,
        before_list: Hook | None = None,
        after_put: Hook | None = None,
        before_read: Hook | None = None,
    ) -> None:
        super().__init__(inner)
        self.before_put = before_put
        self.before_list = before_list
        self.after_put = after_put
        self.before_read = before_read

    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> str | None:
        if self.before_put is not None:
            self.before_put(path)
        result = self.inner.put(path, data, mode=mode)
        if self.after_put is not None:
            self.after_put(path)
        return result

    def get(self, path: str) -> bytes:
        if self.before_read is not None:
            self.before_read(path)
        return self.inner.get(path)

    def get_range(self, path: str, start: int, end: int) -> bytes:
        if self.before_read is not None:
            self.before_read(path)
        return self.inner.get_range(path, start, end)

    def get_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        if self.before_read is not None:
            self.before_read(path)
        return self.inner.get_ranges(path, ranges)

    def get_suffix(self, path: str, length: int) -> bytes:
        if self.before_read is not None:
            self.before_read(path)
        return self.inner.get_suffix(path, length)

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        if self.before_list is not None:
            self.before_list(prefix)
        return self.inner.list(prefix, offset=offset)
