"""One local Spark session for every Spark test (starting one costs seconds).

``local[2]``, UI off, two shuffle partitions, workers on this interpreter. Spark tests are
skipped, saying why, only where pyspark (the ``spark`` extra) or Java is missing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest


def _missing() -> str | None:
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        return f'pyspark/pyarrow not installed (pip install -e ".[spark]"): {exc}'
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java runtime (java not on PATH, JAVA_HOME unset): Spark needs Java 17+"
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    reason = _missing()
    if reason is not None:
        pytest.skip(reason)
    from slatepy.spark.session import local_session

    session = local_session("slatepy-tests")
    yield session
    session.stop()
