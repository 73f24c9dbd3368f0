"""The compactor lease: pure decisions on who compacts, apart from the I/O that acts on them.

Exactly one compactor holds ``compactor_epoch`` at a time (claims are manifest CASes, and a
publish checks the epoch inside its own CAS), so fencing alone keeps compactions from
overlapping. The lease adds *liveness*: a compactor that lost the epoch (say, the writer's
in-process compactor after ``slatepy compact``) stands by, and takes the epoch back once the
holder has left pending work untouched for its lease (RFC 0013).

How a standby sees the holder: nothing about the holder is trusted but what the manifest
shows. Its :func:`activity` (epoch, lease renewals, ``wal_id_last_compacted``, L0 and sorted
run ids) changes whenever the holder publishes or renews. The standby watches that value on
its own monotonic clock while work is pending; unchanged for ``duration_s`` means the holder
is gone (or stuck, which fencing makes equally safe). Clocks of different machines are never
compared for the hand-over.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Literal

import msgspec

from slatepy.errors import FencedError, SlatepyError
from slatepy.manifest.record import CompactorLease, Manifest

Takeover = Literal["always", "unless-live"]
"""How a new compactor claims the epoch: ``"always"`` (the writer's compactor, ``--force``),
or ``"unless-live"`` (``slatepy compact``): refuse while the holder's lease is live."""

Activity = tuple[int, int, int, tuple[str, ...], tuple[int, ...]]
"""What changes in the manifest whenever the holder of the compactor epoch does anything."""


class CompactorBusy(SlatepyError):
    """Another compactor holds the epoch and acted within its lease; nothing was written.

    Raised by ``Compactor(..., takeover="unless-live")``. Pass ``takeover="always"``
    (``slatepy compact --force``) to take over anyway: the superseded compactor stands by
    and takes compaction back once this one has left work pending for its lease.
    """


def default_holder(role: str) -> str:
    """A human-readable name of this process for the lease (shown in logs and errors)."""
    return f"{role}, pid {os.getpid()} on {socket.gethostname()}"


def current_lease(manifest: Manifest) -> CompactorLease | None:
    """The lease of the current compactor epoch, or None (none recorded, or a stale one)."""
    lease = manifest.compactor_lease
    return lease if lease is not None and lease.epoch == manifest.compactor_epoch else None


def describe_holder(manifest: Manifest) -> str:
    lease = current_lease(manifest)
    holder = f" ({lease.holder})" if lease is not None else ""
    return f"compactor epoch {manifest.compactor_epoch}{holder}"


def activity(manifest: Manifest) -> Activity:
    """Everything the holder of the compactor epoch changes when it publishes or renews.

    The renewal count covers a long compaction that publishes nothing yet; the levels cover a
    holder that records no lease (an older slatepy), which still shows progress.
    """
    lease = current_lease(manifest)
    return (
        manifest.compactor_epoch,
        -1 if lease is None else lease.renewals,
        manifest.wal_id_last_compacted,
        tuple(h.id for h in manifest.l0),
        tuple(r.id for r in manifest.sorted_runs),
    )


def live_lease(manifest: Manifest, now_s: float) -> CompactorLease | None:
    """The current lease if its holder renewed it less than ``duration_s`` ago by ``now_s``.

    Compares this machine's clock with the holder's, so it is advisory only: it decides
    whether ``slatepy compact`` asks for ``--force``, never whether two compactors overlap.
    """
    lease = current_lease(manifest)
    if lease is not None and now_s < lease.renewed_s + lease.duration_s:
        return lease
    return None


def claim(
    manifest: Manifest,
    *,
    holder: str,
    now_s: float,
    duration_s: float,
    takeover: Takeover = "always",
    expect: Activity | None = None,
) -> Manifest | None:
    """The manifest with the next compactor epoch claimed by ``holder`` (a pure transition).

    Runs inside the manifest update, so every condition is checked against the manifest the
    claim replaces, again after every lost compare-and-swap.

    Args:
        takeover: ``"unless-live"`` refuses while the holder's lease is live.
        expect: A standby's take-over: claim only if the holder's :func:`activity` is still
            the one watched; None (leave the manifest unchanged) if the holder acted since.

    Raises:
        CompactorBusy: ``takeover="unless-live"`` and the current lease is live.
    """
    if expect is not None and activity(manifest) != expect:
        return None
    if takeover == "unless-live":
        lease = live_lease(manifest, now_s)
        if lease is not None:
            raise CompactorBusy(
                f"compactor epoch {lease.epoch} ({lease.holder}) compacts this database and "
                f"acted {max(0.0, now_s - lease.renewed_s):.1f} s ago (lease "
                f"{lease.duration_s:g} s); a writer's in-process compactor needs no help. Use "
                "--force to take over anyway: the superseded compactor then stands by and "
                "takes compaction back once this one has left work pending for its lease"
            )
    epoch = manifest.compactor_epoch + 1
    return msgspec.structs.replace(
        manifest,
        compactor_epoch=epoch,
        compactor_lease=CompactorLease(epoch, holder, 0, now_s, duration_s),
    )


def renew(
    manifest: Manifest, epoch: int, *, holder: str, now_s: float, duration_s: float
) -> Manifest:
    """The manifest with ``epoch``'s lease renewed (a pure transition, run inside an update).

    Raises:
        FencedError: ``epoch`` is no longer the manifest's compactor epoch.
    """
    if manifest.compactor_epoch != epoch:
        raise FencedError(f"compactor epoch {epoch} was superseded by {describe_holder(manifest)}")
    lease = current_lease(manifest)
    renewals = 0 if lease is None else lease.renewals + 1
    return msgspec.structs.replace(
        manifest, compactor_lease=CompactorLease(epoch, holder, renewals, now_s, duration_s)
    )


@dataclass(frozen=True, slots=True)
class Watch:
    """A standby's observation: the holder's activity and when (monotonic) it was first seen
    with work pending."""

    activity: Activity
    since: float


def watch(
    previous: Watch | None,
    manifest: Manifest,
    *,
    pending: bool,
    now: float,
    default_duration: float,
) -> tuple[Watch | None, bool]:
    """One standby check: the new observation and whether the holder's lease ran out.

    The lease runs out when work stayed pending and the holder's activity stayed the same
    for the lease's ``duration_s`` (``default_duration`` when the manifest records no lease)
    of the standby's own clock ``now``. No pending work resets the watch: a holder with
    nothing to do owes no sign of life, so an idle holder costs no manifest writes.
    """
    if not pending:
        return None, False
    seen = activity(manifest)
    if previous is None or previous.activity != seen:
        return Watch(seen, now), False
    lease = current_lease(manifest)
    duration = default_duration if lease is None else lease.duration_s
    return previous, now - previous.since >= duration
