"""What a catalog implementation stores: a small time-varying collection of rows (RFC 0028 §3).

A row is ``(collection, key JSON, value JSON)`` with a diff: the catalog's content at a time
is the multiset of rows whose diffs sum to one. Every write is one tick: its rows get time
``upper`` and the upper moves to ``upper + 1``, if and only if the upper was the one the
writer expected and (for a leader's write) its epoch is still the newest. Everything else —
the cache, transactions, migrations, the audit log — lives above, in
:class:`slatepy.catalog.state.CatalogState`, shared by every implementation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

Row = tuple[str, bytes, bytes, int]
"""``(collection, key JSON, value JSON, diff)``."""


@dataclass(frozen=True, slots=True)
class Contents:
    """A consolidated read: every live ``(collection, key, value)`` at ``upper - 1``.

    Attributes:
        upper: The catalog's upper (0: nothing was ever written: uninitialized).
        epoch: The newest opener's epoch (0: never opened).
        entries: The live rows (each with diff one).
        holder: Who opened at ``epoch`` (``host:pid``), for the debug tool's warning.
    """

    upper: int
    epoch: int
    entries: list[tuple[str, bytes, bytes]]
    holder: str = ""


class Storage(ABC):
    """The durable half of a catalog implementation: persist, or the SQL stash.

    Attributes:
        description: Where the catalog lives, for messages (no password).
    """

    description: str

    @abstractmethod
    def upper(self) -> int:
        """The catalog's upper now (linearized; 0: uninitialized). Writes nothing."""

    @abstractmethod
    def read(self) -> Contents:
        """The consolidated contents now (a linearized read). Writes nothing."""

    def read_collection(self, name: str) -> list[tuple[bytes, bytes]]:
        """The live ``(key, value)`` rows of one collection now (uncached collections)."""
        return [(k, v) for coll, k, v in self.read().entries if coll == name]

    @abstractmethod
    def write(
        self,
        rows: list[Row],
        *,
        expected_upper: int,
        epoch: int | None,
        new_epoch: int | None = None,
        holder: str = "",
    ) -> int:
        """Append ``rows`` at time ``expected_upper``; returns the new upper.

        Args:
            rows: The changes (diff +1 or -1).
            expected_upper: The upper the writer's cache is at.
            epoch: The writer's epoch, checked first (the fence); ``None`` for the debug
                tool, which writes at the current upper without checking the epoch.
            new_epoch: Set the epoch to this (an open), with ``holder``.

        Raises:
            FencedError: the upper or the epoch moved on (nothing written).
        """

    @abstractmethod
    def confirm(self, upper: int, epoch: int) -> None:
        """A linearized check that nothing was written since ``upper`` at ``epoch``.

        Raises:
            FencedError: something was.
        """

    @abstractmethod
    def close(self) -> None:
        """Release connections and handles. Idempotent."""


def fenced_message(my_epoch: int | None, epoch: int, my_upper: int, upper: int) -> str:
    """The message of a fence, as Materialize words it (the epoch if it moved, else the
    upper)."""
    if my_epoch is not None and epoch != my_epoch:
        return f"current catalog epoch {my_epoch} fenced by new catalog epoch {epoch}"
    return f"current catalog upper {my_upper} fenced by new catalog upper {upper}"
