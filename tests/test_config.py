"""Settings: defaults, validation, dict/TOML/env sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from slatepy.config import Settings
from slatepy.errors import InvalidArgument


def test_env_values_are_converted_and_overrides_win() -> None:
    env = {"SLATEPY_FLUSH_INTERVAL": "0.05", "SLATEPY_S3_ALLOW_HTTP": "true", "OTHER": "x"}
    settings = Settings.from_env(env, block_size=8192)
    assert settings.flush_interval == 0.05
    assert settings.s3_allow_http is True
    assert settings.block_size == 8192
    assert settings.flush_bytes == Settings().flush_bytes


def test_toml(tmp_path: Path) -> None:
    path = tmp_path / "slatepy.toml"
    path.write_text('flush_interval = 0.2\ns3_endpoint = "http://127.0.0.1:9000"\n')
    settings = Settings.from_toml(path)
    assert settings.flush_interval == 0.2 and settings.s3_endpoint == "http://127.0.0.1:9000"


@pytest.mark.parametrize(
    "bad",
    [
        {"flush_interval": 0},
        {"block_size": 10},
        {"flush_bytes": "lots"},
        {"no_such_option": 1},
        {"store_retries": -1},
    ],
)
def test_bad_settings_are_invalid_arguments(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        Settings.from_dict(bad)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"compactor": "background"}, "compactor='background' is not one of 'in-process', 'off'"),
        ({"cas": "DynamoDB"}, "cas='DynamoDB' is not one of 'conditional', 'dynamodb'"),
        ({"flush_interval": "fast"}, "flush_interval='fast'"),
        ({"max_parallel_writes": 2.5}, "max_parallel_writes=2.5"),
        ({"s3_allow_http": "yes"}, "s3_allow_http='yes'"),
    ],
)
def test_the_constructor_checks_types_and_allowed_values(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(")):
        Settings(**kwargs)  # type: ignore[arg-type]


def test_unknown_options_and_variables_are_rejected_with_a_suggestion() -> None:
    with pytest.raises(InvalidArgument, match="did you mean 'flush_interval'"):
        Settings.from_dict({"flush_intervall": 1})
    with pytest.raises(InvalidArgument, match="did you mean 'SLATEPY_GC_MIN_AGE'"):
        Settings.from_env({"SLATEPY_GC_MIN_AGEE": "1"})
    # The test suite's own variables are not settings.
    assert Settings.from_env({"SLATEPY_TEST_S3_ENDPOINT": "http://x"}) == Settings()
    # persist's validation switch is read by the persist machine, not a setting
    assert Settings.from_env({"SLATEPY_PERSIST_VALIDATE": "1"}) == Settings()


def test_default_memory_budgets_fit_a_small_container() -> None:
    """Issue 33: at default settings a writer's peak RSS stays under 256 MB whatever it
    writes (measured by ``python -m bench.growth``): the write budget plus the caches it can
    fill leave room for the interpreter and compaction's buffers."""
    settings = Settings()
    assert settings.max_unflushed_bytes == 64 * 1024 * 1024
    budgets = settings.max_unflushed_bytes + settings.block_cache_bytes
    assert budgets <= 128 * 1024 * 1024
    # Larger budgets stay a setting away.
    assert Settings(max_unflushed_bytes=512 * 1024 * 1024).max_unflushed_bytes == 512 << 20
