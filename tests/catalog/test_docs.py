"""The examples of ``docs/catalog.md`` run: its Python blocks in order in one namespace, and
its ``$ slatepy ...`` lines through the CLI, in an empty working directory."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from slatepy.cli.main import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "catalog.md"
BLOCK = re.compile(r"```(python|console)\n(.*?)```", re.DOTALL)


def test_the_examples_in_docs_catalog_md_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = BLOCK.findall(DOC.read_text())
    assert [kind for kind, _ in blocks].count("python") >= 3
    namespace: dict[str, object] = {}
    for kind, text in blocks:
        if kind == "python":
            exec(compile(text, str(DOC), "exec"), namespace)
            continue
        for line in text.splitlines():
            assert line.startswith("$ slatepy "), line
            assert main(shlex.split(line)[2:]) == 0, line
    assert "fence epoch 2, expected 1" in capsys.readouterr().out
    assert (tmp_path / "dump.json").exists()
