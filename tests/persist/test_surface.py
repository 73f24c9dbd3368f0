"""Persist's Pythonic surface (issue 32 item 4): every handle is a context manager, closing
releases what it registered (a leased reader's lease, a writer's registration, but not a
critical since), and wrong types raise ``InvalidType`` (a ``TypeError``) before anything is
written."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slatepy.cli.main import main
from slatepy.errors import ClosedError, InvalidArgument, InvalidType
from slatepy.persist import PersistClient, Progress, UsageError, aio
from tests.persist.handles_kit import (  # noqa: F401 (fixtures)
    SHARD,
    TEST_SETTINGS,
    client_fixture,
    nothing_committed,
    state_of,
    url_fixture,
    validate_states,
)


def registered(client: PersistClient) -> tuple[int, int, int]:
    """(leased readers, writers, critical readers) in the shard's state now."""
    state = state_of(client)
    return len(state.leased_readers), len(state.writers), len(state.critical_readers)


def test_client_close_releases_its_readers_and_writers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``client.close()`` left the reader's lease (15 min) and the writer (1 h)."""
    url = f"file://{tmp_path}"
    client = PersistClient.open(url)
    client.open_writer(SHARD).append([((b"k", b"v"), 0, 1)], 0, 1)
    client.open_leased_reader(SHARD).snapshot(0)
    client.open_critical_since(SHARD, "controller")
    with PersistClient.open(url) as other:
        assert registered(other) == (1, 1, 1)
        client.close()
        # A critical since is durable by design: close leaves it.
        assert registered(other) == (0, 0, 1)
    assert main(["persist", "inspect", url, SHARD]) == 0
    shard = json.loads(capsys.readouterr().out)
    assert not shard["leased_readers"] and not shard["writers"]


def test_handles_are_context_managers_releasing_on_exit(client: PersistClient) -> None:
    with client.open_writer(SHARD) as write:
        write.compare_and_append([((b"k", b"v"), 0, 1)], 0, 2)
        assert registered(client) == (0, 1, 0)
    assert registered(client) == (0, 0, 0)
    with pytest.raises(ClosedError):
        write.append([], 2, 3)
    with client.open_leased_reader(SHARD) as read:
        assert registered(client) == (1, 0, 0)
        with read.listen(0) as listen:
            assert listen.fetch_next(timeout=1.0)[-1] == Progress(2)
        assert listen.ended
    assert registered(client) == (0, 0, 0)
    with pytest.raises(ClosedError):
        read.snapshot(1)
    with client.open_critical_since(SHARD, "c") as since:
        since.compare_and_downgrade_since(b"", b"1", 1)
    assert state_of(client).critical_readers["c"].since == 1  # kept: durable by design
    with pytest.raises(ClosedError):
        since.compare_and_downgrade_since(b"1", b"2", 2)
    since.expire()  # the one way to release it
    assert registered(client) == (0, 0, 0)


def test_closing_a_writer_that_never_appended_changes_nothing(client: PersistClient) -> None:
    client.open_writer(SHARD).compare_and_append([], 0, 1)
    write = client.open_writer(SHARD)
    with nothing_committed(client):
        write.close()
        write.close()  # idempotent
    with pytest.raises(ClosedError):
        write.append([((b"k", b"v"), 1, 1)], 1, 2)


def test_the_asyncio_handles_are_async_context_managers() -> None:
    async def scenario() -> tuple[int, int, int]:
        async with await aio.PersistClient.open("memory://", settings=TEST_SETTINGS) as client:
            async with await client.open_writer(SHARD) as write:
                await write.append([((b"k", b"v"), 0, 1)], 0, 1)
            async with (
                await client.open_leased_reader(SHARD) as read,
                await read.listen(0) as listen,
            ):
                assert await listen.fetch_next(timeout=1.0) == [Progress(1)]
            async with await client.open_critical_since(SHARD, "c"):
                pass
            return registered(client.sync)

    assert asyncio.run(scenario()) == (0, 0, 1)


BAD_UPDATES: list[tuple[str, Callable[[Any], None], str]] = [
    ("str key", lambda w: w.append([(("k", b"v"), 0, 1)], 0, 1), "key must be bytes, not str"),
    ("str value", lambda w: w.append([((b"k", "v"), 0, 1)], 0, 1), "value must be bytes, not str"),
    ("float time", lambda w: w.append([((b"k", b"v"), 0.0, 1)], 0, 1), "time must be an int"),
    ("str diff", lambda w: w.append([((b"k", b"v"), 0, "1")], 0, 1), "diff must be an int"),
    ("no tuple", lambda w: w.append([b"kv"], 0, 1), "is not ((key, value), time, diff)"),
    ("str lower", lambda w: w.append([], "0", 1), "lower must be an int"),
    ("float upper", lambda w: w.compare_and_append([], 0, 1.0), "new upper must be an int"),
    ("batch", lambda w: w.batch([((b"k", 1), 0, 1)], 0, 1), "value must be bytes, not int"),
    ("builder", lambda w: w.builder(0).add(b"k", b"v", 0, 1.0), "diff must be an int"),
]


@pytest.mark.parametrize(("name", "call", "message"), BAD_UPDATES, ids=[b[0] for b in BAD_UPDATES])
def test_wrong_types_raise_invalid_type_before_writing(
    client: PersistClient, name: str, call: Callable[[Any], None], message: str
) -> None:
    """Before: a ``UsageError`` that was no ``TypeError``."""
    write = client.open_writer(SHARD)
    with nothing_committed(client), pytest.raises(InvalidType, match=re.escape(message)) as raised:
        call(write)
    assert isinstance(raised.value, TypeError)
    assert isinstance(raised.value, UsageError) and isinstance(raised.value, InvalidArgument)


def test_out_of_range_values_stay_value_errors(client: PersistClient) -> None:
    with pytest.raises(UsageError) as raised:
        client.open_writer(SHARD).append([((b"k", b"v"), 0, 2**63)], 0, 1)
    assert not isinstance(raised.value, TypeError)
    assert isinstance(raised.value, ValueError)
