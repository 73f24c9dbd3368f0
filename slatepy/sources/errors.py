"""Errors of the sources (RFC 0027): each names the object and says whether retrying helps.

A *definite* error (``definite = True``) will not go away by itself: the ingest stops and the
command exits non-zero with the one-line message. A transient one (``SourceUnavailable``) makes
the ingest resume from the shards, as after a crash, a bounded number of times.
"""

from __future__ import annotations

from slatepy.errors import InvalidArgument, SlatepyError


class SourceError(SlatepyError):
    """An upstream source failed; ``definite`` says whether retrying cannot help."""

    definite = True


class SourceUnavailable(SourceError):
    """The upstream could not be reached or the connection broke; retrying may help."""

    definite = False


class SourceConfigError(SourceError, InvalidArgument):
    """The upstream is not set up as the source needs (a missing publication, a table
    without a full replica identity, wrong credentials); nothing was written or committed."""


class OffsetOutOfRange(SourceError):
    """A read asked for offsets the upstream has discarded (below its committed or retained
    offset): the shards need data that is gone. Never answered by re-reading from scratch."""


class SlotLost(SourceError):
    """The replication slot was dropped or invalidated (``max_slot_wal_keep_size``): the WAL
    the shards still need is gone. Never answered by a silent re-snapshot."""


class SchemaChanged(SourceError):
    """A published table changed shape (``ALTER TABLE``) or was truncated while ingested."""


class IngestConflict(SourceError):
    """Another ingest moved one of this ingest's shards: only one may run per source."""
