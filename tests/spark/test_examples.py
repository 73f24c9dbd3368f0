"""``examples/persist_pipeline.py`` runs (in the shared session) and does what it says."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spark

EXAMPLE = Path(__file__).parents[2] / "examples" / "persist_pipeline.py"


def test_the_persist_pipeline_example(spark: Any, tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("persist_pipeline", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = module.run_pipeline(spark, tmp_path)
    streamed = out["streamed"]
    keys = sorted(key for _, key, _, _, _ in streamed)
    assert keys == sorted(f"order-{f:03}-{r:02}" for f in range(3) for r in range(5))
    assert all(diff == 1 for *_, diff in streamed)
    assert {value for _, key, value, _, _ in streamed if key.endswith("-04")} == {"qty=5"}
    assert len(out["snapshot"]) == 15
    # A second run: the sink has nothing new, the listen nothing new either.
    again = module.run_pipeline(spark, tmp_path)
    assert again["streamed"] == [] and len(again["snapshot"]) == 15
