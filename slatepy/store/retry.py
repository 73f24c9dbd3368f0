"""Retrying idempotent store requests.

A read, list, head, delete, copy or overwrite that fails with ``StoreUnavailable`` can be
repeated safely: doing it twice has the same effect as once. ``RetryingStore`` repeats them
with jittered exponential backoff. Creates (``put(mode="create")``) and If-Match writes are
*not* retried here: whether a lost reply means "landed" must be decided by reading the
object back, which :func:`slatepy.store.cas.create_if_absent` does.

Each retry is logged at INFO (what failed, where, and why), so a slow or unreachable store
shows up in the log while the caller waits instead of only when it finally gives up. Retrying
stops after ``attempts`` tries, or once ``give_up_after`` seconds have passed since the first
one: a store that accepts connections but never answers costs one request timeout, not one
per attempt (``Settings.store_timeout``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from slatepy.errors import StoreUnavailable
from slatepy.store.base import (
    ObjectMeta,
    ObjectStore,
    ObjectWriter,
    PutData,
    PutMode,
    WrappingStore,
)

if TYPE_CHECKING:
    from slatepy.store.local_read import KeptReads

T = TypeVar("T")
BACKOFF_START = 0.01
BACKOFF_MAX = 0.5

log = logging.getLogger(__name__)


class RetryingStore(WrappingStore):
    """``inner`` with each idempotent request tried up to ``attempts`` times.

    Args:
        inner: The store to retry requests on.
        attempts: Tries per request, the first included.
        give_up_after: Seconds after the first try past which a failure is not retried
            (None: only ``attempts`` bounds it). A request that timed out already took the
            store's request timeout; trying it again against a store that does not answer
            would multiply the wait without changing the outcome.
    """

    def __init__(
        self, inner: ObjectStore, attempts: int, *, give_up_after: float | None = None
    ) -> None:
        super().__init__(inner)
        self.attempts = attempts
        self.give_up_after = give_up_after

    def _retry(
        self,
        fn: Callable[[], T],
        failed: StoreUnavailable,
        started: float,
        what: str,
        *args: object,
    ) -> T:
        """``fn()`` tried again after its first try (at ``started``) failed with ``failed``,
        within the attempt and time budget; ``what % args`` names the request in logs and
        errors (formatted only on a failure).

        Every request's first try is a direct call in the method itself, so a request that
        succeeds (nearly all of them) pays no closure and no loop: on a ``file://`` read
        that is a good part of the request (RFC 0006, issue 33 addendum).

        Raises:
            StoreUnavailable: the last failure; when more than one try was made, its message
                says how many and over how long (same ``path`` and ``definite``).
        """
        attempt = 1
        while True:
            elapsed = time.monotonic() - started
            out_of_time = self.give_up_after is not None and elapsed >= self.give_up_after
            if attempt >= self.attempts or out_of_time:
                failure = self._gave_up(what % args, attempt, elapsed, failed)
                if failure is failed:
                    raise failed
                raise failure from failed
            log.info(
                "retrying %s on %s: attempt %d of %d failed after %.1f s: %s",
                what % args,
                self.url,
                attempt,
                self.attempts,
                elapsed,
                failed,
            )
            delay = min(BACKOFF_MAX, BACKOFF_START * 2 ** (attempt - 1))
            time.sleep(random.uniform(delay / 2, delay))
            attempt += 1
            try:
                return fn()
            except StoreUnavailable as exc:
                failed = exc

    def _gave_up(
        self, what: str, attempts: int, elapsed: float, exc: StoreUnavailable
    ) -> StoreUnavailable:
        if type(exc) is not StoreUnavailable:
            return exc  # a subclass (a test's kill switch) keeps its identity
        if attempts == 1 and (self.give_up_after is None or elapsed < self.give_up_after):
            return exc
        why = (
            f"{attempts} attempts"
            if attempts == self.attempts
            else f"{attempts} attempt{'s' if attempts > 1 else ''} and {elapsed:.1f} s, past "
            f"the {self.give_up_after:g} s retry budget (store_timeout)"
        )
        return StoreUnavailable(
            f"{what} on {self.url} failed after {why}; is the store reachable and "
            f"answering? Last error: {exc}",
            path=exc.path,
            definite=exc.definite,
        )

    # Each request: its first try called directly (see ``_retry``), the tries after it
    # through ``_retry``.

    def get(self, path: str) -> bytes:
        started = time.monotonic()
        try:
            return self.inner.get(path)
        except StoreUnavailable as exc:
            return self._retry(lambda: self.inner.get(path), exc, started, "GET %s", path)

    def get_range(self, path: str, start: int, end: int) -> bytes:
        started = time.monotonic()
        try:
            return self.inner.get_range(path, start, end)
        except StoreUnavailable as exc:
            return self._retry(
                lambda: self.inner.get_range(path, start, end),
                exc,
                started,
                "GET %s [%d, %d)",
                path,
                start,
                end,
            )

    def get_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        started = time.monotonic()
        try:
            return self.inner.get_ranges(path, ranges)
        except StoreUnavailable as exc:
            return self._retry(
                lambda: self.inner.get_ranges(path, ranges),
                exc,
                started,
                "GET %s (%d ranges)",
                path,
                len(ranges),
            )

    def get_suffix(self, path: str, length: int) -> bytes:
        started = time.monotonic()
        try:
            return self.inner.get_suffix(path, length)
        except StoreUnavailable as exc:
            return self._retry(
                lambda: self.inner.get_suffix(path, length),
                exc,
                started,
                "GET %s (last %d bytes)",
                path,
                length,
            )

    def head(self, path: str) -> ObjectMeta:
        started = time.monotonic()
        try:
            return self.inner.head(path)
        except StoreUnavailable as exc:
            return self._retry(lambda: self.inner.head(path), exc, started, "HEAD %s", path)

    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> str | None:
        if mode != "overwrite":
            return self.inner.put(path, data, mode=mode)
        started = time.monotonic()
        try:
            return self.inner.put(path, data)
        except StoreUnavailable as exc:
            return self._retry(lambda: self.inner.put(path, data), exc, started, "PUT %s", path)

    def kept_reads(self, path: str) -> KeptReads | None:
        """The inner store's: a shortcut's reads only ever succeed (anything else is read
        again through this layer, which retries it)."""
        return self.inner.kept_reads(path)

    def open_writer(self, path: str) -> ObjectWriter:
        """Passed through: a stream cannot be sent again from here (the backend client
        retries each part; a failed stream fails its writer, which starts over)."""
        return self.inner.open_writer(path)

    def delete(self, path: str) -> None:
        started = time.monotonic()
        try:
            self.inner.delete(path)
        except StoreUnavailable as exc:
            self._retry(lambda: self.inner.delete(path), exc, started, "DELETE %s", path)

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        started = time.monotonic()
        try:
            return self.inner.list(prefix, offset=offset)
        except StoreUnavailable as exc:
            return self._retry(
                lambda: self.inner.list(prefix, offset=offset),
                exc,
                started,
                "LIST %s",
                prefix or "/",
            )

    def copy(self, source: str, destination: str) -> None:
        started = time.monotonic()
        try:
            self.inner.copy(source, destination)
        except StoreUnavailable as exc:
            self._retry(
                lambda: self.inner.copy(source, destination),
                exc,
                started,
                "COPY %s to %s",
                source,
                destination,
            )


def with_retries(
    store: ObjectStore, attempts: int, *, give_up_after: float | None = None
) -> ObjectStore:
    """``store`` with retries, unless some layer of it already retries.

    Args:
        give_up_after: See :class:`RetryingStore`; callers pass ``Settings.store_timeout``.
    """
    layer: ObjectStore | None = store
    while layer is not None:
        if isinstance(layer, RetryingStore):
            return store
        layer = layer.inner if isinstance(layer, WrappingStore) else None
    if attempts <= 1:
        return store
    return RetryingStore(store, attempts, give_up_after=give_up_after)
