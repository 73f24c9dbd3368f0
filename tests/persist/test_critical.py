"""Critical since holds (RFC 0015 §7.5): registered once per (shard, reader id), fenced by
an opaque token, holding the shard's since with the leased readers."""

from __future__ import annotations

import pytest

from slatepy.errors import ClosedError
from slatepy.persist import OpaqueMismatch, PersistClient, UsageError
from tests.persist.handles_kit import (  # noqa: F401 (fixtures)
    SHARD,
    client_fixture,
    nothing_committed,
    state_of,
    url_fixture,
    validate_states,
)


def test_a_new_hold_starts_at_the_shard_since_with_an_empty_opaque(client: PersistClient) -> None:
    since = client.open_critical_since(SHARD, "controller")
    assert (since.since, since.opaque) == (0, b"")


def test_the_hold_is_registered_once_per_reader_id(client: PersistClient) -> None:
    first = client.open_critical_since(SHARD, "controller")
    assert first.compare_and_downgrade_since(b"", b"epoch1", 4) == 4
    seqno = state_of(client).seqno
    again = client.open_critical_since(SHARD, "controller")
    assert (again.since, again.opaque) == (4, b"epoch1")
    assert state_of(client).seqno == seqno  # nothing committed


def test_a_wrong_opaque_is_a_mismatch_that_changes_nothing(client: PersistClient) -> None:
    since = client.open_critical_since(SHARD, "controller")
    since.compare_and_downgrade_since(b"", b"epoch1", 2)
    seqno = state_of(client).seqno
    with nothing_committed(client), pytest.raises(OpaqueMismatch) as info:
        since.compare_and_downgrade_since(b"epoch0", b"epoch2", 9)
    assert (info.value.expected, info.value.current) == (b"epoch0", b"epoch1")
    assert state_of(client).seqno == seqno
    assert state_of(client).critical_readers["controller"].since == 2


def test_a_matching_opaque_is_stored_even_when_the_since_does_not_move(
    client: PersistClient,
) -> None:
    since = client.open_critical_since(SHARD, "controller")
    since.compare_and_downgrade_since(b"", b"epoch1", 5)
    assert since.compare_and_downgrade_since(b"epoch1", b"epoch2", 3) == 5
    assert since.opaque == b"epoch2"
    assert state_of(client).critical_readers["controller"].opaque == b"epoch2"


def test_a_since_of_none_releases_everything(client: PersistClient) -> None:
    since = client.open_critical_since(SHARD, "controller")
    assert since.compare_and_downgrade_since(b"", b"x", None) is None
    assert state_of(client).since is None


def test_invalid_ids_and_opaques_are_usage_errors(client: PersistClient) -> None:
    with nothing_committed(client), pytest.raises(UsageError):
        client.open_critical_since(SHARD, "no/slash")
    since = client.open_critical_since(SHARD, "controller")
    with nothing_committed(client):
        with pytest.raises(UsageError):
            since.compare_and_downgrade_since("", b"x", 1)  # type: ignore[arg-type]
        with pytest.raises(UsageError):
            since.compare_and_downgrade_since(b"", "x", 1)  # type: ignore[arg-type]
        with pytest.raises(UsageError):
            since.compare_and_downgrade_since(b"", b"x", "1")  # type: ignore[arg-type]


def test_expire_removes_the_hold(client: PersistClient) -> None:
    since = client.open_critical_since(SHARD, "controller")
    since.expire()
    since.expire()
    assert "controller" not in state_of(client).critical_readers
    with pytest.raises(ClosedError):
        since.compare_and_downgrade_since(b"", b"x", 1)
