"""An S3/DynamoDB wire-protocol server (moto) on 127.0.0.1 for tests.

Tests talk real HTTP to it through obstore and boto3, so the S3 code paths (signing,
conditional-put status codes, error bodies) are exercised, not mocked.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

TEST_REGION = "us-east-1"
TEST_KEY_ID = "testing"
TEST_SECRET = "testing"


@dataclass(frozen=True, slots=True)
class S3Endpoint:
    """Where a test S3 server listens and how to sign requests to it."""

    url: str
    region: str = TEST_REGION
    access_key_id: str = TEST_KEY_ID
    secret_access_key: str = TEST_SECRET


@contextmanager
def moto_server(*, separate_process: bool = False) -> Iterator[S3Endpoint]:
    """Run a moto server on a free port of 127.0.0.1 for the ``with`` block.

    Args:
        separate_process: Serve from a child process instead of a thread, so the server
            does not compete for this interpreter's GIL (benchmarks want that; tests do not
            need it).
    """
    if separate_process:
        with _moto_process() as endpoint:
            yield endpoint
        return
    from moto.server import ThreadedMotoServer

    _atomic_conditional_puts()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield S3Endpoint(f"http://{host}:{port}")
    finally:
        server.stop()


_PUT_LOCK = threading.Lock()


def _atomic_conditional_puts() -> None:
    """Make moto's PUT (its ``If-None-Match`` / ``If-Match`` check, then the store) one step.

    moto checks the condition, does other work, then stores, with no lock: two creates of
    one key racing in the threaded server could both succeed, which S3 never allows (found
    by ``tests/persist/test_linearizability.py``: two commits at one consensus seqno).
    Idempotent; the server of ``separate_process=True`` is not patched."""
    from moto.s3.responses import S3Response

    put = S3Response.put_object
    if getattr(put, "_slatepy_atomic", False):
        return

    @functools.wraps(put)
    def atomic_put(self: S3Response) -> Any:
        with _PUT_LOCK:
            return put(self)

    atomic_put._slatepy_atomic = True  # type: ignore[attr-defined]
    S3Response.put_object = atomic_put  # type: ignore[method-assign]


def create_bucket(endpoint: S3Endpoint, bucket: str) -> None:
    """Create ``bucket`` on the test server (boto3 over HTTP); existing buckets are kept."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint.url,
        region_name=endpoint.region,
        aws_access_key_id=endpoint.access_key_id,
        aws_secret_access_key=endpoint.secret_access_key,
    )
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if bucket not in existing:
        client.create_bucket(Bucket=bucket)


@contextmanager
def _moto_process() -> Iterator[S3Endpoint]:
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto server process did not start") from None
                time.sleep(0.1)
        yield S3Endpoint(url)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
