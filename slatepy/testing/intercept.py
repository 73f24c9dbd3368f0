"""A store wrapper that runs a hook before chosen writes, for deterministic interleavings.

Protocol tests use it to stop one actor just before a specific PUT (say, its fencing SST),
let another actor act, then let the first continue, reproducing the seed's timelines exactly.
"""

from __future__ import annotations

from collections.abc import Callable

from slatepy.store.base import ObjectMeta, ObjectStore, PutData, PutMode, WrappingStore

Hook = Callable[[str], None]


class InterceptStore(WrappingStore):
    """Delegates everything to ``inner``; calls a hook with the path before chosen requests.

    ``before_put(path)`` runs before each put, ``before_list(prefix)`` before each list and
    ``after_put(path)`` once a put has landed (before its caller hears of it). A hook may
    block (to pause an actor at that step), act, or raise (to fail the request).
    """

    def __init__(
        self,
        inner: ObjectStore,
        before_put: Hook | None = None,
        *,
        before_list: Hook | None = None,
        after_put: Hook | None = None,
    ) -> None:
        super().__init__(inner)
        self.before_put = before_put
        self.before_list = before_list
        self.after_put = after_put

    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> str | None:
        if self.before_put is not None:
            self.before_put(path)
        result = self.inner.put(path, data, mode=mode)
        if self.after_put is not None:
            self.after_put(path)
        return result

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        if self.before_list is not None:
            self.before_list(prefix)
        return self.inner.list(prefix, offset=offset)
