"""A store wrapper that runs a hook before chosen writes, for deterministic interleavings.

Protocol tests use it to stop one actor just before a specific PUT (say, its fencing SST),
let another actor act, then let the first continue, reproducing the seed's timelines exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from slatepy.store.base import ObjectMeta, ObjectStore, PutMode

Hook = Callable[[str], None]


class InterceptStore(ObjectStore):
    """Delegates everything to ``inner``; calls ``before_put(path)`` before each put."""

    def __init__(self, inner: ObjectStore, before_put: Hook | None = None) -> None:
        self.inner = inner
        self.before_put = before_put

    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def supports_if_match(self) -> bool:
        return self.inner.supports_if_match

    def get(self, path: str) -> bytes:
        return self.inner.get(path)

    def get_range(self, path: str, start: int, end: int) -> bytes:
        return self.inner.get_range(path, start, end)

    def get_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return self.inner.get_ranges(path, ranges)

    def get_suffix(self, path: str, length: int) -> bytes:
        return self.inner.get_suffix(path, length)

    def head(self, path: str) -> ObjectMeta:
        return self.inner.head(path)

    def put(self, path: str, data: bytes, *, mode: PutMode = "overwrite") -> str | None:
        if self.before_put is not None:
            self.before_put(path)
        return self.inner.put(path, data, mode=mode)

    def delete(self, path: str) -> None:
        self.inner.delete(path)

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        return self.inner.list(prefix, offset=offset)

    def copy(self, source: str, destination: str) -> None:
        self.inner.copy(source, destination)
