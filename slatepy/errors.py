"""The slatepy error hierarchy.

Every error raised on purpose by slatepy derives from :class:`SlatepyError`. Store
failures carry ``definite``: ``True`` when the operation certainly had no effect (safe to
retry blindly), ``False`` when it may have taken effect (the caller must re-check state
before retrying a non-idempotent write).
"""

from __future__ import annotations


class SlatepyError(Exception):
    """Root of every error slatepy raises on purpose."""


class InvalidArgument(SlatepyError, ValueError):
    """The caller passed something slatepy cannot accept; nothing was written."""


class InvalidType(InvalidArgument, TypeError):
    """A key, value, bound or setting of the wrong Python type (a ``str`` key where bytes
    are needed, an unknown keyword): a ``TypeError`` as plyvel, lmdb and the builtins raise
    it, and still an :class:`InvalidArgument` for code that catches the family."""


class ClosedError(SlatepyError):
    """The database (or reader) was closed; open it again to continue."""


class CorruptionError(SlatepyError):
    """Bytes read from the store failed a checksum, magic or version check, or an object
    the database needs is missing.

    ``slatepy doctor URL`` explains the damage and what ``--repair`` would give up.

    Attributes:
        path: The object involved, when known.
        offset: The byte offset in that object of the damaged part (a block), when known.
    """

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset


class NotASlatepyDatabase(SlatepyError):
    """The location holds objects where a slatepy database keeps its manifests, but none of
    them is a slatepy manifest (e.g. a SlateDB database, or unrelated files).

    Deliberately not a :class:`CorruptionError`: nothing is damaged, the URL points at
    something else, and a caller that answers corruption with ``slatepy doctor --repair``
    must not write a slatepy manifest into another program's data. Nothing was written.

    Attributes:
        path: The object that gave it away (the newest manifest-named object).
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class UpgradeRequired(SlatepyError):
    """What was read was written by a newer slatepy than this one: nothing is damaged, and
    the answer is to upgrade slatepy, never a repair.

    Deliberately not a :class:`CorruptionError`: a caller that answers corruption by falling
    back to older state (``slatepy doctor --repair``) would give up everything the newer
    slatepy wrote. Nothing was written.
    """


class UnsupportedFormatVersion(UpgradeRequired):
    """A record (manifest, persist state, batch) carries a format version newer than the
    newest this slatepy reads.

    Attributes:
        what: The kind of record ("manifest", "persist rollup", ...).
        found: The format version it carries.
        newest: The newest format version this slatepy reads.
        path: The object, when known.
    """

    def __init__(self, what: str, *, found: int, newest: int, path: str | None = None) -> None:
        where = path or what
        super().__init__(
            f"{where}: format version {found}, this slatepy reads up to {newest}: written by "
            "a newer slatepy; upgrade slatepy (nothing is damaged; do not repair)"
        )
        self.what = what
        self.found = found
        self.newest = newest
        self.path = path

    def at(self, path: str) -> UnsupportedFormatVersion:
        """The same error naming the object ``path``."""
        return UnsupportedFormatVersion(self.what, found=self.found, newest=self.newest, path=path)


class FencedError(SlatepyError):
    """A newer writer (or compactor) took over; this instance must stop.

    Writes after this error are refused; open the database again to become the writer.
    """


class CompactionAbandoned(SlatepyError):
    """A compaction ran too long to publish safely; its outputs are left to GC."""


class WriteStalled(SlatepyError):
    """Uncompacted data reached ``max_unflushed_bytes`` and compaction did not catch up in
    ``write_stall_timeout``; the write was not applied."""


class WritesLost(SlatepyError):
    """Writes made without awaiting durability could not be made durable and are gone.

    Raised by ``close()`` when nobody else was told: the writer had failed (its error is
    the ``__cause__``) while ``count`` such writes were still buffered or in a failed WAL
    SST. Awaited writes are never counted here; their callers got the error themselves.
    """

    def __init__(self, message: str, *, count: int) -> None:
        super().__init__(message)
        self.count = count


class TransactionConflict(SlatepyError):
    """An optimistic transaction lost a race: a key it wrote (or, serializable, read or
    scanned) was changed by another commit after its snapshot. Nothing it wrote was
    applied; run the transaction again from ``begin()``."""


class ManifestConflictError(SlatepyError):
    """A manifest update kept losing the compare-and-swap race and gave up."""


class StoreError(SlatepyError):
    """An object-store operation failed.

    Attributes:
        definite: True when the operation certainly had no effect.
        path: The object path involved, when there is one.
    """

    def __init__(self, message: str, *, path: str | None = None, definite: bool = True) -> None:
        super().__init__(message)
        self.path = path
        self.definite = definite


class NotFound(StoreError):
    """The object (or the bucket/container) does not exist."""


class AlreadyExists(StoreError):
    """A create-if-absent write found an object already at the path."""


class PreconditionFailed(StoreError):
    """An if-match write found a different version at the path."""


class NotDurable(StoreError):
    """The store took a write but could not make it durable (an fsync failed).

    The write counts as lost and its writer stops: the bytes are visible, so retrying the
    create and reading them back would "prove" a write that may never reach the disk.
    Never retried; ``definite`` is False.
    """


class StoreUnavailable(StoreError):
    """The store could not be reached or refused the request (network, auth, 5xx)."""


class UnsupportedStore(InvalidArgument):
    """The URL names no store slatepy supports, or the store lacks a needed feature."""
