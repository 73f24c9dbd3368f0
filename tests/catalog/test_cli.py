"""``slatepy catalog``: the round trip (dump -> edit -> dump -> delete), its audit events, and
every bad input (exit 1, one line, nothing written or created)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slatepy.catalog import open_catalog
from slatepy.cli.main import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["catalog", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(params=["persist-file", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return (
        f"file://{tmp_path}/p" if request.param == "persist-file" else f"sqlite:///{tmp_path}/c.db"
    )


def test_round_trip_dump_edit_dump_delete(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "init", url)[0] == 0
    assert "exists" in run(capsys, "init", url)[1]
    code, out, err = run(capsys, "edit", url, "settings", '{"name": "mode"}', '{"value": "slow"}')
    assert (code, out) == (0, "previous value: null\n")
    assert "fenced by this change" in err  # init left a (gone) leader behind
    code, out, _ = run(capsys, "dump", url, "--ignore-large-collections")
    dumped = json.loads(out)
    entry = dumped["collections"]["settings"][0]
    assert entry["key"] == {"name": "mode"} and entry["value"] == {"value": "slow"}
    assert "audit_log" not in dumped["collections"]
    # The dump's JSON goes back in as it is.
    value = dict(entry["value"], value="fast")
    code, out, _ = run(capsys, "edit", url, "settings", json.dumps(entry["key"]), json.dumps(value))
    assert out == 'previous value: {"value": "slow"}\n'
    code, out, _ = run(capsys, "delete", url, "settings", '{"name": "mode"}')
    assert out == 'previous value: {"value": "fast"}\n'
    assert run(capsys, "delete", url, "settings", '{"name": "mode"}')[1] == "previous value: null\n"
    assert run(capsys, "epoch", url)[1] == "Epoch: 1\n"  # edits never bump the epoch
    assert "would succeed" in run(capsys, "upgrade-check", url)[1]
    target = tmp_path / "dump.json"
    assert run(capsys, "dump", url, "--target", str(target)) == (0, "", "")
    audit = json.loads(target.read_text())["collections"]["audit_log"]
    assert [(e["value"]["event_type"], e["value"]["user"]) for e in audit] == [
        ("initialize", "slatepy catalog"),
        ("create", "slatepy catalog"),
        ("update", "slatepy catalog"),
        ("delete", "slatepy catalog"),
    ]


def test_an_edit_fences_a_running_leader(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from slatepy.errors import FencedError

    with open_catalog(url) as leader:
        leader.open()
        assert run(capsys, "edit", url, "settings", '{"name": "a"}', '{"value": "b"}')[0] == 0
        with pytest.raises(FencedError):
            leader.confirm_leadership()


BAD = [
    (["edit", "{url}", "nope", '{"name": "a"}', '{"value": "b"}'], "unknown catalog collection"),
    (["edit", "{url}", "settings", '{"name": ', '{"value": "b"}'], "not JSON"),
    (["edit", "{url}", "settings", '["a"]', '{"value": "b"}'], "JSON object"),
    (["edit", "{url}", "settings", '{"name": "a"}', '{"value": 1}'], "does not fit"),
    (["edit", "{url}", "settings", '{"name": "a", "x": 1}', '{"value": "b"}'], "does not fit"),
    (["edit", "{url}", "audit_log", '{"id": 1}', "{}"], "append-only"),
    (["delete", "{url}", "settings", "{}"], "does not fit"),
]


@pytest.mark.parametrize(("argv", "message"), BAD)
def test_bad_input_exits_1_and_writes_nothing(
    url: str, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, "init", url)
    before = run(capsys, "dump", url)[1]
    code, out, err = run(capsys, *(url if a == "{url}" else a for a in argv))
    assert code == 1
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and message in err
    assert run(capsys, "dump", url)[1] == before


@pytest.mark.parametrize("command", ["dump", "epoch", "edit", "delete", "upgrade-check"])
def test_a_missing_catalog_exits_1_and_creates_nothing(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = {
        "edit": ["settings", '{"name": "a"}', '{"value": "b"}'],
        "delete": ["settings", '{"name": "a"}'],
    }
    for url in (f"file://{tmp_path}/p", f"sqlite:///{tmp_path}/c.db"):
        code, out, err = run(capsys, command, url, *args.get(command, []))
        assert code == 1 and out == "" and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
