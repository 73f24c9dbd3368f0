"""Optional dependencies: a missing extra is named in the error, not a bare ImportError."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.processes import ROOT

CHILD = textwrap.dedent(
    """
    import sys
    sys.modules["boto3"] = None  # as if slatepy were installed without the dynamodb extra
    from slatepy import InvalidArgument, Settings
    from slatepy.store import open_store
    try:
        open_store("memory://", Settings(cas="dynamodb", dynamodb_table="t"))
    except InvalidArgument as exc:
        print(exc)
    """
)


def test_two_phase_cas_without_boto3_names_the_extra() -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert 'pip install "slatepy[dynamodb]"' in child.stdout, child.stderr


def test_the_core_imports_without_boto3_or_minio() -> None:
    code = (
        "import sys; sys.modules['boto3'] = sys.modules['minio'] = None; "
        "import slatepy, slatepy.cli.main, slatepy.compactor, slatepy.gc; print('ok')"
    )
    child = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert child.stdout.strip() == "ok", child.stderr


def test_spark_sources_without_pyspark_name_the_extra() -> None:
    code = (
        "import sys; sys.modules['pyspark'] = None\n"
        "import slatepy.spark\n"
        "from slatepy import InvalidArgument\n"
        "try:\n"
        "    slatepy.spark.register(object())\n"
        "except InvalidArgument as exc:\n"
        "    print(exc)\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert 'pip install "slatepy[spark]"' in child.stdout, child.stderr
