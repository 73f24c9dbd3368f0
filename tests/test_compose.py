"""The compose.yaml MinIO loop (issue 32 item 5). There is no Docker in CI: the file's shape is
checked from its YAML, and the commands it runs are run against a moto S3 server, with the
tools service's environment pointed at it instead of MinIO."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml  # PyYAML: installed with moto[server] (through responses)

from slatepy.cli.main import main
from slatepy.testing.moto import S3Endpoint, create_bucket

COMPOSE = Path(__file__).resolve().parent.parent / "compose.yaml"


def _compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_the_tools_image_installs_once_and_the_demo_makes_a_database() -> None:
    """Regression (issue 32): the tools service ran ``pip install`` on every run and nothing
    created a database, so ``slatepy inspect s3://slatepy/mydb`` said NotFound. Fails on
    d969bf0."""
    services = _compose()["services"]
    for name in ("slatepy", "dynamodb-bootstrap"):
        service = services[name]
        assert "pip install" in service["build"]["dockerfile_inline"]  # at build time
        assert service["image"] == "slatepy-dev-tools"
        run = " ".join(str(p) for p in [service.get("entrypoint", ""), service["command"]])
        assert "pip install" not in run, f"{name} installs on every run"
    bootstrap = " ".join(services["minio-bootstrap"]["command"])
    assert "mc mb --ignore-existing local/slatepy" in bootstrap
    tools = services["slatepy"]
    assert tools["depends_on"]["minio-bootstrap"]["condition"] == ("service_completed_successfully")
    command = tools["command"]
    assert command[:4] == ["slatepy", "demo", "--url", "s3://slatepy/mydb"]
    assert COMPOSE.with_name(".dockerignore").read_text().splitlines()[1] == "*"


@pytest.mark.s3
@pytest.mark.slow  # the demo's full run on S3: about 10 s
def test_the_compose_commands_run_against_an_s3_server(
    s3_endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tools = _compose()["services"]["slatepy"]
    for name in list(os.environ):
        if name.startswith("SLATEPY_") and not name.startswith("SLATEPY_TEST_"):
            monkeypatch.delenv(name)
    for name, value in tools["environment"].items():
        monkeypatch.setenv(name, str(value))
    # MinIO's address inside compose, and its credentials, become the moto server's.
    monkeypatch.setenv("SLATEPY_S3_ENDPOINT", s3_endpoint.url)
    monkeypatch.setenv("SLATEPY_S3_ACCESS_KEY_ID", s3_endpoint.access_key_id)
    monkeypatch.setenv("SLATEPY_S3_SECRET_ACCESS_KEY", s3_endpoint.secret_access_key)
    monkeypatch.setenv("SLATEPY_DISK_CACHE", "off")
    create_bucket(s3_endpoint, "slatepy")  # what minio-bootstrap does

    command = tools["command"]
    assert command[0] == "slatepy"
    assert main(command[1:]) == 0  # docker compose run --rm slatepy
    out = capsys.readouterr().out
    assert "slatepy demo on s3://slatepy/mydb" in out and "verified" in out
    assert main(["inspect", "s3://slatepy/mydb"]) == 0  # the README's next command
    assert "manifest" in capsys.readouterr().out.lower()
