"""``file://`` durability: files and directories are fsynced before a write is acknowledged.

The first tests record every ``os.fsync`` (the path behind the descriptor, once the fsync has
returned) and check what had been fsynced by the time a call returned. The last one counts
real ``fsync`` system calls of a child process under ``strace``.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slatepy import Db
from slatepy.config import Settings
from slatepy.errors import NotDurable, NotFound, StoreUnavailable
from slatepy.store import open_store
from slatepy.store.cas import create_if_absent


class FsyncLog:
    """Paths fsynced so far, in order (thread-safe: the Db flushes from its own threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._paths: list[str] = []

    def record(self, path: str) -> None:
        # A create fsyncs its temporary ``<object>#<digits>`` before linking it into place:
        # the same inode, recorded under the object's name.
        with self._lock:
            self._paths.append(re.sub(r"#\d+( \(deleted\))?$", "", path))

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self._paths)

    def clear(self) -> None:
        with self._lock:
            self._paths.clear()


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[FsyncLog]:
    """Record the path of every successful ``os.fsync``."""
    log = FsyncLog()
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        real_fsync(fd)
        log.record(path)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    yield log


def _settings(**overrides: object) -> Settings:
    return Settings.from_dict({"compactor": "off", "flush_interval": 0.02, **overrides})


def _files(directory: Path) -> set[str]:
    return {str(p) for p in directory.iterdir() if p.is_file()}


@pytest.fixture
def proc_fds() -> None:
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to map descriptors to paths")


@pytest.mark.usefixtures("proc_fds")
def test_open_and_durable_put_fsync_wal_manifest_and_new_directories(
    fsyncs: FsyncLog, tmp_path: Path
) -> None:
    root = tmp_path / "db"
    with Db.open(f"file://{root}", settings=_settings()) as db:
        after_open = set(fsyncs.snapshot())
        # Db.open wrote manifests and the fencing WAL SST into directories it created.
        manifests = _files(root / "manifest")
        assert manifests and manifests <= after_open
        assert _files(root / "wal") <= after_open
        assert {str(root / "manifest"), str(root / "wal")} <= after_open
        # ... and the new directories' own entries, in the root and the root's parent.
        assert {str(root), str(tmp_path)} <= after_open

        wal_before = _files(root / "wal")
        fsyncs.clear()
        db.put(b"key", b"value")  # durable: returns once its WAL SST is in the store
        after_put = fsyncs.snapshot()
        new_wal = _files(root / "wal") - wal_before
        assert new_wal, "a durable put must have written a WAL SST"
        assert new_wal <= set(after_put)
        assert str(root / "wal") in after_put
        # The directory is fsynced after the file it names (the file's bytes first).
        last_dir_sync = max(i for i, p in enumerate(after_put) if p == str(root / "wal"))
        assert all(after_put.index(sst) < last_dir_sync for sst in new_wal)


@pytest.mark.usefixtures("proc_fds")
def test_file_sync_off_fsyncs_nothing(fsyncs: FsyncLog, tmp_path: Path) -> None:
    root = tmp_path / "db"
    with Db.open(f"file://{root}", settings=_settings(file_sync="off")) as db:
        for i in range(5):
            db.put(b"k%d" % i, b"v")
    assert fsyncs.snapshot() == []


@pytest.mark.usefixtures("proc_fds")
def test_store_put_copy_delete_fsync_file_and_directories(fsyncs: FsyncLog, tmp_path: Path) -> None:
    root = tmp_path / "db"
    store = open_store(f"file://{root}", _settings(), create=True)
    fsyncs.clear()

    store.put("a/b/obj", b"1", mode="create")
    # The file, its directory, and each new directory's entry in its parent, up to the root.
    assert fsyncs.snapshot() == [
        str(root / "a" / "b" / "obj"),
        str(root / "a" / "b"),
        str(root / "a"),
        str(root),
    ]

    fsyncs.clear()
    store.put("a/b/obj", b"2")  # overwrite (temporary file renamed over the object)
    assert fsyncs.snapshot() == [str(root / "a" / "b" / "obj"), str(root / "a" / "b")]

    fsyncs.clear()
    store.put("top", b"3", mode="create")
    assert fsyncs.snapshot() == [str(root / "top"), str(root)]

    fsyncs.clear()
    store.copy("a/b/obj", "c/copy")  # a hard link renamed into a new directory
    assert fsyncs.snapshot() == [str(root / "c" / "copy"), str(root / "c"), str(root)]

    fsyncs.clear()
    store.delete("a/b/obj")  # the unlink is a change of the directory
    assert fsyncs.snapshot() == [str(root / "a" / "b")]

    fsyncs.clear()
    store.delete("nowhere/missing")  # idempotent; no directory to sync, no error
    assert fsyncs.snapshot() == []


@pytest.mark.usefixtures("proc_fds")
def test_other_stores_and_file_sync_off_never_fsync(fsyncs: FsyncLog, tmp_path: Path) -> None:
    for store in (
        open_store("memory://", _settings()),
        open_store(f"file://{tmp_path}/off", _settings(file_sync="off"), create=True),
    ):
        store.put("d/x", b"1", mode="create")
        store.put("d/x", b"2")
        store.copy("d/x", "e/y")
        store.delete("d/x")
    assert fsyncs.snapshot() == []


@pytest.mark.usefixtures("proc_fds")
def test_new_root_directories_are_synced_in_their_parents(fsyncs: FsyncLog, tmp_path: Path) -> None:
    open_store(f"file://{tmp_path}/a/b/db", _settings(), create=True)
    assert sorted(fsyncs.snapshot()) == sorted(
        [str(tmp_path), str(tmp_path / "a"), str(tmp_path / "a" / "b")]
    )
    fsyncs.clear()
    open_store(f"file://{tmp_path}/a/b/db", _settings(), create=True)  # exists: nothing new to sync
    assert fsyncs.snapshot() == []


def test_a_failed_fsync_is_never_acknowledged(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    store = open_store(f"file://{tmp_path}/db", _settings(), create=True)
    store.put("wal/0.sst", b"old", mode="create")  # wal/ exists and is durable
    real_fsync = os.fsync
    failing: set[str] = {"file", "directory"}

    def failing_fsync(fd: int) -> None:
        kind = "directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        if kind in failing:
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)
    # A create fsyncs its bytes before any name points at them: a failed data fsync leaves
    # nothing visible, so it is an ordinary (retriable) failure, and never an acknowledgement.
    with pytest.raises(StoreUnavailable) as refused:
        create_if_absent(store, "wal/1.sst", b"data", attempts=3)
    assert not isinstance(refused.value, NotDurable)
    with pytest.raises(NotFound):
        store.get("wal/1.sst")
    assert [p.name for p in (tmp_path / "db" / "wal").iterdir()] == ["0.sst"]

    # Once linked, a failed directory fsync means visible but maybe not durable: NotDurable,
    # and a retried create must not read its own bytes back as success.
    failing.discard("file")
    with pytest.raises(NotDurable, match="could not be made durable") as info:
        store.put("wal/2.sst", b"data", mode="create")
    assert info.value.definite is False
    with pytest.raises(NotDurable):
        create_if_absent(store, "wal/3.sst", b"data", attempts=3)
    failing.add("file")
    with pytest.raises(NotDurable):  # overwrites still go through obstore, then fsync
        store.put("wal/0.sst", b"new")
    with pytest.raises(StoreUnavailable, match="fsync of its directory failed"):
        store.delete("wal/0.sst")


_CHILD = textwrap.dedent(
    """
    import sys
    from slatepy import Db, Settings

    settings = Settings(compactor="off", file_sync=sys.argv[2])
    with Db.open("file://" + sys.argv[1], settings=settings) as db:
        for i in range(20):
            db.put(b"key%04d" % i, b"v" * 100)
    """
)


def _strace_fsyncs(tmp_path: Path, file_sync: str) -> int:
    trace = tmp_path / f"strace-{file_sync}.txt"
    root = tmp_path / f"db-{file_sync}"
    subprocess.run(
        [
            "strace",
            "-f",
            "-qq",
            "-e",
            "trace=fsync,fdatasync",
            "-o",
            str(trace),
            sys.executable,
            "-c",
            _CHILD,
            str(root),
            file_sync,
        ],
        check=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    calls = [
        line
        for line in trace.read_text().splitlines()
        if ("fsync(" in line or "fdatasync(" in line) and "= 0" in line
    ]
    return len(calls)


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_strace_counts_real_fsyncs_for_20_durable_puts(tmp_path: Path) -> None:
    probe = subprocess.run(
        ["strace", "-qq", "-e", "trace=none", "true"], check=False, capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here (ptrace denied?): {probe.stderr.decode()[:200]}")
    # Each durable put writes one WAL SST: at least the SST and the wal/ directory are synced.
    full = _strace_fsyncs(tmp_path, "fsync")
    assert full >= 2 * 20
    # fsync-file: one fsync per WAL SST instead of two (the file, after its link).
    assert 20 <= _strace_fsyncs(tmp_path, "fsync-file") <= full - 20
    assert _strace_fsyncs(tmp_path, "off") == 0


def test_a_create_is_fsynced_before_its_name_exists(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """RFC 0007's window closed: the bytes of a created object are durable before any name
    points at them, so a crash cannot leave a short object under its final name."""
    root = tmp_path / "db"
    store = open_store(f"file://{root}", _settings(), create=True)
    real_fsync = os.fsync
    seen: list[tuple[str, bool]] = []

    def checking_fsync(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            final = re.sub(r"#\d+$", "", os.readlink(f"/proc/self/fd/{fd}"))
            seen.append((final, os.path.exists(final)))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", checking_fsync)
    with Db.open(f"file://{root}", settings=_settings()) as db:
        db.put(b"key", b"value")
    store.put("a/b/obj", b"1", mode="create")
    assert seen and all(not existed for _, existed in seen), seen
    assert str(root / "a" / "b" / "obj") in {path for path, _ in seen}
    assert store.get("a/b/obj") == b"1"
    assert sorted(p.name for p in (root / "a" / "b").iterdir()) == ["obj"]  # no temporaries


def test_a_create_returns_the_etag_obstore_reports(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/db", _settings(), create=True)
    etag = store.put("wal/1.sst", b"x" * 1000, mode="create")
    assert etag is not None and etag == store.head("wal/1.sst").e_tag
    assert [m.path for m in store.list("wal/")] == ["wal/1.sst"]


@pytest.mark.usefixtures("proc_fds")
def test_concurrent_creates_share_a_directory_fsync_that_began_after_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Group commit of directory entries: creates waiting behind a running directory fsync
    are covered by one later fsync, and none returns before a directory fsync that started
    after its own link."""
    root = tmp_path / "db"
    store = open_store(f"file://{root}", _settings(), create=True)
    store.put("wal/0.sst", b"0", mode="create")
    real_fsync = os.fsync
    gate = threading.Event()
    entered = threading.Event()
    directory_syncs: list[set[str]] = []  # the wal/ entries present when each fsync began

    def gated_fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(root / "wal"):
            directory_syncs.append({p.name for p in (root / "wal").iterdir()})
            if len(directory_syncs) == 1:
                entered.set()
                assert gate.wait(30)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", gated_fsync)
    returned: dict[str, int] = {}

    def create(name: str) -> None:
        store.put(f"wal/{name}", b"data", mode="create")
        returned[name] = len(directory_syncs)

    first = threading.Thread(target=create, args=("1.sst",))
    first.start()
    assert entered.wait(30)
    others = [threading.Thread(target=create, args=(f"{i}.sst",)) for i in (2, 3, 4)]
    for thread in others:
        thread.start()
    deadline = time.monotonic() + 30
    while len(list((root / "wal").glob("[234].sst"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    gate.set()
    for thread in (first, *others):
        thread.join(30)
    assert sorted(returned) == ["1.sst", "2.sst", "3.sst", "4.sst"]
    # One fsync for the first create, one shared by the three that linked while it ran.
    assert len(directory_syncs) == 2
    assert {"2.sst", "3.sst", "4.sst"} <= directory_syncs[1]
    assert all(returned[name] == 2 for name in ("2.sst", "3.sst", "4.sst"))


@pytest.mark.usefixtures("proc_fds")
def test_fsync_file_mode_syncs_a_created_file_once_after_its_link(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``file_sync="fsync-file"``: one fsync per create, of the file under its final name
    (its journal commit carries the name), none of an existing directory; new directories
    are still made durable in their parents, and overwrites keep both fsyncs."""
    root = tmp_path / "db"
    store = open_store(f"file://{root}", _settings(file_sync="fsync-file"), create=True)
    real_fsync = os.fsync
    seen: list[tuple[str, bool]] = []

    def checking_fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        final = re.sub(r"#\d+( \(deleted\))?$", "", path)
        seen.append((final, stat.S_ISDIR(os.fstat(fd).st_mode) or os.path.exists(final)))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", checking_fsync)
    store.put("wal/1.sst", b"1", mode="create")  # a new directory: its entry in the root
    assert [p for p, _ in seen] == [str(root / "wal" / "1.sst"), str(root)]
    assert all(linked for _, linked in seen)  # the file was fsynced under its name
    seen.clear()
    store.put("wal/2.sst", b"2", mode="create")
    assert seen == [(str(root / "wal" / "2.sst"), True)]
    seen.clear()
    store.put("wal/2.sst", b"3")  # an overwrite: through obstore, file and directory
    assert [p for p, _ in seen] == [str(root / "wal" / "2.sst"), str(root / "wal")]
    assert store.get("wal/1.sst") == b"1" and store.get("wal/2.sst") == b"3"
    with Db.open(f"file://{root}/db2", settings=_settings(file_sync="fsync-file")) as db:
        seen.clear()
        db.put(b"key", b"value")
        assert len([p for p, _ in seen if "/wal/" in p]) == 1
        assert str(root / "db2" / "wal") not in {p for p, _ in seen}


class PowerLossModel:
    """What a power loss at a given moment would leave of a ``file://`` database, from the
    fsyncs and links that had completed by then (files are immutable once named).

    A file survives if its inode was fsynced and its name is durable: its link (or, for an
    object obstore wrote, the moment before its first fsync) happened before the start of
    an fsync of its directory, or, under ``fsync-file``, of the file itself, that ended
    before the moment.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, file_only: bool) -> None:
        self._file_only = file_only
        self._clock = iter(range(1, 1 << 62))
        self._lock = threading.Lock()
        self.fsyncs: list[tuple[int, str, int, int]] = []  # inode, path, start, end
        self.links: dict[str, int] = {}
        real_fsync, real_link = os.fsync, os.link

        def fsync(fd: int) -> None:
            info = os.fstat(fd)
            path = re.sub(r"#\d+( \(deleted\))?$", "", os.readlink(f"/proc/self/fd/{fd}"))
            start = self.now()
            real_fsync(fd)
            self.fsyncs.append((info.st_ino, path, start, self.now()))

        def link(src: str, dst: str, **kwargs: object) -> None:
            real_link(src, dst, **kwargs)  # type: ignore[arg-type]
            self.links[os.fspath(dst)] = self.now()

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "link", link)

    def now(self) -> int:
        with self._lock:
            return next(self._clock)

    def survivors(self, root: Path, moment: int) -> list[Path]:
        done = [(ino, path, start) for ino, path, start, end in self.fsyncs if end < moment]
        kept = []
        for file in root.rglob("*"):
            if not file.is_file() or "#" in file.name:
                continue
            ino = file.stat().st_ino
            synced = [start for i, _, start in done if i == ino]
            named = self.links.get(str(file), min(synced, default=moment) - 1)
            covering = (
                synced
                if self._file_only
                else [start for _, path, start in done if path == str(file.parent)]
            )
            if synced and any(start > named for start in covering):
                kept.append(file)
        return kept

    def restore(self, root: Path, moment: int, target: Path) -> None:
        for file in self.survivors(root, moment):
            copy = target / file.relative_to(root)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, copy)


@pytest.mark.usefixtures("proc_fds")
@pytest.mark.parametrize("mode", ["fsync", "fsync-file"])
def test_acknowledged_batches_survive_a_power_loss_right_after_their_ack(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mode: str
) -> None:
    from slatepy import WriteBatch

    model = PowerLossModel(monkeypatch, file_only=mode == "fsync-file")
    root = tmp_path / "db"
    settings = _settings(file_sync=mode, flush_interval=60)
    acks: list[int] = []
    with Db.open(f"file://{root}", settings=settings) as db:
        for b in range(4):
            batch = WriteBatch()
            for i in range(50):
                batch.put(b"b%d-%03d" % (b, i), b"v%d" % b)
            db.write(batch)  # awaited: acknowledged when this returns
            acks.append(model.now())
    for acked, moment in enumerate(acks, start=1):
        copy = tmp_path / f"after-{acked}"
        model.restore(root, moment, copy)
        with Db.open(f"file://{copy}", settings=_settings(file_sync="off")) as db:
            for b in range(acked):
                assert db.get(b"b%d-000" % b) == b"v%d" % b, (mode, acked, b)
                assert db.get(b"b%d-049" % b) == b"v%d" % b, (mode, acked, b)
