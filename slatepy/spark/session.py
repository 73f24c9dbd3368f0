"""A local Spark session with slatepy's sources registered: what the tests, the crash-test
driver and ``bench.spark`` run on (``pip install "slatepy[spark]"``; Java 17+)."""

from __future__ import annotations

import os
import sys
from typing import Any


def local_session(app_name: str, *, cores: int = 2) -> Any:
    """``local[cores]``, UI and progress bars off, ``cores`` shuffle partitions and default
    parallelism, Python workers on this interpreter (where slatepy is installed), bound to
    127.0.0.1, logs at ERROR, slatepy's sources registered.

    ``PYSPARK_PYTHON``, ``PYSPARK_DRIVER_PYTHON`` and ``SPARK_LOCAL_IP`` are set in this
    process's environment: Spark reads them when it starts its JVM and workers.
    """
    from pyspark.sql import SparkSession

    from slatepy.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    session = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.default.parallelism", str(cores))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session
