"""``bench.l0_reads`` measures the tree it is given: its children used to run ``python -c``,
which puts the working directory before ``PYTHONPATH``, so run from one worktree every
"tree" of an A/B imported that worktree's slatepy."""

from __future__ import annotations

from pathlib import Path

import pytest

import slatepy
from bench.l0_reads import build, measure


def test_a_child_imports_the_measured_tree_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    urls = build(tmp_path / "data", 200, 2)
    decoy = tmp_path / "decoy"
    (decoy / "slatepy").mkdir(parents=True)
    (decoy / "slatepy" / "__init__.py").write_text("raise ImportError('the decoy tree')\n")
    monkeypatch.chdir(decoy)  # as when the benchmark is run from another worktree
    tree = str(Path(slatepy.__file__).resolve().parents[1])
    figures = measure(tree, urls["l0"], 200, [])
    assert figures["scan cpu ms"] > 0 and figures["gets/s"] > 0
