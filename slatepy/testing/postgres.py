"""A throwaway PostgreSQL server on 127.0.0.1 for tests (RFC 0015 §13.2).

``postgres_server()`` runs ``initdb`` into a temporary directory and starts the server with
``pg_ctl`` on a free port, its Unix socket in that directory (never ``/var/run``), ``fsync``
off and trust authentication for the ``postgres`` role; on exit it stops the server with
``-m immediate`` and removes the directory. Whole cycle: about a second.

PostgreSQL refuses to run as root, and CI runs as root: then the directory is handed to the
``postgres`` OS user and every command runs through ``runuser -u postgres --``. The directory
is made with :mod:`tempfile` under the system temp dir, not pytest's ``tmp_path``, whose
parents are private to root and so not reachable by that user.

Binaries are found on ``PATH`` (``initdb``, ``pg_ctl``), else in ``pg_config --bindir``;
:func:`missing_reason` says why a test has to skip when they are not there.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SERVER_USER = "postgres"
"""The database role tests connect as (trust authentication: no password)."""
RUN_AS = "postgres"
"""The OS user that owns the data directory and runs the server when we are root."""
LOGICAL_OPTIONS = (
    "-c wal_level=logical",
    "-c max_replication_slots=16",
    "-c max_wal_senders=16",
)
"""Server options of ``postgres_server(logical=True)``: logical replication for the sources
(RFC 0027), room for a slot per test and a temporary snapshot slot each."""


def find_bindir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` live: ``PATH`` first, then ``pg_config --bindir``."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl and Path(initdb).parent == Path(pg_ctl).parent:
        return Path(initdb).parent
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        return None
    try:
        out = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    bindir = Path(out)
    if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
        return bindir
    return None


def _as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def missing_reason() -> str | None:
    """Why a PostgreSQL server cannot be started here, or ``None`` if it can."""
    if find_bindir() is None:
        return "no PostgreSQL binaries (initdb/pg_ctl) on PATH or in `pg_config --bindir`"
    if _as_root():
        if shutil.which("runuser") is None:
            return "running as root and `runuser` is missing (PostgreSQL refuses to run as root)"
        try:
            import pwd

            pwd.getpwnam(RUN_AS)
        except KeyError:
            return f"running as root and there is no {RUN_AS!r} OS user to run PostgreSQL as"
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listened on a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@dataclass
class PostgresServer:
    """A running test server; :meth:`stop` and :meth:`start` let tests kill and revive it.

    Attributes:
        port: The TCP port on 127.0.0.1.
        root: The temporary directory (data, socket and log inside).
    """

    port: int
    root: Path
    bindir: Path
    running: bool = False
    logical: bool = False

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    def url(self, database: str = "postgres") -> str:
        """A ``postgresql://`` URL of ``database`` on this server (over TCP)."""
        return f"postgresql://{SERVER_USER}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        command = [str(self.bindir / args[0]), *args[1:]]
        if _as_root():
            command = ["runuser", "-u", RUN_AS, "--", *command]
        return subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, cwd=self.root, check=False
        )

    def _check(self, result: subprocess.CompletedProcess[str], what: str) -> None:
        if result.returncode != 0:
            log = (
                self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            )
            raise RuntimeError(
                f"{what} failed ({result.returncode}): {result.stderr.strip()}\n"
                f"server log tail:\n{log}"
            )

    def initdb(self, timeout: float = 60.0) -> None:
        result = self._run(
            "initdb",
            "-D",
            str(self.data_dir),
            "-U",
            SERVER_USER,
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
            timeout=timeout,
        )
        self._check(result, "initdb")

    def start(self, timeout: float = 30.0) -> None:
        """Start the server and wait (at most ``timeout`` seconds) until it accepts
        connections. Restarting after :meth:`stop` keeps every committed transaction (crash
        recovery): ``fsync`` is off, which survives a killed server though not a killed
        machine, and ``synchronous_commit`` stays on, so a commit's WAL has left the server
        process before the client hears of it."""
        options = " ".join(
            (
                f"-p {self.port}",
                f"-k {self.socket_dir}",
                "-c listen_addresses=127.0.0.1",
                "-c fsync=off",
                "-c full_page_writes=off",
                "-c shared_buffers=16MB",
                "-c max_connections=64",
                *(LOGICAL_OPTIONS if self.logical else ()),
            )
        )
        result = self._run(
            "pg_ctl",
            "-D",
            str(self.data_dir),
            "-l",
            str(self.log_path),
            "-w",
            "-t",
            str(max(1, int(timeout))),
            "-o",
            options,
            "start",
            timeout=timeout + 10,
        )
        self._check(result, "pg_ctl start")
        self.running = True
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"PostgreSQL on port {self.port} did not accept connections within "
                        f"{timeout} s"
                    ) from None
                time.sleep(0.05)

    def stop(self, mode: str = "immediate", timeout: float = 30.0) -> None:
        """Stop the server (``immediate``: like a crash, no shutdown checkpoint)."""
        if not self.running:
            return
        result = self._run(
            "pg_ctl",
            "-D",
            str(self.data_dir),
            "-m",
            mode,
            "-w",
            "-t",
            str(max(1, int(timeout))),
            "stop",
            timeout=timeout + 10,
        )
        self.running = False
        self._check(result, "pg_ctl stop")


def _make_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="slatepy-pg-"))
    (root / "sock").mkdir()
    if _as_root():
        shutil.chown(root, RUN_AS, RUN_AS)
        shutil.chown(root / "sock", RUN_AS, RUN_AS)
    return root


@contextmanager
def postgres_server(
    *, start_attempts: int = 3, timeout: float = 30.0, logical: bool = False
) -> Iterator[PostgresServer]:
    """Run a fresh PostgreSQL server for the ``with`` block; see the module docstring.

    Args:
        logical: Start it with ``wal_level=logical`` and replication slots
            (:data:`LOGICAL_OPTIONS`), as the PostgreSQL source needs.
        start_attempts: Tries with a new free port if starting fails (another process may
            take the port between choosing and binding it).
        timeout: Seconds each of initdb, start and stop may take.

    Raises:
        RuntimeError: :func:`missing_reason` is not None, or the server did not start.
    """
    reason = missing_reason()
    if reason is not None:
        raise RuntimeError(reason)
    bindir = find_bindir()
    assert bindir is not None
    root = _make_root()
    server = PostgresServer(port=free_port(), root=root, bindir=bindir, logical=logical)
    try:
        server.initdb(timeout=timeout * 2)
        for attempt in range(start_attempts):
            try:
                server.start(timeout=timeout)
                break
            except RuntimeError:
                if attempt == start_attempts - 1:
                    raise
                server.port = free_port()
        yield server
    finally:
        try:
            server.stop(timeout=timeout)
        finally:
            shutil.rmtree(root, ignore_errors=True)
