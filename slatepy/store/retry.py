"""Retrying idempotent store requests.

A read, list, head, delete, copy or overwrite that fails with ``StoreUnavailable`` can be
repeated safely: doing it twice has the same effect as once. ``RetryingStore`` repeats them
with jittered exponential backoff. Creates (``put(mode="create")``) and If-Match writes are
*not* retried here: whether a lost reply means "landed" must be decided by reading the
object back, which :func:`slatepy.store.cas.create_if_absent` does.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from slatepy.errors import StoreUnavailable
from slatepy.store.base import ObjectMeta, ObjectStore, PutMode, WrappingStore

T = TypeVar("T")
BACKOFF_START = 0.01
BACKOFF_MAX = 0.5


class RetryingStore(WrappingStore):
    """``inner`` with each idempotent request tried up to ``attempts`` times."""

    def __init__(self, inner: ObjectStore, attempts: int) -> None:
        super().__init__(inner)
        self.attempts = attempts

    def _retry(self, fn: Callable[[], T]) -> T:
        for attempt in range(self.attempts - 1):
            try:
                return fn()
            except StoreUnavailable:
                delay = min(BACKOFF_MAX, BACKOFF_START * 2**attempt)
                time.sleep(random.uniform(delay / 2, delay))
        return fn()

    def get(self, path: str) -> bytes:
        return self._retry(lambda: self.inner.get(path))

    def get_range(self, path: str, start: int, end: int) -> bytes:
        return self._retry(lambda: self.inner.get_range(path, start, end))

    def get_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return self._retry(lambda: self.inner.get_ranges(path, ranges))

    def get_suffix(self, path: str, length: int) -> bytes:
        return self._retry(lambda: self.inner.get_suffix(path, length))

    def head(self, path: str) -> ObjectMeta:
        return self._retry(lambda: self.inner.head(path))

    def put(self, path: str, data: bytes, *, mode: PutMode = "overwrite") -> str | None:
        if mode != "overwrite":
            return self.inner.put(path, data, mode=mode)
        return self._retry(lambda: self.inner.put(path, data))

    def delete(self, path: str) -> None:
        self._retry(lambda: self.inner.delete(path))

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        return self._retry(lambda: self.inner.list(prefix, offset=offset))

    def copy(self, source: str, destination: str) -> None:
        self._retry(lambda: self.inner.copy(source, destination))


def with_retries(store: ObjectStore, attempts: int) -> ObjectStore:
    """``store`` with retries, unless some layer of it already retries."""
    layer: ObjectStore | None = store
    while layer is not None:
        if isinstance(layer, RetryingStore):
            return store
        layer = layer.inner if isinstance(layer, WrappingStore) else None
    return RetryingStore(store, attempts) if attempts > 1 else store
