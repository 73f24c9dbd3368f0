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

Creates (``put(mode="create")``: every WAL SST, manifest and compacted SST) do not go through
obstore at all: :meth:`FileSync.create` writes them itself with obstore's protocol and names
(``<object>#<digits>``, which obstore's listings skip), fsyncing the temporary file *before*
it is linked into place, so a crash can no longer leave a short object under its final name,
and a failed data fsync is retriable (nothing was visible yet). It also skips obstore's
runtime hop, which cost more than the fsyncs on a busy machine (RFC 0006, issue 33 addendum).
Directory fsyncs are shared: a writer whose change is already covered by an fsync of the
same directory that *started* after the change waits for that one instead of issuing its own
(group commit of directory entries when several WAL SSTs are written at once).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from dataclasses import dataclass, field


class CreateRefused(FileExistsError):
    """:meth:`FileSync.create` found an object already at the path (nothing was written)."""


class NotSynced(OSError):
    """The object was linked into place but a directory fsync failed: visible, maybe not
    durable (the caller must not retry the create and read its own bytes back as success)."""


@dataclass
class _DirectoryState:
    """Directory-fsync group commit: ``changes`` counts entry changes made so far,
    ``synced`` the count an fsync that has returned covered (it started after them)."""

    changes: int = 0
    synced: int = 0
    syncing: bool = False
    done: threading.Condition = field(default_factory=threading.Condition)


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
        self._directories: dict[str, _DirectoryState] = {}
        self._temporary = itertools.count(1)
        # Digits only: obstore's listings skip ``name#<digits>`` (its in-progress uploads).
        self._prefix = str(os.getpid())
        self.file_only = False
        """``Settings.file_sync="fsync-file"``: a create fsyncs the file once, after the link,
        and not its (existing) directory; see :meth:`create`."""

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

    def create(self, path: str, data: bytes | bytearray | memoryview) -> str:
        """Create the object at ``path`` holding ``data`` unless it exists, durably, and
        return its ETag (obstore's ``LocalStore`` scheme, so later HEADs agree).

        The order makes the minimal fsync set sufficient (RFC 0007, issue 33 addendum):
        write a temporary ``<object>#<digits>`` with ``O_EXCL``, fsync it (bytes and inode),
        hard-link it to the final name (atomic; fails if taken), unlink the temporary, fsync
        the directory (both entry changes at once), then make any directory this call
        created durable in its parent. Two fsyncs in the steady state, as before, but the
        data is durable before any name points at it.

        With :attr:`file_only` the file is fsynced once, *after* the link and the unlink, and
        its directory not at all (new directories still are, in their parents): on a
        journaling filesystem (ext4 ``data=ordered``, XFS, btrfs) the fsync of a file
        commits the journal transaction that holds its new name, and ext4's ordered mode
        writes the data before that commit, so name and bytes become durable together.
        POSIX does not promise it, hence opt-in.

        Raises:
            CreateRefused: an object already exists at ``path`` (nothing written).
            NotSynced: linked, but the directory fsync failed (durability unknown).
            OSError: anything else before the link (nothing visible; safe to retry).
        """
        target = self.local_path(path)
        directory = os.path.dirname(target)
        try:
            fd, temporary = self._open_temporary(target)
        except FileNotFoundError:
            os.makedirs(directory, exist_ok=True)
            fd, temporary = self._open_temporary(target)
        try:
            try:
                with memoryview(data) as view:
                    written = 0
                    while written < len(view):
                        written += os.write(fd, view[written:])
                if not self.file_only:
                    os.fsync(fd)
                stat = os.fstat(fd)
                try:
                    os.link(temporary, target)
                except FileExistsError as exc:
                    raise CreateRefused(exc.errno, f"object already exists: {path}") from exc
                finally:
                    # A temporary left behind is invisible (listings skip it), holds no name.
                    with contextlib.suppress(OSError):
                        os.unlink(temporary)
                if self.file_only:
                    try:
                        os.fsync(fd)
                    except OSError as exc:
                        raise NotSynced(exc.errno, f"fsync of {path} failed: {exc}") from exc
            finally:
                os.close(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        try:
            if not self.file_only:
                self._sync_directory(directory)
            while not self._is_linked(directory):
                parent = os.path.dirname(directory)
                self._sync_directory(parent)
                with self._lock:
                    self._linked.add(directory)
                directory = parent
        except OSError as exc:
            raise NotSynced(exc.errno, f"fsync of a directory of {path} failed: {exc}") from exc
        return f'"{stat.st_ino:x}-{stat.st_mtime_ns // 1000:x}-{stat.st_size:x}"'

    def _open_temporary(self, target: str) -> tuple[int, str]:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        while True:
            temporary = f"{target}#{self._prefix}{next(self._temporary)}"
            try:
                return os.open(temporary, flags, 0o644), temporary
            except FileExistsError:
                continue  # a leftover of a crashed process with our pid: take the next

    def _sync_directory(self, directory: str) -> None:
        """fsync ``directory`` after an entry change of ours in it, or wait for an fsync of
        it that began after the change (it covers ours)."""
        with self._lock:
            state = self._directories.setdefault(directory, _DirectoryState())
            state.changes += 1
            mine = state.changes
        with state.done:
            while True:
                if state.synced >= mine:
                    return
                if not state.syncing:
                    break
                state.done.wait()
            state.syncing = True
            with self._lock:
                covers = state.changes  # every change counted here happened before the fsync
        try:
            fsync_path(directory)
        except BaseException:
            with state.done:
                state.syncing = False
                state.done.notify_all()
            raise
        with state.done:
            state.syncing = False
            state.synced = max(state.synced, covers)
            state.done.notify_all()

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


__all__ = ["CreateRefused", "FileSync", "NotSynced", "fsync_path"]
