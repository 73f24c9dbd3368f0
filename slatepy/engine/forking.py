"""Handles opened before ``os.fork()`` are unusable in the child (issue 29, RFC 0026).

A ``Db`` or ``DbReader`` runs background threads (the WAL flusher, the compactor, the
poller) that stay in the parent, and a lock one of them held at the fork stays held in the
child for ever: the child's first write hung. Every open handle is tracked here; in a child,
each is marked by its ``_mark_forked(parent_pid)``, and its next call raises
:func:`forked_error` naming the fix, as sqlite3 and lmdb document for their handles.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol

from slatepy.errors import ClosedError


class Forkable(Protocol):
    def _mark_forked(self, parent_pid: int) -> None: ...


_OPEN: weakref.WeakSet[Forkable] = weakref.WeakSet()
_PID = os.getpid()


def track(handle: Forkable) -> None:
    """Mark ``handle`` in a child of a fork made while it is open."""
    _OPEN.add(handle)


def untrack(handle: Forkable) -> None:
    _OPEN.discard(handle)


def _after_fork_in_child() -> None:
    global _PID
    parent, _PID = _PID, os.getpid()
    for handle in list(_OPEN):
        handle._mark_forked(parent)
    _OPEN.clear()  # the parent owns them: nothing of theirs to close or flush here


os.register_at_fork(after_in_child=_after_fork_in_child)


def forked_error(what: str, parent_pid: int) -> ClosedError:
    """The error of a handle used in a child of the process that opened it."""
    return ClosedError(
        f"{what} was opened in process {parent_pid} before os.fork(); this is a child "
        f"({os.getpid()}), where it cannot be used (its background threads and locks stayed "
        "in the parent). Open it after the fork, in the process that uses it (gunicorn "
        "without --preload, multiprocessing's 'spawn' or 'forkserver' start method)"
    )
