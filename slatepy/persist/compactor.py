"""Executing one merge the spine claimed (RFC 0015 §8.2).

A merge request names contiguous batches of the trace (``MergeReq``). The compactor streams
every run of those batches (parts chained, part windows applied, times forwarded to the
shard's since on the encoded key), merges the runs with the consolidating combine
(``table.merge.merge_sum``: diffs of one ``(k, v, t)`` summed, zeros dropped) and writes one
output run of hollow parts (``part/{writer}/c{uuid}.sst``) cut at ``part_target_bytes``. The
output is applied with the ``apply_merge`` transition; when it is not applied its parts are
deleted.

**Safety** does not rest on the claim: ``apply_merge`` is a compare-and-set on the exact
input batch ids, so an output never replaces batches it was not computed from, and two
compactors of one request (a takeover after a pause) cannot both apply. Forwarding times
to the since loses nothing a reader may ask for: readers read at or after the since, where
``t`` and ``max(t, since)`` compare alike.

**Outputs and GC.** Outputs are unreferenced until the apply lands, so GC would take them
once they are older than ``batch_lease``: the apply is abandoned (outputs deleted) when the
oldest output is ``batch_lease / 2`` old, checked while merging and before every CAS
attempt — the rule shipped batches obey (``check_batch_age``). An apply whose outcome stays
unknown (``Indeterminate``) deletes nothing: its outputs may be referenced, and if they are
not, GC collects them.

**Memory**: ``compaction_memory_bytes`` of read-ahead shared by the runs (at least 64 KiB
each), one pending entry per run, and one output part being streamed (``parts``). More runs
than the budget gives 64 KiB to are merged in rounds: groups of runs into intermediate runs
(deleted afterwards), then those.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from slatepy.errors import StoreUnavailable
from slatepy.format.block import Entry
from slatepy.persist.config import PersistSettings
from slatepy.persist.errors import Indeterminate, StateConflictError, UsageError
from slatepy.persist.machine import ShardMachine, rerun_as_is
from slatepy.persist.parts import MIN_CHUNK_BYTES, PartWriter, inline_part, run_entries
from slatepy.persist.state.append import check_batch_age
from slatepy.persist.state.outcome import MergeReq
from slatepy.persist.state.records import HollowPart, InlinePart, Run, State
from slatepy.persist.state.spine import (
    Applied,
    ApplyMerge,
    RenewMerge,
    apply_merge,
    renew_merge,
)
from slatepy.table.merge import merge_sum
from slatepy.table.reader import TableReader

log = logging.getLogger(__name__)

CHECK_EVERY = 4096
"""Merged entries between checks of the claim's renewal, the output deadline and a stop."""

_TIME = struct.Struct(">Q")

MergeStatus = Literal["applied", "not_applied", "skipped", "abandoned", "unknown"]
"""How a merge ended: ``applied``; ``not_applied`` (inputs merged by someone else, or the
shard finalized: outputs deleted); ``skipped`` (the inputs are gone already: nothing
written); ``abandoned`` (stopped, or the outputs grew too old to apply:
outputs deleted); ``unknown`` (the apply failed indefinitely: outputs left to GC)."""


@dataclass(frozen=True, slots=True)
class MergeResult:
    """What :func:`compact` did.

    Attributes:
        status: See :data:`MergeStatus`.
        batch_id: The output batch's id when applied.
        parts: Output parts (inline ones included; intermediate rounds not counted).
        updates: Updates in the output run.
    """

    status: MergeStatus
    batch_id: int | None = None
    parts: int = 0
    updates: int = 0


class MergeAbandoned(Exception):
    """Raised inside a merge to stop it (a stop was requested, or the outputs grew too old);
    caught by :func:`compact`, which deletes the outputs."""


def compact(
    machine: ShardMachine,
    tables: TableReader,
    claimant: str,
    request: MergeReq,
    *,
    stop: threading.Event | None = None,
) -> MergeResult:
    """Execute ``request`` (claimed by writer ``claimant``) and apply it.

    Args:
        machine: The shard's machine (the client's shared one).
        tables: Reads the input parts (``TableReader.scan_all``: uncached, chunked).
        claimant: The writer whose claim this is; outputs go under its part directory.
        request: The claimed merge.
        stop: Set to abandon the merge at its next check (the client is closing).

    Raises:
        StoreError: reading the inputs or writing the outputs failed (outputs written so
            far are deleted; the claim stays, and expires or is retried).
        CorruptionError: an input part does not decode.
    """
    state = machine.state
    if not request.inputs or not _inputs_present(state, request):
        return MergeResult("skipped")
    since = state.since
    if since is None:
        # Nobody reads the shard any more (its since is closed), but writers may still
        # append: merge physically, forwarding no further than the inputs were (a merge
        # skipped here left the trace to fill until appends stalled; issue 27).
        since = max(batch.desc.since for batch in request.inputs)
    settings = machine.settings
    writer = PartWriter(machine.blob, machine.shard_id, claimant, settings)
    runs = [run for batch in request.inputs for run in batch.runs]
    written_ms = machine.now_ms()
    guard = _Guard(machine, claimant, request.merge_id, written_ms, stop)
    output: list[HollowPart | InlinePart] = []
    try:
        if _fits_inline(state, runs, settings):
            entries = list(guard.watch(_merged(tables, machine, runs, since)))
            output.extend([inline_part(entries)] if entries else [])
        else:
            runs = _rounds(machine, tables, writer, runs, since=since, guard=guard)
            output.extend(
                writer.write_entries(
                    guard.watch(_merged(tables, machine, runs, since)), compaction=True
                )
            )
    except MergeAbandoned as exc:
        log.info("shard %r: merge %d abandoned: %s", machine.shard_id, request.merge_id, exc)
        writer.delete((tuple(output),))
        return MergeResult("abandoned")
    except BaseException:
        writer.delete((tuple(output),))
        raise
    finally:
        writer.delete(tuple(tuple(parts) for parts in guard.intermediate))
    return _apply(
        machine,
        writer,
        request,
        tuple(output),
        claimant=claimant,
        since=since,
        written_ms=written_ms,
    )


def _fits_inline(state: State, runs: Sequence[Run], settings: PersistSettings) -> bool:
    """Whether the output of merging ``runs`` is kept inline in the state: the inputs'
    bytes (an output is at most their updates, and a blob part's size overstates its
    block) fit ``inline_part_max_bytes``, and the state's inline bytes, less the inline
    inputs it replaces, leave room for them. A small merge then costs its apply only: no
    blob written now, read by the next merge, deleted by GC."""
    parts = [part for run in runs for part in run]
    size = sum(len(p.data) if isinstance(p, InlinePart) else p.size for p in parts)
    inline = sum(len(p.data) for p in parts if isinstance(p, InlinePart))
    return (
        size <= settings.inline_part_max_bytes
        and state.inline_bytes() - inline + size <= settings.inline_state_max_bytes
    )


def _inputs_present(state: State, request: MergeReq) -> bool:
    """Whether every input batch of ``request`` is still in the trace, contiguous and in
    order (``apply_merge`` would answer NotApplied otherwise: no need to merge)."""
    index = state.batch_index()
    positions = [index.get(batch.id, -1) for batch in request.inputs]
    return positions[0] >= 0 and positions == list(range(positions[0], positions[-1] + 1))


def _apply(
    machine: ShardMachine,
    writer: PartWriter,
    request: MergeReq,
    output: Run,
    *,
    claimant: str,
    since: int,
    written_ms: int,
) -> MergeResult:
    """Apply ``output`` by compare-and-set on the exact input ids; delete it unless it may
    be referenced."""
    settings = machine.settings
    args = ApplyMerge(
        merge_id=request.merge_id,
        inputs=tuple(batch.id for batch in request.inputs),
        runs=(output,) if output else (),
        since=since,
        claimant=claimant,
    )
    updates = sum(part.updates for part in output)

    def young_enough(now_ms: int) -> None:
        if any(isinstance(part, HollowPart) for part in output):  # GC could take them
            check_batch_age(written_ms, now_ms, settings)

    try:
        # No on_uncertain: after an indefinite attempt that the log can no longer show, a
        # rerun would answer NotApplied (our own apply removed the inputs) and we would
        # delete referenced outputs. The machine then raises Indeterminate instead.
        result = machine.run(apply_merge, args, check=young_enough)
    except (Indeterminate, StoreUnavailable) as exc:
        if isinstance(exc, StoreUnavailable) and exc.definite:
            writer.delete((output,))
            raise
        keys = {part.key for part in output if isinstance(part, HollowPart)}
        if keys and _references(machine.fetch(), keys):
            return MergeResult("applied", None, len(output), updates)
        log.warning(
            "shard %r: applying merge %d failed indefinitely; its outputs are left to GC",
            machine.shard_id,
            request.merge_id,
            exc_info=True,
        )
        return MergeResult("unknown", None, len(output), updates)
    except UsageError:
        # Too old to apply (GC may take unreferenced outputs), or a refusal: nothing landed
        # (after an uncertain attempt the machine raises Indeterminate instead).
        writer.delete((output,))
        return MergeResult("abandoned")
    except StateConflictError:
        writer.delete((output,))  # lost every race: nothing was committed
        raise
    if isinstance(result, Applied):
        return MergeResult("applied", result.batch_id, len(output), updates)
    writer.delete((output,))
    return MergeResult("not_applied", None, len(output), updates)


def _references(state: State, keys: set[str]) -> bool:
    return any(key in keys for batch in state.trace for key in batch.part_keys())


def _forwarded(entries: Iterator[Entry], since: int) -> Iterator[Entry]:
    """``entries`` with times before ``since`` forwarded to it (the key's last 8 bytes and
    the seq). Order is kept: within one ``(k, v)`` times only move up to ``since``, so equal
    keys may repeat, and ``merge_sum`` sums them."""
    time_bytes = _TIME.pack(since)
    for key, seq, value in entries:
        if seq < since:
            yield key[:-8] + time_bytes, since, value
        else:
            yield key, seq, value


def _merged(
    tables: TableReader, machine: ShardMachine, runs: Sequence[Run], since: int
) -> Iterator[Entry]:
    """The runs merged into one consolidated entry stream, times forwarded to ``since``."""
    chunk = max(MIN_CHUNK_BYTES, machine.settings.compaction_memory_bytes // max(len(runs), 1))
    sources = [
        _forwarded(run_entries(tables, machine.shard_id, run, chunk_bytes=chunk), since)
        for run in runs
    ]
    return merge_sum(sources)


def _rounds(
    machine: ShardMachine,
    tables: TableReader,
    writer: PartWriter,
    runs: list[Run],
    *,
    since: int,
    guard: _Guard,
) -> list[Run]:
    """Merge groups of runs into intermediate runs until the budget gives every remaining
    run at least 64 KiB of read-ahead. Intermediate parts are recorded in ``guard`` (the
    caller deletes them after the final merge: nothing ever references them)."""
    fan_in = max(2, machine.settings.compaction_memory_bytes // MIN_CHUNK_BYTES)
    while len(runs) > fan_in:
        merged: list[Run] = []
        for start in range(0, len(runs), fan_in):
            group = runs[start : start + fan_in]
            if len(group) == 1:
                merged.append(group[0])
                continue
            parts: list[HollowPart] = []
            guard.intermediate.append(parts)
            parts.extend(
                writer.write_entries(
                    guard.watch(_merged(tables, machine, group, since)), compaction=True
                )
            )
            if parts:
                merged.append(tuple(parts))
        runs = merged
    return runs


class _Guard:
    """The periodic checks of a long merge (every :data:`CHECK_EVERY` entries): stop
    requested, outputs too old to apply, and the claim's renewal every ``merge_lease / 3``
    (one small CAS; a lost claim only costs duplicate work, so the merge goes on)."""

    def __init__(
        self,
        machine: ShardMachine,
        claimant: str,
        merge_id: int,
        written_ms: int,
        stop: threading.Event | None,
    ) -> None:
        self.machine = machine
        self.claimant = claimant
        self.merge_id = merge_id
        self.written_ms = written_ms
        self.stop = stop
        self.intermediate: list[list[HollowPart]] = []
        self._renewed = time.monotonic()
        self._renewing = True

    def watch(self, entries: Iterator[Entry]) -> Iterator[Entry]:
        for count, entry in enumerate(entries, 1):
            if count % CHECK_EVERY == 0:
                self.check()
            yield entry

    def check(self) -> None:
        """Raises MergeAbandoned when the merge must stop; renews the claim when due."""
        settings = self.machine.settings
        if self.stop is not None and self.stop.is_set():
            raise MergeAbandoned("the client is closing")
        if self.machine.now_ms() - self.written_ms > settings.batch_lease_ms // 2:
            raise MergeAbandoned("its outputs are older than half of batch_lease")
        if self._renewing and time.monotonic() - self._renewed >= settings.merge_lease / 3:
            self._renewed = time.monotonic()
            self._renewing = self.machine.run(
                renew_merge, RenewMerge(self.merge_id, self.claimant), on_uncertain=rerun_as_is
            )
