"""Random command sequences over the pure shard state (RFC 0015 §13.1).

Every committed step must keep ``State.validate()``, follow the step rules, and be exactly
rebuilt by its encoded diff (``apply(old, between(old, new)) == new``); the log of encoded
diffs, replayed from the latest encoded rollup (digest chain checked), must equal the live
state. The shard's data is checked too: the inline parts of the trace, windows applied,
hold exactly what the successful appends added (consolidated at the since).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from slatepy.errors import SlatepyError
from slatepy.persist import frontier
from slatepy.persist.codec import U64_MAX, Update, decode_inline, encode_inline
from slatepy.persist.config import PersistSettings
from slatepy.persist.consolidation import consolidate
from slatepy.persist.ids import rollup_key
from slatepy.persist.state.append import (
    AlreadyAppended,
    CompareAndAppend,
    append_case,
    compare_and_append,
)
from slatepy.persist.state.diff import (
    StateDiff,
    apply,
    check_chain,
    decode_state_diff,
    encode_state_diff,
    entry_digest,
)
from slatepy.persist.state.gc_rules import (
    ClaimGc,
    CompleteGc,
    claim_gc,
    complete_gc,
    seqno_since,
    truncation_seqno,
)
from slatepy.persist.state.outcome import Change, MergeReq, Outcome
from slatepy.persist.state.records import (
    HollowBatch,
    InlinePart,
    RollupRef,
    Runs,
    State,
    decode_rollup,
    encode_rollup,
    narrow_runs,
)
from slatepy.persist.state.spine import ApplyMerge, ClaimMerges, apply_merge, claim_merges
from slatepy.persist.state.transitions import (
    AddRollup,
    CompareAndDowngradeSince,
    DowngradeSince,
    ExpireCriticalReader,
    ExpireLeasedReader,
    ExpireWriter,
    Finalize,
    HeartbeatLeasedReader,
    HeartbeatWriter,
    RegisterCriticalReader,
    RegisterLeasedReader,
    RegisterWriter,
    add_rollup,
    check_step,
    compare_and_downgrade_since,
    downgrade_since,
    expire_critical_reader,
    expire_leased_reader,
    expire_writer,
    finalize,
    heartbeat_leased_reader,
    heartbeat_writer,
    register_critical_reader,
    register_leased_reader,
    register_writer,
    step,
)

A = TypeVar("A")
R = TypeVar("R")
SETTINGS = PersistSettings(
    writer_lease=30.0,
    reader_lease=20.0,
    merge_lease=2.0,
    batch_lease=60.0,
    consensus_min_age=60.0,
    allow_short_leases=True,
    max_trace_batches=8,
)
WRITERS = st.sampled_from(["w1", "w2"])
LEASED = st.sampled_from(["r1", "r2"])
CRITICAL = st.sampled_from(["c1", "c2"])
PAIRS = st.tuples(st.sampled_from([b"a", b"b\0"]), st.sampled_from([b"", b"x"]))


def batch_updates(batch: HollowBatch) -> list[Update]:
    """A batch's updates, windows applied (every part in this machine is inline)."""
    out: list[Update] = []
    for part in batch.parts():
        assert isinstance(part, InlinePart)
        window = part.window
        out.extend(u for u in decode_inline(part.data) if window is None or window.contains(u[1]))
    return out


def inline(updates: list[Update]) -> Runs:
    data = consolidate(updates)
    return ((InlinePart(encode_inline(data), len(data)),),) if data else ()


class ShardMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = State.initial("orders")
        self.history = {0: self.state}
        self.entries: dict[int, bytes] = {}  # seqno -> its encoded diff
        self.rollups: dict[int, bytes] = {}  # seqno -> encoded rollup of that state
        self.now = 0
        self.registered: set[str] = set()
        self.pending: list[MergeReq] = []
        self.model: list[Update] = []  # every update successfully appended
        self.tokens = 0

    # --- the applier -----------------------------------------------------------------

    def run(
        self, transition: Callable[[State, int, PersistSettings, A], Outcome[R]], args: A
    ) -> Outcome[R]:
        old = self.state
        outcome = step(old, self.now, SETTINGS, transition, args)
        if isinstance(outcome, Change):
            new = outcome.state
            new.validate()
            check_step(old, new)
            prev = self.entries.get(old.seqno)
            diff = StateDiff.between(
                old,
                new,
                nonce=f"{new.seqno:032x}",
                prev_digest=0 if prev is None else entry_digest(prev),
            )
            entry = encode_state_diff(diff)
            assert apply(old, decode_state_diff(entry)) == new
            self.entries[new.seqno] = entry
            self.history[new.seqno] = new
            self.state = new
            self.pending.extend(outcome.maintenance.merges)
        return outcome

    # --- rules -------------------------------------------------------------------------

    @rule(ms=st.integers(1, 5000))
    def tick(self, ms: int) -> None:
        self.now += ms

    @rule(writer=WRITERS)
    def register_writer(self, writer: str) -> None:
        if isinstance(self.run(register_writer, RegisterWriter(writer)), Change):
            self.registered.add(writer)

    @rule(reader=LEASED)
    def register_leased(self, reader: str) -> None:
        self.run(register_leased_reader, RegisterLeasedReader(reader))

    @rule(reader=CRITICAL)
    def register_critical(self, reader: str) -> None:
        self.run(register_critical_reader, RegisterCriticalReader(reader))

    @rule(
        writer=WRITERS,
        skew=st.sampled_from([0, 0, 0, -1, 1]),
        width=st.integers(1, 3) | st.none(),
        data=st.lists(st.tuples(PAIRS, st.integers(0, 2), st.integers(-2, 2)), max_size=4),
    )
    def compare_and_append(
        self, writer: str, skew: int, width: int | None, data: list[tuple[Any, int, int]]
    ) -> None:
        upper = self.state.upper
        expected = max(0, (upper if upper is not None else 5) + skew)
        new = None if width is None else expected + width
        updates: list[Update] = [(kv, expected + dt, d) for kv, dt, d in data]
        updates = [u for u in updates if frontier.contains(expected, new, u[1])]
        self.tokens += 1
        args = CompareAndAppend(
            writer_id=writer,
            token=f"t{self.tokens}",
            expected=expected,
            new=new,
            runs=inline(updates),
            registered=writer in self.registered,
        )
        if isinstance(self.run(compare_and_append, args), Change):
            self.registered.add(writer)
            self.model.extend(updates)

    @rule(
        writer=WRITERS,
        back=st.integers(0, 3),
        width=st.integers(1, 4),
        data=st.lists(st.tuples(PAIRS, st.integers(0, 3), st.integers(-2, 2)), max_size=4),
    )
    def append(self, writer: str, back: int, width: int, data: list[tuple[Any, int, int]]) -> None:
        """``append`` of a replica: the updates before the shard's upper are already there
        (a narrowed window drops them)."""
        current = self.state.upper
        lower = max(0, (current or 0) - back)
        upper = lower + width
        updates: list[Update] = [(kv, lower + dt, d) for kv, dt, d in data if lower + dt < upper]
        try:
            case = append_case(current, lower, upper)
        except SlatepyError:
            return
        if isinstance(case, AlreadyAppended):
            return
        runs = inline(updates)
        if case.narrowed:
            runs = narrow_runs(runs, case.expected, upper)
        self.tokens += 1
        args = CompareAndAppend(
            writer, f"t{self.tokens}", case.expected, upper, runs, writer in self.registered
        )
        if isinstance(self.run(compare_and_append, args), Change):
            self.registered.add(writer)
            self.model.extend(u for u in updates if u[1] >= case.expected)

    @rule(handle=WRITERS | LEASED, back=st.integers(0, 3))
    def heartbeat(self, handle: str, back: int) -> None:
        if handle.startswith("w"):
            self.run(heartbeat_writer, HeartbeatWriter(handle))
        else:
            args = HeartbeatLeasedReader(handle, self.state.seqno - back)
            self.run(heartbeat_leased_reader, args)

    @rule(reader=LEASED, since=st.integers(0, 12) | st.none())
    def downgrade(self, reader: str, since: int | None) -> None:
        self.run(downgrade_since, DowngradeSince(reader, since))

    @rule(
        reader=CRITICAL,
        matching=st.sampled_from([True, True, False]),
        opaque=st.sampled_from([b"", b"x", b"y"]),
        since=st.integers(0, 12) | st.none(),
    )
    def compare_and_downgrade(
        self, reader: str, matching: bool, opaque: bytes, since: int | None
    ) -> None:
        current = self.state.critical_readers.get(reader)
        expected = current.opaque if current is not None and matching else b"?"
        self.run(
            compare_and_downgrade_since,
            CompareAndDowngradeSince(reader, expected, opaque, since),
        )

    @rule(handle=WRITERS | LEASED | CRITICAL)
    def expire(self, handle: str) -> None:
        if handle.startswith("w"):
            self.run(expire_writer, ExpireWriter(handle))
        elif handle.startswith("r"):
            self.run(expire_leased_reader, ExpireLeasedReader(handle))
        else:
            self.run(expire_critical_reader, ExpireCriticalReader(handle))

    @rule(writer=WRITERS)
    def claim_merges(self, writer: str) -> None:
        outcome = self.run(claim_merges, ClaimMerges(writer))
        if isinstance(outcome, Change):
            self.pending.extend(outcome.result)

    @precondition(lambda self: self.pending)
    @rule(index=st.integers(0, 10), writer=WRITERS)
    def apply_merge(self, index: int, writer: str) -> None:
        """A compactor merges one claimed (or stale) request: the inputs' updates forwarded
        to the current since, consolidated."""
        request = self.pending.pop(index % len(self.pending))
        since = self.state.since
        if since is None:
            return  # a closed since: no merges (the shard awaits finalization)
        updates = [u for batch in request.inputs for u in batch_updates(batch)]
        args = ApplyMerge(
            request.merge_id,
            tuple(batch.id for batch in request.inputs),
            inline(consolidate(updates, since)),
            since,
            writer,
        )
        self.run(apply_merge, args)

    @rule(back=st.integers(0, 5))
    def add_rollup(self, back: int) -> None:
        seqno = max(1, self.state.seqno - back)
        if seqno not in self.history:
            return
        data = encode_rollup(self.history[seqno])
        if isinstance(
            self.run(add_rollup, AddRollup(seqno, RollupRef(rollup_key(seqno), len(data)))), Change
        ):
            self.rollups[seqno] = data

    @rule(writer=WRITERS)
    def gc(self, writer: str) -> None:
        claimed = self.run(claim_gc, ClaimGc(writer))
        if not isinstance(claimed, Change):
            return
        fenced = self.state
        truncated_to = truncation_seqno(fenced)
        self.run(complete_gc, CompleteGc(writer, seqno_since(fenced), truncated_to))
        if truncated_to is not None:  # consensus truncated: entries below are gone
            self.entries = {s: e for s, e in self.entries.items() if s >= truncated_to}

    @rule()
    def finalize(self) -> None:
        self.run(finalize, Finalize())

    # --- invariants --------------------------------------------------------------------

    @invariant()
    def replay_from_the_latest_rollup_is_the_live_state(self) -> None:
        latest = self.state.latest_rollup()
        if latest is None:
            state, start = State.initial("orders"), 1
        else:
            state, start = decode_rollup(self.rollups[latest[0]]), latest[0] + 1
        for seqno in range(start, self.state.seqno + 1):
            diff = decode_state_diff(self.entries[seqno])
            prev = self.entries.get(seqno - 1)
            if prev is not None or seqno == 1:  # entries below a truncation are gone
                check_chain(prev, diff)
            state = apply(state, diff)
        assert state == self.state

    @invariant()
    def the_trace_holds_what_was_appended(self) -> None:
        if self.state.finalized:
            return
        since = self.state.since
        at = U64_MAX if since is None else since
        stored = [u for batch in self.state.trace for u in batch_updates(batch)]
        assert consolidate(stored, at) == consolidate(self.model, at)


TestShardMachine = ShardMachine.TestCase
TestShardMachine.settings = settings(
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
