"""State diffs: what one consensus entry holds (RFC 0015 §4.2).

A diff carries only what changed between two consecutive states: the scalar fields that
changed (absent fields are unchanged, ``msgspec.UNSET``), batches added to and removed from
the trace (batches are immutable under their id), and ``Put``/``Remove`` operations per map.
So an entry's size is proportional to the change, not to the state — the seed's answer to
the quadratic cost of rewriting a growing state on every change.

Every diff also carries what a loader needs to trust it: the shard id, ``seqno_from`` /
``seqno_to`` and a strictly increasing walltime (checked by :func:`apply`), a random
``nonce`` (so the bytes of every attempt differ and a read-back can tell whose entry
landed), ``prev_digest`` (XXH3-64 of the previous entry's bytes: a resurrected or foreign
entry breaks the chain, :func:`check_chain`) and the latest rollup, where a cold load
starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from slatepy.errors import CorruptionError, InvalidArgument, UnsupportedFormatVersion
from slatepy.format.checksum import checksum
from slatepy.format.envelope import seal, unseal
from slatepy.persist.state.records import (
    STATE_FORMAT_VERSION,
    Applied,
    CriticalReader,
    GcClaim,
    HollowBatch,
    LeasedReader,
    MergeClaim,
    RollupRef,
    State,
    Writer,
)

DIFF_MAGIC = b"SLPD"
K = TypeVar("K", str, int)
V = TypeVar("V")


class Put(msgspec.Struct, Generic[K, V], frozen=True, array_like=True, tag="p"):
    """Set ``key`` to ``value`` in a map of the state."""

    key: K
    value: V


class Remove(msgspec.Struct, Generic[K], frozen=True, array_like=True, tag="r"):
    """Remove ``key`` (which must be present) from a map of the state."""

    key: K


class StateDiff(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The change from the state at ``seqno_from`` to the one at ``seqno_to``."""

    shard_id: str
    seqno_from: int
    seqno_to: int
    walltime_ms: int
    nonce: str
    prev_digest: int
    latest_rollup: tuple[int, RollupRef] | None = None
    upper: int | UnsetType | None = UNSET
    since: int | UnsetType | None = UNSET
    next_batch_id: int | UnsetType = UNSET
    next_merge_id: int | UnsetType = UNSET
    last_gc_seqno: int | UnsetType = UNSET
    active_gc: GcClaim | UnsetType | None = UNSET
    finalized: bool | UnsetType = UNSET
    trace_add: tuple[HollowBatch, ...] = ()
    trace_remove: tuple[int, ...] = ()
    merges: tuple[Put[int, MergeClaim] | Remove[int], ...] = ()
    leased_readers: tuple[Put[str, LeasedReader] | Remove[str], ...] = ()
    critical_readers: tuple[Put[str, CriticalReader] | Remove[str], ...] = ()
    writers: tuple[Put[str, Writer] | Remove[str], ...] = ()
    rollups: tuple[Put[int, RollupRef] | Remove[int], ...] = ()
    idempotency: tuple[Put[str, Applied] | Remove[str], ...] = ()

    @classmethod
    def between(cls, old: State, new: State, *, nonce: str, prev_digest: int) -> StateDiff:
        """The diff that turns ``old`` into ``new`` (``new.seqno == old.seqno + 1``).

        Args:
            nonce: Unique per attempt (``ids.new_nonce()``).
            prev_digest: :func:`entry_digest` of the consensus entry at ``old.seqno`` (0 when
                ``old`` is the initial state).

        Raises:
            InvalidArgument: the states are of different shards, not consecutive, or a
                batch changed under its id (transitions never do that).
        """
        if old.shard_id != new.shard_id or new.seqno != old.seqno + 1:
            raise InvalidArgument(
                f"no diff from {old.shard_id}@{old.seqno} to {new.shard_id}@{new.seqno}"
            )
        scalars = {
            name: getattr(new, name)
            for name in _SCALARS
            if getattr(old, name) != getattr(new, name)
        }
        old_batches = {batch.id: batch for batch in old.trace}
        new_ids = {batch.id for batch in new.trace}
        for batch in new.trace:
            before = old_batches.get(batch.id)
            if before is not None and before is not batch and before != batch:
                raise InvalidArgument(f"batch {batch.id} changed under its id")
        return cls(
            shard_id=new.shard_id,
            seqno_from=old.seqno,
            seqno_to=new.seqno,
            walltime_ms=new.walltime_ms,
            nonce=nonce,
            prev_digest=prev_digest,
            latest_rollup=new.latest_rollup(),
            trace_add=tuple(batch for batch in new.trace if batch.id not in old_batches),
            trace_remove=tuple(batch.id for batch in old.trace if batch.id not in new_ids),
            merges=_map_ops(old.merges, new.merges),
            leased_readers=_map_ops(old.leased_readers, new.leased_readers),
            critical_readers=_map_ops(old.critical_readers, new.critical_readers),
            writers=_map_ops(old.writers, new.writers),
            rollups=_map_ops(old.rollups, new.rollups),
            idempotency=_map_ops(old.idempotency, new.idempotency),
            **scalars,
        )


_SCALARS = (
    "upper",
    "since",
    "next_batch_id",
    "next_merge_id",
    "last_gc_seqno",
    "active_gc",
    "finalized",
)


def _map_ops(old: Mapping[K, V], new: Mapping[K, V]) -> tuple[Put[K, V] | Remove[K], ...]:
    ops: list[Put[K, V] | Remove[K]] = [Remove(key) for key in old if key not in new]
    ops.extend(Put(key, value) for key, value in new.items() if old.get(key) != value)
    return tuple(ops)


def _apply_ops(
    current: Mapping[K, V], ops: tuple[Put[K, V] | Remove[K], ...], what: str
) -> dict[K, V]:
    if not ops:
        return dict(current)
    out = dict(current)
    for op in ops:
        if isinstance(op, Put):
            out[op.key] = op.value
        elif out.pop(op.key, None) is None:
            raise CorruptionError(f"persist diff removes {what} {op.key!r}, which is absent")
    return out


def apply(state: State, diff: StateDiff) -> State:
    """The state after ``diff``: ``apply(old, StateDiff.between(old, new, ...)) == new``.

    Raises:
        CorruptionError: the diff is of another shard, does not start at
            ``state.seqno`` (or skips one), goes back in walltime, removes what is not there,
            adds a batch id twice, or names another latest rollup than the result has.
    """
    if diff.shard_id != state.shard_id:
        raise CorruptionError(f"persist diff of shard {diff.shard_id!r} for {state.shard_id!r}")
    if diff.seqno_from != state.seqno or diff.seqno_to != state.seqno + 1:
        raise CorruptionError(
            f"persist diff {diff.seqno_from}->{diff.seqno_to} does not follow state {state.seqno}"
        )
    if diff.walltime_ms <= state.walltime_ms:
        raise CorruptionError(
            f"persist diff {diff.seqno_to}: walltime {diff.walltime_ms} is not after "
            f"{state.walltime_ms}"
        )
    removed = set(diff.trace_remove)
    trace = [batch for batch in state.trace if batch.id not in removed]
    if len(trace) != len(state.trace) - len(removed):
        raise CorruptionError(f"persist diff {diff.seqno_to} removes batches that are absent")
    kept = {batch.id for batch in trace}
    for batch in diff.trace_add:
        if batch.id in kept:
            raise CorruptionError(f"persist diff {diff.seqno_to} adds batch {batch.id} twice")
        kept.add(batch.id)
    trace.extend(diff.trace_add)
    # Descs are contiguous and disjoint, so their lowers order the trace.
    trace.sort(key=lambda batch: batch.desc.lower)
    changes: dict[str, Any] = {
        name: getattr(diff, name) for name in _SCALARS if getattr(diff, name) is not UNSET
    }
    new = msgspec.structs.replace(
        state,
        seqno=diff.seqno_to,
        walltime_ms=diff.walltime_ms,
        trace=tuple(trace),
        merges=_apply_ops(state.merges, diff.merges, "merge"),
        leased_readers=_apply_ops(state.leased_readers, diff.leased_readers, "leased reader"),
        critical_readers=_apply_ops(
            state.critical_readers, diff.critical_readers, "critical reader"
        ),
        writers=_apply_ops(state.writers, diff.writers, "writer"),
        rollups=_apply_ops(state.rollups, diff.rollups, "rollup"),
        idempotency=_apply_ops(state.idempotency, diff.idempotency, "idempotency key"),
        **changes,
    )
    if new.latest_rollup() != diff.latest_rollup:
        raise CorruptionError(f"persist diff {diff.seqno_to} names another latest rollup")
    return new


_diff_encoder = msgspec.msgpack.Encoder()
_diff_decoder = msgspec.msgpack.Decoder(StateDiff)


def encode_state_diff(diff: StateDiff) -> bytes:
    """The consensus entry of ``diff``: msgpack inside the ``SLPD`` envelope."""
    return seal(DIFF_MAGIC, STATE_FORMAT_VERSION, _diff_encoder.encode(diff))


def decode_state_diff(data: bytes, *, path: str | None = None) -> StateDiff:
    """Decode a consensus entry.

    Raises:
        CorruptionError: bad envelope or undecodable payload (with ``path``).
    """
    try:
        _, payload = unseal(data, DIFF_MAGIC, (STATE_FORMAT_VERSION,), "persist diff")
        return _diff_decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise CorruptionError(f"persist diff: cannot decode: {exc}", path=path) from exc
    except UnsupportedFormatVersion as exc:
        raise (exc if path is None else exc.at(path)) from None
    except CorruptionError as exc:
        raise CorruptionError(str(exc), path=path) from exc


def entry_digest(entry: bytes) -> int:
    """The digest the next diff records as ``prev_digest`` (XXH3-64 of the entry bytes)."""
    return checksum(entry)


def check_chain(prev_entry: bytes | None, diff: StateDiff, *, path: str | None = None) -> None:
    """Check that ``diff`` was computed from the entry ``prev_entry`` (``None``: from the
    initial state, so ``prev_digest`` must be 0).

    Raises:
        CorruptionError: the chain is broken (a resurrected or foreign entry), with ``path``.
    """
    expected = 0 if prev_entry is None else entry_digest(prev_entry)
    if diff.prev_digest != expected:
        raise CorruptionError(
            f"persist diff {diff.seqno_to} was not written after the entry at "
            f"{diff.seqno_from} (digest chain broken: a resurrected or foreign entry)",
            path=path,
        )
