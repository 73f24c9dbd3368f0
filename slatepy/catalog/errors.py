"""The errors of the durable catalog (RFC 0028).

A lost leadership is ``slatepy.errors.FencedError`` (the house's one fencing error); the rest
are :class:`CatalogError` subclasses. Every one is raised before anything is written, except
where its docstring says otherwise.
"""

from __future__ import annotations

from slatepy.errors import InvalidArgument, SlatepyError


class CatalogError(SlatepyError):
    """Something about the durable catalog is wrong (the root of this module's errors)."""


class UninitializedCatalog(CatalogError):
    """The catalog has never been opened for writing (``open()`` initializes it)."""


class IncompatibleCatalogVersion(CatalogError):
    """The catalog's schema version is outside what this code can open.

    Attributes:
        found: The version recorded in the catalog (config ``catalog_version``).
        code: The newest version this code knows.
    """

    def __init__(self, message: str, *, found: int, code: int) -> None:
        super().__init__(message)
        self.found = found
        self.code = code


class MigrationNeeded(CatalogError):
    """The catalog is at an older version: ``open()`` would migrate it, a read-only open
    may not."""


class ReadOnlyCatalog(CatalogError):
    """A mutation on a catalog opened read-only (or not opened for writing at all)."""


class InvalidCatalogObject(CatalogError, InvalidArgument):
    """A key or value that does not fit its collection's schema, an unknown collection, a
    change to an append-only collection, or a uniqueness rule broken (nothing written)."""


class CatalogContention(CatalogError):
    """The SQL stash refused a write as a serialization failure on every retry: other
    writers kept winning. Nothing was written; an open and a debug edit try again, as they
    do when another writer took the upper."""
