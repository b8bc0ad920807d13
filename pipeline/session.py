"""Which Python interpreter Spark's Python workers run.

Spark starts its Python workers (the data source planner, the streaming source and sink runners,
the executors) with `python3` from PATH unless told otherwise. HareMQ's connector, and pika under
it, usually live in a virtualenv that PATH does not name, so in local mode the workers must run the
interpreter that started the driver. On a real cluster every executor needs an interpreter with
HareMQ's `spark` extra installed; point `PYSPARK_PYTHON` (or `spark.pyspark.python`) at it.
"""
from __future__ import annotations

import os
import sys


def worker_python() -> str:
    """The interpreter for Spark's Python workers: `PYSPARK_PYTHON` when set, else this one."""
    return os.environ.get("PYSPARK_PYTHON") or sys.executable


def use_this_python(builder, python: str | None = None):
    """Make a SparkSession builder start its Python workers with `python` (default: `worker_python()`).

    Sets both the environment (read when the JVM starts workers for data sources) and the
    `spark.pyspark.python` setting (read for executors), so every kind of worker agrees.
    """
    python = python or worker_python()
    os.environ["PYSPARK_PYTHON"] = python
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return builder.config("spark.pyspark.python", python)
