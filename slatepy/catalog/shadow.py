"""The shadow catalog: every call on two catalogs, any difference an error (RFC 0028 §3.3).

Used by the tests to hold the implementations to one behaviour: each call runs on the
primary, then on the secondary; the results (or the error types) must be equal, and the
primary's is returned. A transaction is made from the primary's cache after checking that
the two caches are equal, and committed to both as the same batch of rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from slatepy.catalog.errors import CatalogError
from slatepy.catalog.reads import TypedReads
from slatepy.catalog.state import CatalogState
from slatepy.catalog.transaction import Transaction


class ShadowMismatch(CatalogError):
    """The primary and the secondary answered a call differently."""


class ShadowCatalog(TypedReads):
    """See the module docstring; the interface of :class:`CatalogState` (its typed reads
    go through the shadowed :meth:`entries`)."""

    def __init__(self, primary: CatalogState, secondary: CatalogState) -> None:
        self.primary = primary
        self.secondary = secondary

    def _both(self, what: str, call: Callable[[CatalogState], Any]) -> Any:
        outcomes: list[tuple[Any, BaseException | None]] = []
        for state in (self.primary, self.secondary):
            try:
                outcomes.append((call(state), None))
            except Exception as exc:  # every failure is compared, then re-raised
                outcomes.append((None, exc))
        (first, error1), (second, error2) = outcomes
        if type(error1) is not type(error2):
            raise ShadowMismatch(
                f"{what}: the primary {_say(first, error1)}, the secondary {_say(second, error2)}"
            ) from (error1 or error2)
        if error1 is not None:
            raise error1
        if first != second:
            raise ShadowMismatch(f"{what}: the primary gave {first!r}, the secondary {second!r}")
        return first

    @property
    def description(self) -> str:
        return f"shadow({self.primary.description}, {self.secondary.description})"

    @property
    def epoch(self) -> int | None:
        return self._both("epoch", lambda s: s.epoch)  # type: ignore[no-any-return]

    @property
    def is_read_only(self) -> bool:
        return self._both("is_read_only", lambda s: s.is_read_only)  # type: ignore[no-any-return]

    def is_initialized(self) -> bool:
        return self._both("is_initialized", lambda s: s.is_initialized())  # type: ignore[no-any-return]

    def open(self) -> None:
        # The open's audit event carries a time: both get the same one.
        now = self.primary._clock()
        clocks = self.primary._clock, self.secondary._clock
        self.primary._clock = self.secondary._clock = lambda: now
        try:
            self._both("open", lambda s: s.open())
        finally:
            self.primary._clock, self.secondary._clock = clocks

    def open_read_only(self) -> None:
        self._both("open_read_only", lambda s: s.open_read_only())

    def check_open(self) -> tuple[int, int]:
        return self._both("check_open", lambda s: s.check_open())  # type: ignore[no-any-return]

    def transaction(self, *, user: str | None = None) -> Transaction:
        self._both("the cache", lambda s: (s.upper, s._cache.rows))
        return self.primary.transaction(user=user)

    def commit_transaction(self, tx: Transaction) -> None:
        self._both("commit_transaction", lambda s: s.commit_transaction(tx))
        self._both("the cache after a commit", lambda s: (s.upper, s._cache.rows))

    def confirm_leadership(self) -> None:
        self._both("confirm_leadership", lambda s: s.confirm_leadership())

    def entries(self, name: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        return self._both(f"entries({name!r})", lambda s: s.entries(name))  # type: ignore[no-any-return]

    def dump(self, *, ignore_large_collections: bool = False) -> str:
        return self._both(  # type: ignore[no-any-return]
            "dump", lambda s: s.dump(ignore_large_collections=ignore_large_collections)
        )

    def close(self) -> None:
        try:
            self.primary.close()
        finally:
            self.secondary.close()

    def __enter__(self) -> ShadowCatalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _say(result: Any, error: BaseException | None) -> str:
    return f"gave {result!r}" if error is None else f"raised {type(error).__name__}: {error}"


def open_shadow(primary: CatalogState, secondary: CatalogState) -> ShadowCatalog:
    """A catalog that runs every call on ``primary`` and ``secondary`` (both unopened)."""
    return ShadowCatalog(primary, secondary)
