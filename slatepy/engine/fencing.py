"""Writing a WAL SST under the writer-epoch fencing protocol (manifest seed, "Writers").

A WAL slot is taken with create-if-absent. When the slot is already taken, the epoch inside
the existing SST decides what happens next; that decision is the pure function
:func:`resolve_conflict`, and a new writer's progress through its fencing SSTs is the pure
state :class:`Fencing`, both kept apart from the I/O so each of the seed's outcomes and
timelines is tested directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum

import msgspec

from slatepy.errors import CorruptionError, FencedError
from slatepy.format.sst import SstBuilder, decode_sst
from slatepy.manifest.record import Manifest
from slatepy.manifest.store import ManifestStore
from slatepy.store.base import PutData
from slatepy.store.numbered import NumberedObjects


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
    wal: NumberedObjects, wal_id: int, data: PutData, epoch: int, *, attempts: int = 5
) -> int:
    """A running writer's WAL write: ``data`` (an SST of ``epoch``) at exactly ``wal_id``.

    Returns:
        ``wal_id``.

    Raises:
        FencedError: the slot is taken. A newer or same epoch means we are fenced; an older
            one means this writer lost track of the WAL, and it stops all the same.
        StoreUnavailable: the store failed on every attempt.
    """
    existing = wal.create(wal_id, data, attempts=attempts)
    if existing is None:
        return wal_id
    raise fenced(wal_id, epoch, decode_sst(existing)[0].props.writer_epoch)


def empty_sst(epoch: int) -> bytes:
    """The fencing SST: no entries, only the epoch."""
    return bytes(SstBuilder(writer_epoch=epoch).finish().data)


MAX_LEAD = 63
"""The farthest a fencing writer aims past the first free slot (so a width stays <= 64)."""

Verify = Callable[[int], None]
"""Called by :func:`fence_wal` before it writes past slots it has not read: raises
``FencedError`` if a newer writer has bumped the epoch, and makes sure the manifest's
fence width is at least the argument (see :class:`Fencing`)."""


def epoch_verifier(manifests: ManifestStore, epoch: int, who: str) -> Verify:
    """The :data:`Verify` of a writer (or a repair, ``who``) that holds writer ``epoch``."""

    def verify(width: int) -> None:
        def check(manifest: Manifest, _: int) -> Manifest | None:
            if manifest.writer_epoch != epoch:
                raise FencedError(
                    f"writer epoch {manifest.writer_epoch} superseded {who} ({epoch}) while "
                    "it was fencing the WAL"
                )
            if manifest.max_parallel_writes >= width:
                return None
            return msgspec.structs.replace(manifest, max_parallel_writes=width)

        manifests.update(check)

    return verify


@dataclass(frozen=True, slots=True)
class Fencing:
    """A new writer's progress towards ``needed`` consecutive fencing SSTs (a pure state).

    With ``max_parallel_writes = n`` an older writer has at most ``n`` WAL PUTs in flight
    and stops issuing new ones at its first lost slot, so once we hold ``n`` consecutive
    slots it can never write past them (seed, "Parallel Writes").

    Safety against *newer* writers (RFC 0008): we never create a slot above
    one that holds, or may come to hold, a newer epoch. Slots we lost are read (their epoch
    decides); the taken slots we jump over are covered by a manifest check made after the
    listing that found them (a newer writer bumps the epoch before it writes any SST, so if
    the manifest still holds our epoch, no SST in that listing is newer). Free slots we skip
    (``lead``, against an old writer racing ahead) are announced first: the manifest's
    fence width is raised above the skipped run, so a newer writer, which fences at least
    that wide, cannot complete a fence inside it, and every skipped slot is filled (or read)
    before start-up replays.
    """

    epoch: int
    needed: int
    slot: int
    run: int = 0
    conflicts: int = 0
    lead: int = 0
    skipped: tuple[range, ...] = ()

    @property
    def done(self) -> bool:
        return self.run >= self.needed

    @property
    def fence_ids(self) -> range:
        """The consecutive slots holding our fencing SSTs so far."""
        return range(self.slot - self.run, self.slot)

    @property
    def width(self) -> int:
        """The fence width the manifest must announce before we write ``slot``."""
        return max(self.needed, self.lead + 1)

    def created(self) -> Fencing:
        """We took ``slot``."""
        return replace(self, slot=self.slot + 1, run=self.run + 1)

    def taken(self, their_epoch: int, next_open: int) -> Fencing:
        """``slot`` holds ``their_epoch``; ``next_open`` is the first free slot after it.

        The seed says "try the next id"; we go to the first free one (every id in between is
        taken; the caller verifies they are not newer). An older writer that keeps writing
        still fills slots as fast as we probe them, so from the second conflict on we aim as
        far past ``next_open`` as it got past ``slot`` during our last attempt (at most
        ``MAX_LEAD``), recording the skipped free slots for the back-fill.

        Raises:
            FencedError: a newer (or the same) epoch holds the slot.
        """
        if resolve_conflict(self.epoch, their_epoch) is not Conflict.TRY_NEXT:
            raise fenced(self.slot, self.epoch, their_epoch)
        lead = min(next_open - self.slot - 1, MAX_LEAD) if self.conflicts else 0
        skipped = (*self.skipped, range(next_open, next_open + lead)) if lead else self.skipped
        return Fencing(
            self.epoch, self.needed, next_open + lead, 0, self.conflicts + 1, lead, skipped
        )


def fence_wal(
    wal: NumberedObjects,
    start: int,
    epoch: int,
    needed: int,
    *,
    verify: Verify,
    attempts: int = 5,
) -> range:
    """Write ``needed`` consecutive fencing SSTs from ``start`` (the first free WAL slot).

    ``start`` must come from a listing made before this writer's epoch bump landed, so no
    slot below it can hold a newer epoch. Then every free slot skipped on the way gets an
    empty SST too (or, if someone took it meanwhile, its epoch is checked), so the WAL up
    to the fence is contiguous and no older writer can add to it when this returns.

    Raises:
        FencedError: a newer writer took a slot first or bumped the epoch meanwhile.
        StoreUnavailable: the store failed on every attempt of one write.
    """
    state = Fencing(epoch, needed, start)
    data = empty_sst(epoch)
    while not state.done:
        existing = wal.create(state.slot, data, attempts=attempts)
        if existing is None:
            state = state.created()
            continue
        their_epoch = decode_sst(existing)[0].props.writer_epoch
        state = state.taken(their_epoch, first_open_after(wal, state.slot))
        verify(state.width)
    for slot in (slot for skipped in state.skipped for slot in skipped):
        existing = wal.create(slot, data, attempts=attempts)
        if existing is not None:
            their_epoch = decode_sst(existing)[0].props.writer_epoch
            if resolve_conflict(epoch, their_epoch) is not Conflict.TRY_NEXT:
                raise fenced(slot, epoch, their_epoch)
    return state.fence_ids


def wal_gaps(ids: list[int], first: int, width: int) -> list[range]:
    """Runs of at least ``width`` missing ids in ``first ..`` below the highest of ``ids``.

    A live or crashed writer leaves fewer than ``max_parallel_writes`` PUTs unlanded below
    its highest SST, and a fencing writer skips fewer free slots than the fence width it
    announced, so with ``width`` the manifest's fence width a longer run of missing WAL SSTs
    below later ones can only mean they were lost: corruption, never a write in flight.
    """
    gaps: list[range] = []
    expected = first
    for wal_id in ids:
        if wal_id < first:
            continue
        if wal_id - expected >= width:
            gaps.append(range(expected, wal_id))
        expected = wal_id + 1
    return gaps


def describe_gap(wal: NumberedObjects, gap: range) -> str:
    """The missing WAL SSTs of ``gap`` as object paths, for error messages."""
    first = wal.path(gap.start)
    return first if len(gap) == 1 else f"{first} .. {wal.path(gap[-1])}"


def first_open_after(wal: NumberedObjects, slot: int) -> int:
    """The lowest free WAL slot above ``slot``."""
    tail = wal.contiguous_tail(slot)
    return (slot if tail is None else tail) + 1


def fenced(slot: int, ours: int, theirs: int) -> FencedError:
    """The error for losing WAL ``slot`` to epoch ``theirs``."""
    return FencedError(
        f"WAL slot {slot} holds epoch {theirs}, this writer has epoch {ours}: "
        f"{resolve_conflict(ours, theirs).value}"
    )


def check_gap(
    wal: NumberedObjects,
    gap: range,
    view: Manifest,
    manifests: ManifestStore,
    *,
    lasted: float,
    timeout: float,
) -> None:
    """Report a WAL gap nobody can fill (a reader waits for the others).

    A gap narrower than the manifest's fence width may be a write in flight (or one a
    crashed writer never landed, which the next writer fills): the reader waits, as the seed
    says. A wider one cannot come from any writer (see :func:`wal_gaps`); once it has lasted
    ``timeout`` seconds (``lasted`` so far) and the newest manifest agrees on the width, the
    missing SSTs were lost.

    Raises:
        CorruptionError: naming the first missing WAL SST.
    """
    if len(gap) < view.max_parallel_writes:
        return
    if lasted < timeout:
        return
    latest = manifests.load()
    width = view.max_parallel_writes if latest is None else latest.manifest.max_parallel_writes
    if len(gap) >= width:
        raise CorruptionError(
            f"WAL gap: {describe_gap(wal, gap)} missing below "
            f"{wal.path(gap.stop)} for {lasted:.1f} s; wider than "
            f"the {width} writes a writer may have in flight, so they were lost",
            path=wal.path(gap.start),
        )
