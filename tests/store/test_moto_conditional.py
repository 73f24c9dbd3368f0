"""The test S3 server (moto, threaded) must make conditional PUTs atomic, as S3 does.

moto checks ``If-None-Match: *`` (and ``If-Match``) and then stores the object, with other
work between the two and no lock: two creates racing on one key could both succeed. The
object-store consensus builds compare-and-set on such creates, so a persist test racing
processes on S3 saw two commits at one seqno ("the consensus entry at 773 changed", found
by ``tests/persist/test_linearizability.py``). ``slatepy.testing.moto`` serializes them.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from moto.s3.models import S3Backend

from slatepy.errors import AlreadyExists
from slatepy.store import open_store
from slatepy.testing.moto import S3Endpoint
from tests.conftest import TEST_BUCKET, s3_settings

THREADS = 4


@pytest.mark.s3
def test_racing_creates_of_one_key_on_the_test_server_let_exactly_one_win(
    s3_endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(f"s3://{TEST_BUCKET}/race-{uuid.uuid4().hex[:12]}", s3_settings(s3_endpoint))
    stored = S3Backend.put_object

    def slow_put_object(self: S3Backend, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.05)  # widen the server's window between its check and its store
        return stored(self, *args, **kwargs)

    monkeypatch.setattr(S3Backend, "put_object", slow_put_object)
    wins: list[int] = []
    barrier = threading.Barrier(THREADS)

    def race(me: int) -> None:
        barrier.wait()
        try:
            store.put("k", b"from %d" % me, mode="create")
        except AlreadyExists:
            return
        wins.append(me)

    threads = [threading.Thread(target=race, args=(me,)) for me in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(wins) == 1, wins
    assert store.get("k") == b"from %d" % wins[0]
