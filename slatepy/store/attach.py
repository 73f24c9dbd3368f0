"""Who else uses a ``file://`` database: a shared ``flock`` held by every open store.

Every store :func:`slatepy.store.open_store` opens on ``file://`` (a writer, a reader, a
WAL feed, the CLI, a compactor or GC process) takes a *shared* lock on ``ROOT/.slatepy-users``
before it reads anything, and holds it while the store object lives. A writer's garbage
collector that can turn its own shared lock into an *exclusive* one for a pass knows that no
other store of this database is open, on this machine or (where ``flock`` reaches the
server, as Linux's NFS client) any other, so only its own process can hold a manifest or read
an SST; it then collects what only its process could still need (RFC 0029).

A lock that cannot be taken (a read-only mount without the file, a filesystem without
``flock``) counts as "someone else may be here": the collector keeps its usual grace.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import weakref
from collections.abc import Iterator

USERS_FILE = ".slatepy-users"
"""The lock file in a ``file://`` database's root (GC lists only its own directories)."""

_ATTACHED: weakref.WeakKeyDictionary[object, Attachment] = weakref.WeakKeyDictionary()


class Attachment:
    """This store's shared lock on the database root's users file."""

    def __init__(self, root: str, *, create: bool) -> None:
        """Open the users file and take a shared lock; ``fd`` is -1 when that is
        impossible, and :meth:`alone` then always answers False.

        Only the store that may create the database (``create``: a writer's) creates the
        file; others write nothing (a reader on a read-only mount, a command pointed at
        another program's data). A writer that creates the file for a database that
        already existed cannot know which readers opened before it: it never counts as
        alone (the next writer does).
        """
        self._mutex = threading.Lock()
        self.fd = -1
        self._path = os.path.join(root, USERS_FILE)
        existed = os.path.exists(self._path)
        new_database = not os.path.isdir(os.path.join(root, "manifest"))
        self.trusted = existed or new_database
        # An existing directory without the file may be another program's data: the file is
        # made only once the writer's open succeeded there (``adopt``).
        self._lock(create=create and new_database)

    def _lock(self, *, create: bool) -> None:
        for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY) if create else (os.O_RDONLY,):
            with contextlib.suppress(OSError):
                self.fd = os.open(self._path, flags | os.O_CLOEXEC, 0o644)
                break
        if self.fd < 0:
            return
        try:
            fcntl.flock(self.fd, fcntl.LOCK_SH)
        except OSError:
            os.close(self.fd)
            self.fd = -1
            return
        weakref.finalize(self, os.close, self.fd)

    def adopt(self) -> None:
        """Called once a writer opened the database: make the users file where it was
        missing (a database from before RFC 0029); such a writer never counts as alone."""
        if self.fd < 0:
            self._lock(create=True)

    @contextlib.contextmanager
    def alone(self) -> Iterator[bool]:
        """True while no other store of the database is open: the lock is exclusive for
        the block (other stores' opens wait for it), shared again after."""
        with self._mutex:
            if self.fd < 0 or not self.trusted:
                yield False
                return
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(self.fd, fcntl.LOCK_SH)


def attach(store: object, root: str, *, create: bool) -> None:
    """Give ``store`` (a ``file://`` store just opened; ``create``: it may create the
    database) its shared lock."""
    _ATTACHED[store] = Attachment(root, create=create)


def attachment_of(store: object) -> Attachment | None:
    """The lock :func:`attach` gave ``store``; None for other stores (memory, remote, or an
    instance the caller built)."""
    return _ATTACHED.get(store)
