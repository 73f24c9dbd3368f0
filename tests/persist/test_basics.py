"""Persist's small pieces: error types, ids, settings and frontiers."""

from __future__ import annotations

import dataclasses

import pytest

from slatepy.errors import InvalidArgument, SlatepyError, StoreUnavailable
from slatepy.persist import frontier
from slatepy.persist.config import PersistSettings
from slatepy.persist.errors import (
    Indeterminate,
    InvalidBounds,
    OpaqueMismatch,
    SinceError,
    UpperMismatch,
    UsageError,
)
from slatepy.persist.ids import (
    new_leased_reader_id,
    new_token,
    new_writer_id,
    part_key,
    rollup_key,
    rollup_seqno,
    validate_critical_reader_id,
    validate_shard_id,
)


def test_error_hierarchy_and_attributes() -> None:
    assert issubclass(UsageError, InvalidArgument) and issubclass(UsageError, ValueError)
    assert issubclass(InvalidBounds, UsageError)
    mismatch = UpperMismatch(3, None)
    assert (mismatch.expected, mismatch.current) == (3, None)
    assert "closed" in str(mismatch) and isinstance(mismatch, SlatepyError)
    assert "fetch_recent_upper" in str(UpperMismatch(3, 5))
    since = SinceError(2, 4)
    assert since.since == 4 and "read as of a time at or after it" in str(since)
    opaque = OpaqueMismatch(b"a", b"b")
    assert (opaque.expected, opaque.current) == (b"a", b"b")
    indeterminate = Indeterminate("maybe")
    assert isinstance(indeterminate, StoreUnavailable) and indeterminate.definite is False


@pytest.mark.parametrize("shard_id", ["orders", "a", "A.b_c-9", "0" * 128])
def test_valid_shard_ids(shard_id: str) -> None:
    assert validate_shard_id(shard_id) == shard_id
    assert validate_critical_reader_id(shard_id) == shard_id


@pytest.mark.parametrize("shard_id", ["", ".hidden", "a/b", "a b", "é", "0" * 129, None, 7])
def test_invalid_shard_ids(shard_id: object) -> None:
    with pytest.raises(UsageError, match="path component"):
        validate_shard_id(shard_id)


def test_fresh_ids_and_keys() -> None:
    writer, reader, token = new_writer_id(), new_leased_reader_id(), new_token()
    assert writer[0] == "w" and len(writer) == 33 and writer != new_writer_id()
    assert reader[0] == "r" and len(reader) == 33
    assert len(token) == 32 and int(token, 16) >= 0
    assert part_key(writer).startswith(f"part/{writer}/") and part_key(writer).endswith(".sst")
    assert part_key(writer, compaction=True).startswith(f"part/{writer}/c")
    key = rollup_key(42)
    assert key.startswith("rollup/00000000000000000042-") and rollup_seqno(key) == 42
    assert rollup_seqno("rollup/42-x.rollup") is None
    assert rollup_seqno("part/w/x.sst") is None


def test_settings_defaults_and_ms() -> None:
    settings = PersistSettings()
    assert settings.reader_lease_ms == 900_000 and settings.writer_lease_ms == 3_600_000
    assert settings.batch_lease_ms == 3_600_000 and settings.merge_lease_ms == 60_000
    assert settings.consensus_min_age_ms == 3_600_000
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.reader_lease = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"batch_lease": 60.0}, "batch_lease must be >= 3600"),
        ({"consensus_min_age": 60.0}, "consensus_min_age must be >= 3600"),
        ({"reader_lease": 0.0}, "reader_lease must be > 0"),
        ({"inline_part_max_bytes": 1 << 20}, "inline_part_max_bytes"),
        ({"compaction": "sometimes"}, "compaction"),
        ({"max_handles": True}, "max_handles must be of type int"),
        ({"writer_lease": "1"}, "writer_lease must be of type float"),
        ({"allow_short_leases": 1}, "allow_short_leases must be of type bool"),
    ],
)
def test_settings_validation(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        PersistSettings(**overrides)  # type: ignore[arg-type]


def test_short_leases_need_the_test_switch() -> None:
    settings = PersistSettings(batch_lease=2, consensus_min_age=2, allow_short_leases=True)
    assert settings.batch_lease_ms == 2000


def test_settings_from_dict() -> None:
    settings = PersistSettings.from_dict({"reader_lease": "5", "compaction": "off"})
    assert settings.reader_lease == 5.0 and settings.compaction == "off"
    with pytest.raises(InvalidArgument, match="unknown persist setting"):
        PersistSettings.from_dict({"reader_leases": 5})
    with pytest.raises(InvalidArgument, match="invalid persist settings"):
        PersistSettings.from_dict({"reader_lease": "soon"})


def test_frontier_order_with_none_greatest() -> None:
    assert frontier.le(3, 3) and frontier.le(3, None) and frontier.le(None, None)
    assert not frontier.le(None, 3) and not frontier.le(4, 3)
    assert frontier.lt(3, 4) and frontier.lt(3, None)
    assert not frontier.lt(None, None) and not frontier.lt(3, 3)
    assert frontier.meet([5, None, 3]) == 3 and frontier.meet([None, None]) is None
    assert frontier.meet([]) is None
    assert frontier.join(3, None) is None and frontier.join(3, 5) == 5
    assert frontier.contains(2, None, 10**9) and not frontier.contains(2, 5, 5)


def test_check_as_of() -> None:
    assert frontier.check_as_of(5, 5) == 5
    for as_of, since in [(4, 5), (None, 5), (7, None)]:
        with pytest.raises(SinceError) as caught:
            frontier.check_as_of(as_of, since)
        assert caught.value.since == since
