"""Visible waits: bounded request timeouts, retries logged, a clear error naming the endpoint.

Before issue 12, ``Db.open`` against an endpoint that accepted connections and never answered
blocked ``request_attempts`` x ``store_timeout`` (4 x 30 s) without a word.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from slatepy import Db, InvalidArgument, Settings, StoreUnavailable
from slatepy.store import open_store
from slatepy.store.base import ObjectStore, WrappingStore
from slatepy.store.retry import RetryingStore

TIMEOUT = 2.0


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:PORT``: accepts every connection and never sends a byte."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.1)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(conn)  # held open, never answered

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        server.close()


def test_open_against_an_endpoint_that_never_answers_fails_in_bounded_time(
    silent_endpoint: str,
) -> None:
    settings = Settings(
        s3_endpoint=silent_endpoint,
        s3_region="us-east-1",
        s3_access_key_id="test",
        s3_secret_access_key="test",
        store_timeout=TIMEOUT,
        disk_cache="off",
        compactor="off",
    )
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as raised:
        Db.open("s3://bucket/db", settings=settings)
    elapsed = time.monotonic() - started
    # One timed-out attempt, not request_attempts (4) of them: retrying a store that does
    # not answer only multiplies the wait.
    assert elapsed < 3 * TIMEOUT, f"took {elapsed:.1f} s"
    message = str(raised.value)
    assert silent_endpoint.removeprefix("http://") in message  # names the endpoint
    assert "s3://bucket/db" in message and "store_timeout" in message


class FailFirst(WrappingStore):
    """Fails the first ``failures`` GETs without acting, like a flaky network."""

    def __init__(self, inner: ObjectStore, failures: int) -> None:
        super().__init__(inner)
        self.failures = failures

    def get(self, path: str) -> bytes:
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable(f"connection reset reading {path}", path=path)
        return self.inner.get(path)


def test_retries_are_logged_at_info_with_what_is_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner = open_store("memory://")
    inner.put("wal/1.sst", b"data")
    store = RetryingStore(FailFirst(inner, 2), 4)
    with caplog.at_level(logging.INFO, logger="slatepy.store.retry"):
        assert store.get("wal/1.sst") == b"data"
    retries = [r.getMessage() for r in caplog.records if r.name == "slatepy.store.retry"]
    assert len(retries) == 2
    assert retries[0].startswith("retrying GET wal/1.sst on memory://: attempt 1 of 4 failed")
    assert "connection reset reading wal/1.sst" in retries[0]
    assert all(r.levelno == logging.INFO for r in caplog.records)


def test_a_request_that_keeps_failing_names_its_attempts() -> None:
    store = RetryingStore(FailFirst(open_store("memory://"), 10), 3)
    with pytest.raises(StoreUnavailable, match=r"GET k on memory:// failed after 3 attempts"):
        store.get("k")


def test_connect_and_request_timeouts_reach_the_client() -> None:
    settings = Settings(
        s3_endpoint="http://127.0.0.1:9",
        s3_access_key_id="a",
        s3_secret_access_key="b",
        store_timeout=7.0,
        store_connect_timeout=1.5,
    )
    store = open_store("s3://bucket/db", settings)
    options = store._raw.client_options  # type: ignore[attr-defined]
    assert (options["timeout"], options["connect_timeout"]) == ("7s", "1s 500ms")
    assert Settings().store_connect_timeout == 5.0
    with pytest.raises(InvalidArgument, match="store_connect_timeout"):
        Settings(store_connect_timeout=0)
