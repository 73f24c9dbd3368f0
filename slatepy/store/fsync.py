"""Durable ``file://`` writes: fsync what obstore's ``LocalStore`` changed, and where.

obstore exposes no fsync, and its ``LocalStore`` never calls one. Measured with ``strace``
(obstore 0.12): a ``put`` creates ``<object>#<n>`` with ``O_EXCL``, writes and closes it, then
hard-links it to the object's name and unlinks the temporary (``mode="create"``: ``linkat``) or
renames it over the object (overwrite and If-Match: ``rename``), after creating missing parent
directories (``mkdir``); ``copy`` hard-links the source to ``<destination>#0`` and renames that
into place; ``delete`` unlinks. All of it lives in the page cache until the kernel writes it
back, so a power loss or kernel crash could lose an object the engine had already acknowledged.

:class:`FileSync` makes those changes durable after obstore returns and before the store's
caller sees success: the object's file (its bytes), its directory (the new name), and each
directory the write created (its name in its parent). A file is visible under its final name
slightly before it is durable; that is fine because nothing is acknowledged in between (see
RFC 0007 for what a crash in that window can leave behind).
"""

from __future__ import annotations

import contextlib
import os
import threading


def fsync_path(path: str) -> None:
    """fsync the file or directory at ``path`` (opened read-only, which Linux allows for both).

    Raises:
        OSError: the path cannot be opened or the fsync failed (the data may not be durable).
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileSync:
    """fsyncs the files and directories under ``root`` that a ``LocalStore`` wrote.

    Invariant: when :meth:`written` returns, the object's bytes, its directory entry, and the
    entry of every directory between it and ``root`` are on stable storage. ``root`` itself
    is durable once :meth:`create_root` has returned.

    Thread-safe: a directory is marked durable only after the fsync of its parent returned, so
    a concurrent writer never skips a sync it still needs (at worst both do it).

    Args:
        root: The absolute directory the ``LocalStore`` is rooted at.
    """

    def __init__(self, root: str) -> None:
        self._root = os.path.abspath(root)
        self._inside = self._root.rstrip(os.sep) + os.sep
        # Directories whose own name is durable in their parent; steady state is a hit.
        self._linked = {self._root}
        self._lock = threading.Lock()

    @classmethod
    def create_root(cls, root: str) -> FileSync:
        """Create ``root`` (like ``mkdir -p``) and make every directory it created durable.

        Raises:
            OSError: a directory cannot be created or synced.
        """
        root = os.path.abspath(root)
        missing: list[str] = []
        directory = root
        while not os.path.isdir(directory) and os.path.dirname(directory) != directory:
            missing.append(directory)
            directory = os.path.dirname(directory)
        os.makedirs(root, exist_ok=True)
        for created in missing:
            fsync_path(os.path.dirname(created))
        return cls(root)

    def local_path(self, path: str) -> str:
        """The file an object path names: obstore strips outer ``/`` and refuses ``.``/``..``."""
        return os.path.join(self._root, *(part for part in path.split("/") if part))

    def written(self, path: str) -> None:
        """Make the object just written (put or copy) at ``path`` durable.

        Raises:
            OSError: an fsync failed or the object vanished; durability is unknown.
        """
        target = self.local_path(path)
        # The bytes first, then the name that points at them.
        fsync_path(target)
        directory = os.path.dirname(target)
        fsync_path(directory)
        while not self._is_linked(directory):
            parent = os.path.dirname(directory)
            fsync_path(parent)
            with self._lock:
                self._linked.add(directory)
            directory = parent

    def removed(self, path: str) -> None:
        """Make the removal of the object at ``path`` durable (fsync its directory).

        A missing directory held nothing to remove, so there is nothing to sync.

        Raises:
            OSError: the fsync failed.
        """
        with contextlib.suppress(FileNotFoundError):
            fsync_path(os.path.dirname(self.local_path(path)))

    def _is_linked(self, directory: str) -> bool:
        # Never walk above the root (obstore refuses ".." so paths cannot leave it).
        if not directory.startswith(self._inside):
            return True
        with self._lock:
            return directory in self._linked


__all__ = ["FileSync", "fsync_path"]
