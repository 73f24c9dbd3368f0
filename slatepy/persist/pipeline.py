"""The persist write path, top to bottom (RFC 0015 §6): what ``compare_and_append``,
``append`` and ``batch`` do, step by step, each step a function of its own module:

1. **validate** (``persist/validate.py``): the bounds, then every update, before anything
   is written (``InvalidBounds`` first, then the first malformed update);
2. **consolidate** (``persist/consolidation.py``): sorted by ``(k, v, t)``, equal ones
   summed, zeros dropped;
3. **encode** (``persist/codec.py``): an inline part (one data block) or SST entries;
4. **put parts** (``persist/parts.py``, ``PartWriter.write_run``): hollow parts put on the
   blob store, the next one encoded while the last is put (steps 3 and 4 interleave);
5. **commit** (``persist/commit.py``, ``Committer``): the compare-and-append through the
   shard's machine (``persist/state/append.py``); a definite failure deletes the parts.

A batch (``persist/batch.py``) stops after step 4 and commits later
(``WriteHandle.compare_and_append_batch``). The handle (``persist/write.py``) holds the lock
and the handle's life; nothing here knows about either.
"""

from __future__ import annotations

from collections.abc import Iterable

from slatepy.persist.codec import Update
from slatepy.persist.commit import Committer
from slatepy.persist.consolidation import consolidate
from slatepy.persist.errors import UpperMismatch, UsageError
from slatepy.persist.state.records import Runs
from slatepy.persist.validate import check_range, check_time, check_updates


def validated(
    updates: Iterable[object], lower: int, upper: int | None, names: tuple[str, str]
) -> list[Update]:
    """Step 1: the bounds (named ``names``), then the updates; a new list of them."""
    check_range(lower, upper, names)
    return check_updates(updates, lower, upper)


def written(committer: Committer, updates: list[Update]) -> Runs:
    """Steps 2 to 4: consolidate, then encode and put the parts of one run (none when the
    updates cancel out)."""
    consolidated = consolidate(updates)
    return (committer.write_run(consolidated, None),) if consolidated else ()


def compare_and_append(
    committer: Committer, updates: Iterable[Update], expected_upper: int, new_upper: int | None
) -> None:
    """``WriteHandle.compare_and_append``: with no updates and ``new_upper ==
    expected_upper``, the seed's writer heartbeat; else steps 1 to 5."""
    if type(expected_upper) is int and new_upper == expected_upper:
        items = list(updates)
        if not items:
            committer.heartbeat_upper(check_time(expected_upper, "expected upper"))
            return
        updates = items
    checked = validated(updates, expected_upper, new_upper, ("expected upper", "new upper"))
    born = committer.machine.now_ms()  # before the first part is put: its age is at least this
    runs = written(committer, checked)
    committer.commit(runs, expected_upper, new_upper, check=committer.young(runs, [born]))


def append(committer: Committer, updates: Iterable[Update], lower: int, upper: int | None) -> None:
    """``WriteHandle.append``: steps 1 to 4, then the commit that decides on the shard's
    upper (``Committer.append_runs``); a definite failure deletes the parts."""
    checked = validated(updates, lower, upper, ("lower", "upper"))
    born = committer.machine.now_ms()
    runs = written(committer, checked)
    try:
        committer.append_runs(runs, lower, upper, committer.young(runs, [born]))
    except (UsageError, UpperMismatch):
        committer.parts.delete(runs)
        raise


def batch_runs(
    committer: Committer, updates: Iterable[Update], lower: int, upper: int | None
) -> tuple[Runs, int]:
    """``WriteHandle.batch``: steps 1 to 4; the runs and the batch's birth (read before its
    first part was put)."""
    checked = validated(updates, lower, upper, ("lower", "upper"))
    born = committer.machine.now_ms()
    return written(committer, checked), born
