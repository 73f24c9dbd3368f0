"""What a Spark ``abort`` may delete (RFC 0025): only what is provably unreferenced.

Spark calls ``abort(messages)`` when a task failed, but also when ``commit(messages)``
raised or its Python worker died, and those can happen *after* the manifest publish or the
shard append landed (an exception or an OOM in the commit's tail, or an indeterminate
compare-and-set that may still land). Deleting what such messages name destroys published
data. The one proof available is Spark's own contract: it calls ``commit`` only when every
task succeeded, and a failed task's slot in ``abort``'s list is ``None``. So:

* a ``None`` slot: no commit was ever started with these messages, no publish of what they
  name exists or can land; the sinks delete it (after checking that the current manifest
  or shard state does not reference it, which it cannot);
* no ``None`` slot: the commit ran and failed, possibly after (or while) its publish landed:
  nothing is deleted. What is unreferenced is an orphan, and GC deletes it once it is old
  enough: the KV GC's rule 3 (unreferenced compacted SSTs older than ``gc_min_age``; a
  load never publishes SSTs older than half that) and persist GC (unreferenced parts older
  than ``batch_lease``; an append refuses batches older than half that).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("slatepy.spark")


def commit_never_ran(messages: Sequence[Any]) -> bool:
    """Whether ``abort``'s ``messages`` prove that no ``commit`` was started with them: a
    failed task's slot is ``None``, and Spark commits only when every task succeeded."""
    return any(message is None for message in messages)


def left_to_gc(what: str, count: int, gc: str) -> None:
    """Log that an abort after a commit deletes nothing (see the module docstring)."""
    if count:
        log.warning(
            "%s: the commit ran and failed, maybe after its publish landed: its %d object(s) "
            "are not deleted; %s deletes those left unreferenced",
            what,
            count,
            gc,
        )
