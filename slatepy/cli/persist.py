"""``slatepy persist``: look at persist shards and administer them.

``inspect`` prints JSON a person or a script can read: without a shard, one summary per shard
with a consensus log; with one, its whole state (frontiers, batches with their parts and
bytes, readers, writers, merges, rollups) and the parts under the shard's prefix that the
current state does not reference. Reading never writes: the state comes from consensus and
rollups (a cold load writes no rollup here), the listing from one LIST.

``admin finalize``, ``admin force-compaction`` and ``admin force-gc`` are dry runs unless
``--commit``. The latter two (``cli/persist_admin.py``) run a shard's maintenance now: the
spine's merges until it can merge nothing more, or one GC pass, each printing a JSON report
with a ``message``; they exit 1 on a missing shard, and ``force-gc`` while another pass holds
the GC claim.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from slatepy.cli.persist_admin import open_client
from slatepy.config import Settings
from slatepy.errors import InvalidArgument
from slatepy.persist.client import PersistClient
from slatepy.persist.state.records import HollowBatch, HollowPart, InlinePart, State, Window
from slatepy.persist.versions import shard_path


def inspect_persist(
    url: str, shard: str | None, *, consensus: str | None, settings: Settings
) -> str:
    """The JSON report of ``inspect`` (see the module docstring)."""
    with open_client(url, consensus, settings, None, time.time, commit=False) as client:
        if shard is None:
            summaries = [_summary(client.machine(s).fetch()) for s in client.list_shards()]
            return json.dumps(summaries, indent=2)
        if shard not in client.list_shards():
            raise InvalidArgument(f"no shard {shard!r} at {url} (`slatepy persist inspect URL`)")
        state = client.machine(shard).fetch()
        now = datetime.now(UTC)
        report = _summary(state) | {
            "walltime": _time(state.walltime_ms),
            "trace": [_batch(b) for b in state.trace],
            "leased_readers": {
                rid: {
                    "seqno": r.seqno,
                    "since": r.since,
                    "heartbeat_age_s": _age(now, r.last_heartbeat_ms),
                    "lease_s": r.lease_ms / 1000,
                    "debug": r.debug,
                }
                for rid, r in state.leased_readers.items()
            },
            "critical_readers": {
                rid: {"since": r.since, "opaque": r.opaque.hex(), "debug": r.debug}
                for rid, r in state.critical_readers.items()
            },
            "writers": {
                wid: {
                    "upper": w.most_recent_upper,
                    "heartbeat_age_s": _age(now, w.last_heartbeat_ms),
                    "lease_s": w.lease_ms / 1000,
                    "debug": w.debug,
                }
                for wid, w in state.writers.items()
            },
            "merges": {
                str(mid): {"inputs": list(m.inputs), "claimant": m.claimant}
                for mid, m in state.merges.items()
            },
            "rollups": {
                str(seq): {"key": r.key, "bytes": r.size} for seq, r in state.rollups.items()
            },
            "gc": {
                "last_gc_seqno": state.last_gc_seqno,
                "active": None if state.active_gc is None else state.active_gc.seqno,
            },
            "unreferenced_parts": _unreferenced(client, state, now),
        }
        return json.dumps(report, indent=2)


def finalize_shard(
    url: str, shard: str, *, consensus: str | None, settings: Settings, commit: bool
) -> tuple[str, int]:
    """``admin finalize``: say whether the shard can be finalized, and with ``commit`` do it.
    Returns the message and the exit status: 1 when the dry run refuses (the shard's since
    or upper is not closed yet), else 0 (finalized already is no refusal).

    Raises:
        UsageError: (with ``commit``) the shard's since or upper is not closed yet.
    """
    with open_client(url, consensus, settings, None, time.time, commit=commit) as client:
        if shard not in client.list_shards():
            raise InvalidArgument(f"no shard {shard!r} at {url}: nothing was changed")
        state = client.machine(shard).fetch()
        if state.finalized:
            return f"shard {shard!r} is finalized already", 0
        ready = state.since is None and state.upper is None
        if not commit:
            if ready:
                return f"shard {shard!r} can be finalized (dry run: add --commit)", 0
            return (
                f"shard {shard!r} cannot be finalized yet: since={state.since}, "
                f"upper={state.upper} (both must be closed, None)"
            ), 1
        client.finalize_shard(shard)
        seqno = client.machine(shard).fetch().seqno
        return f"shard {shard!r} finalized at seqno {seqno}", 0


def _summary(state: State) -> dict[str, Any]:
    parts = [p for b in state.trace for run in b.runs for p in run]
    return {
        "shard": state.shard_id,
        "seqno": state.seqno,
        "upper": state.upper,
        "since": state.since,
        "finalized": state.finalized,
        "batches": len(state.trace),
        "updates": sum(b.updates for b in state.trace),
        "parts": len(parts),
        "part_bytes": sum(p.size if isinstance(p, HollowPart) else len(p.data) for p in parts),
        "leased_readers": len(state.leased_readers),
        "critical_readers": len(state.critical_readers),
        "writers": len(state.writers),
    }


def _batch(batch: HollowBatch) -> dict[str, Any]:
    return {
        "id": batch.id,
        "lower": batch.desc.lower,
        "upper": batch.desc.upper,
        "since": batch.desc.since,
        "updates": batch.updates,
        "runs": [[_part(p) for p in run] for run in batch.runs],
    }


def _part(part: HollowPart | InlinePart) -> dict[str, Any]:
    window = _window(part.window) | ({"forward": part.forward} if part.forward else {})
    if isinstance(part, InlinePart):
        return {"inline_bytes": len(part.data), "updates": part.updates} | window
    return {
        "key": part.key,
        "bytes": part.size,
        "updates": part.updates,
        "times": [part.t_min, part.t_max],
    } | window


def _window(window: Window | None) -> dict[str, Any]:
    return {} if window is None else {"window": [window.lower, window.upper]}


def _unreferenced(client: PersistClient, state: State, now: datetime) -> list[dict[str, Any]]:
    """Parts listed under the shard that the current state does not name. An older state a
    reader still holds may name them, or a batch not yet applied: GC decides (RFC 0015 §10)."""
    referenced = {
        shard_path(state.shard_id, p.key)
        for b in state.trace
        for run in b.runs
        for p in run
        if isinstance(p, HollowPart)
    }
    return [
        {
            "path": meta.path,
            "bytes": meta.size,
            "age_s": round((now - meta.last_modified).total_seconds(), 1),
        }
        for meta in client.blob.list(shard_path(state.shard_id, "part/"))
        if meta.path not in referenced
    ]


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _age(now: datetime, ms: int) -> float:
    return round(now.timestamp() - ms / 1000, 1)
