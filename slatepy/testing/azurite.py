"""Azurite (Microsoft's Azure Storage emulator) on 127.0.0.1 for tests.

Tests talk the real Azure Blob REST protocol to it through obstore, so the Azure code paths
(shared-key signing, conditional-put status codes, the missing suffix ranges) are exercised,
not mocked. Azurite is a Node.js package, looked up at ``SLATEPY_TEST_AZURITE_BLOB`` (a path),
then where ``install_azurite`` puts it, then on ``PATH``; if it is nowhere and ``npm`` exists,
``ensure_azurite`` installs the pinned version from the npm registry. Without Node.js and npm,
``AzuriteUnavailable`` says so and the tests skip.

``python -m slatepy.testing.azurite install`` installs it ahead of time; ``.ci/run`` runs the
same ``npm install`` into the same directory before the tests.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slatepy.store.url import AZURITE_ACCOUNT, AZURITE_KEY

AZURITE_VERSION = "3.37.0"
"""The pinned Azurite release (npm package ``azurite``); ``.ci/run`` installs the same."""

_START_TIMEOUT = 60.0
_INSTALL_TIMEOUT = 600.0
_API_VERSION = "2021-08-06"


class AzuriteUnavailable(RuntimeError):
    """Azurite is not installed and cannot be (no Node.js or npm), or it did not start."""


@dataclass(frozen=True, slots=True)
class AzureEndpoint:
    """Where a test Azurite serves blobs and how to sign requests to it.

    ``url`` is the account's blob endpoint, path-style as Azurite serves it
    (``http://127.0.0.1:PORT/devstoreaccount1``): the value for ``Settings.azure_endpoint``.
    """

    url: str
    account: str = AZURITE_ACCOUNT
    key: str = AZURITE_KEY

    def settings_fields(self) -> dict[str, Any]:
        """The ``Settings`` fields that point ``az://`` URLs at this Azurite."""
        return {
            "azure_use_emulator": True,
            "azure_endpoint": self.url,
            "azure_account": self.account,
            "azure_access_key": self.key,
        }


def install_dir() -> Path:
    """Where ``install_azurite`` puts the npm package: ``SLATEPY_TEST_AZURITE_HOME`` or a cache.

    Outside the work tree on purpose: nothing to ignore in git, and one download serves every
    checkout on the machine.
    """
    configured = os.environ.get("SLATEPY_TEST_AZURITE_HOME")
    if configured:
        return Path(configured)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "slatepy" / f"azurite-{AZURITE_VERSION}"


def find_azurite() -> str | None:
    """The ``azurite-blob`` executable to run, or None when none is installed.

    Looks at ``SLATEPY_TEST_AZURITE_BLOB`` (an explicit path), then ``install_dir()``, then
    ``PATH``.
    """
    explicit = os.environ.get("SLATEPY_TEST_AZURITE_BLOB")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    installed = install_dir() / "node_modules" / ".bin" / "azurite-blob"
    if installed.is_file():
        return str(installed)
    return shutil.which("azurite-blob")


def install_azurite(target: Path | None = None) -> str:
    """Install the pinned Azurite with ``npm`` into ``target`` (``install_dir()``).

    Returns:
        The path of its ``azurite-blob`` executable.

    Raises:
        AzuriteUnavailable: ``node`` or ``npm`` is missing, or the install failed.
    """
    target = target or install_dir()
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise AzuriteUnavailable(
            "Azurite needs Node.js and npm (e.g. `apt-get install nodejs npm`), or "
            "SLATEPY_TEST_AZURITE_BLOB naming an installed azurite-blob "
            f"(azurite@{AZURITE_VERSION})"
        )
    target.mkdir(parents=True, exist_ok=True)
    command = [
        npm,
        "install",
        "--prefix",
        str(target),
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
        f"azurite@{AZURITE_VERSION}",
    ]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AzuriteUnavailable(f"`{' '.join(command)}` failed: {exc}") from exc
    executable = target / "node_modules" / ".bin" / "azurite-blob"
    if done.returncode != 0 or not executable.is_file():
        tail = (done.stderr or done.stdout).strip()[-2000:]
        raise AzuriteUnavailable(f"`{' '.join(command)}` failed ({done.returncode}): {tail}")
    return str(executable)


def ensure_azurite() -> str:
    """``find_azurite()``, installing the pinned version first where it is missing."""
    return find_azurite() or install_azurite()


@contextmanager
def azurite_server(executable: str | None = None) -> Iterator[AzureEndpoint]:
    """Run Azurite's blob service on a free port of 127.0.0.1 for the ``with`` block.

    Its data lives in a temporary directory removed afterwards. Telemetry is switched off:
    a test server sends nothing beyond this machine.

    Raises:
        AzuriteUnavailable: Azurite cannot be installed, or did not answer within a minute.
    """
    executable = executable or ensure_azurite()
    node = shutil.which("node")
    if node is None:
        raise AzuriteUnavailable("Azurite needs Node.js (`node` is not on PATH)")
    with tempfile.TemporaryDirectory(prefix="slatepy-azurite-") as location:
        proc, url = _start(executable, location)
        try:
            yield AzureEndpoint(url)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


def _start(executable: str, location: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start Azurite and wait until it answers HTTP; a few tries in case a port was taken."""
    failure = ""
    for _ in range(3):
        port = _free_port()
        log = Path(location) / f"azurite-{port}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    executable,
                    "--blobHost",
                    "127.0.0.1",
                    "--blobPort",
                    str(port),
                    "--location",
                    location,
                    "--silent",
                    "--disableTelemetry",
                    "--skipApiVersionCheck",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        base = f"http://127.0.0.1:{port}"
        if _wait_until_answering(proc, base):
            return proc, f"{base}/{AZURITE_ACCOUNT}"
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        failure = log.read_text(errors="replace")[-2000:]
    raise AzuriteUnavailable(f"Azurite ({executable}) did not start: {failure}")


def _wait_until_answering(proc: subprocess.Popen[bytes], base: str) -> bool:
    deadline = time.monotonic() + _START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            urllib.request.urlopen(f"{base}/{AZURITE_ACCOUNT}?comp=list", timeout=1).close()
            return True
        except urllib.error.HTTPError:
            return True  # 403 to an unsigned request: it is serving
        except OSError:
            time.sleep(0.1)
    return False


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def create_container(endpoint: AzureEndpoint, container: str) -> None:
    """Create ``container`` (Create Container, shared-key signed); an existing one is kept.

    obstore reads and writes blobs but cannot create containers, and the Azure SDK is not a
    dependency, so this signs the one request by hand.

    Raises:
        AzuriteUnavailable: the request failed other than with ``ContainerAlreadyExists``.
    """
    url = f"{endpoint.url}/{container}?restype=container"
    headers = {"x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": _API_VERSION}
    path = url.split("://", 1)[1].split("/", 1)[1].split("?", 1)[0]
    # String-to-sign of Shared Key for the Blob service: the verb, eleven standard headers
    # (all empty here), the x-ms-* headers, then /account/path and the query parameters.
    to_sign = "\n".join(
        [
            "PUT",
            *[""] * 11,
            *(f"{name}:{value}" for name, value in sorted(headers.items())),
            f"/{endpoint.account}/{path}\nrestype:container",
        ]
    )
    digest = hmac.new(base64.b64decode(endpoint.key), to_sign.encode(), hashlib.sha256).digest()
    request = urllib.request.Request(
        url,
        method="PUT",
        headers={
            **headers,
            "Authorization": f"SharedKey {endpoint.account}:{base64.b64encode(digest).decode()}",
            "Content-Length": "0",
        },
    )
    try:
        urllib.request.urlopen(request, timeout=10).close()
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")
        if exc.code == 409 and "ContainerAlreadyExists" in body:
            return
        raise AzuriteUnavailable(f"creating container {container}: {exc.code} {body}") from exc
    except OSError as exc:
        raise AzuriteUnavailable(f"creating container {container}: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    """``python -m slatepy.testing.azurite install``: install Azurite, print its path."""
    args = sys.argv[1:] if argv is None else argv
    if args != ["install"]:
        print("usage: python -m slatepy.testing.azurite install", file=sys.stderr)
        return 2
    try:
        print(ensure_azurite())
    except AzuriteUnavailable as exc:
        print(f"azurite: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
