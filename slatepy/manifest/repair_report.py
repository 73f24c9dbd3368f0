"""What a planned repair gives up, in words: the lines ``slatepy doctor`` prints for a
:class:`~slatepy.manifest.repair.RepairPlan` (kept apart from the planning, which decides;
this only describes)."""

from __future__ import annotations

from slatepy.manifest.repair import RepairPlan, Survey, WalSst


def keys(first: bytes | None, last: bytes | None) -> str:
    """A key range for humans."""
    if first is None:
        return "keys unknown"
    return f"keys {first!r}" if first == last else f"keys {first!r}..{last!r}"


def plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def describe_wal(w: WalSst) -> str:
    """One WAL SST as the doctor lists it."""
    if w.entries is None:
        return f"{w.path}: {w.state}; contents unknown"
    if w.entries == 0:
        return f"{w.path}: empty (a fencing SST of writer epoch {w.epoch})"
    return (
        f"{w.path}: {plural(w.entries, 'entry', 'entries')}, seq {w.min_seq}..{w.max_seq}, "
        f"{keys(w.first_key, w.last_key)} (epoch {w.epoch})"
    )


def losses(plan: RepairPlan, survey: Survey) -> list[str]:
    """What ``plan`` gives up, one line per object, as exact as the survey allows."""
    lines: list[str] = []
    damaged = {d.object_id: d for d in survey.damage if d.kind == "manifest"}
    for manifest_id in plan.lost_manifests:
        d = damaged[manifest_id]
        lines.append(
            f"{d.path} [{d.reason}]: whatever it recorded (epoch bumps, published compactions, "
            f"snapshots) is unknown and given up; the repair continues from manifest "
            f"{plan.base_id}"
        )
    reasons = {d.object_id: d.reason for d in survey.damage if d.kind == "wal"}
    for w in plan.wal_lost:
        why = reasons.get(w.id, w.state) if w.state != "ok" else "intact, but after the cut"
        lines.append(f"WAL {describe_wal(w)} [{why}]")
    if plan.wal_lost:
        seqs = [s for w in plan.wal_lost for s in (w.min_seq, w.max_seq) if s is not None]
        span = f"seq {min(seqs)}..{max(seqs)}" if seqs else "seqs unknown"
        count = sum(w.entries or 0 for w in plan.wal_lost)
        unknown = sum(1 for w in plan.wal_lost if w.entries is None)
        more = f" and {plural(unknown, 'SST', 'SSTs')} of unknown contents" if unknown else ""
        lines.append(
            f"in all: the WAL from id {plan.wal_cut} on, {plural(count, 'entry', 'entries')} "
            f"({span}){more}: every write acknowledged from there on is lost"
        )
    for handle, damage in plan.dropped:
        lines.append(
            f"compacted/{handle.id}.sst [{damage.reason}]: "
            f"{plural(handle.entry_count, 'entry', 'entries')}, "
            f"{keys(handle.first_key, handle.last_key)}, seq up to {handle.max_seq}; "
            "keys in that range held in older SSTs revert to their older values"
        )
    if survey.unreferenced and plan.lost_manifests:
        lines.append(
            f"{plural(len(survey.unreferenced), 'compacted SST', 'compacted SSTs')} no intact "
            "manifest references (may hold what the lost manifests published; left in the "
            f"store until GC collects them): {', '.join(survey.unreferenced)}"
        )
    return lines
