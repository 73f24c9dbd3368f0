"""Writing a WAL SST under the writer-epoch fencing protocol (manifest seed, "Writers").

A WAL slot is taken with create-if-absent. When the slot is already taken, the epoch inside
the existing SST decides what happens next; that decision is the pure function
:func:`resolve_conflict`, kept apart from the I/O so each of the seed's four outcomes is
tested directly.
"""

from __future__ import annotations

from enum import Enum

from slatepy.errors import FencedError
from slatepy.format.sst import decode_sst
from slatepy.store.numbered import NumberedObjects

WAL_DIR = "wal"
WAL_SUFFIX = ".sst"


class Conflict(Enum):
    """What a writer must do after losing a WAL slot."""

    TRY_NEXT = "an older writer took the slot; try the next id"
    ILLEGAL = "another writer holds the same epoch; this must never happen"
    FENCED = "a newer writer took the slot; this writer is fenced"


def resolve_conflict(our_epoch: int, their_epoch: int) -> Conflict:
    """The seed's outcomes 2-4 for a lost slot."""
    if their_epoch < our_epoch:
        return Conflict.TRY_NEXT
    if their_epoch == our_epoch:
        return Conflict.ILLEGAL
    return Conflict.FENCED


def write_wal_sst(
    wal: NumberedObjects,
    wal_id: int,
    data: bytes,
    epoch: int,
    *,
    attempts: int = 5,
    skip_older: bool = False,
) -> int:
    """Write ``data`` (an SST of ``epoch``) at ``wal_id`` or the first free slot after it.

    Args:
        skip_older: On a slot taken by an older epoch, move on to the next id (only a
            fencing writer does this; a running writer that finds an older epoch in its
            next slot has lost track of the WAL and stops).

    Returns:
        The id the SST was written at.

    Raises:
        FencedError: a newer (or same-epoch) writer holds the slot.
        StoreUnavailable: the store failed on every attempt.
    """
    while True:
        existing = wal.create(wal_id, data, attempts=attempts)
        if existing is None:
            return wal_id
        meta, _ = decode_sst(existing)
        outcome = resolve_conflict(epoch, meta.props.writer_epoch)
        if outcome is Conflict.TRY_NEXT and skip_older:
            # The seed says "try the next id". An older writer that is still writing fills
            # the next ids as fast as we probe them one by one, so jump to the current tail:
            # every id in between is already taken by older epochs, so none is skipped.
            tail = wal.latest(after=wal_id)
            wal_id = (tail if tail is not None else wal_id) + 1
            continue
        raise FencedError(
            f"WAL slot {wal.path(wal_id)} holds epoch {meta.props.writer_epoch}, "
            f"this writer has epoch {epoch}: {outcome.value}"
        )
