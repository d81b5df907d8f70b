"""A real cluster: ``dpsql run --spark-master local-cluster[2,1,1024]`` answers a batch
through a Spark master and two workers, each running its own executor process, and stops
them when it exits.

Passing means: the command exits 0 with the batch released (answers within six reported
standard errors of DuckDB's exact counts on the same rows, at ε = 50), two executor
processes (separate JVMs, started by the workers) ran under it, and none is left once it
has exited. The cluster is started from the installed ``pyspark`` in a process of its own
(a process holds one Spark context, and the test run's shared one is local).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

import dpsql

from ..conftest import ADULT_POLICY, SPARK_PARTITIONS, raw_adult_file

pytestmark = pytest.mark.spark      # in the default run and CI; skip locally with -m 'not spark'

#: how ``pyspark`` launches the run's driver JVM (``spark-submit``): the shuffle's partition
#: count of the test session (tests/conftest.py), and, for the driver (which hosts the master
#: and the workers) and the executors, the JIT's first tier only and the serial collector,
#: as the Spark Connect test's server has: on a few thousand rows the JIT's warm-up is most
#: of the work (the batch's run took about half as long, 29-36 s instead of 57-90 s)
JVM_FLAGS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SUBMIT_ARGS = (f"--conf spark.sql.shuffle.partitions={SPARK_PARTITIONS} "
               f"--driver-java-options '{JVM_FLAGS}' "
               f"--conf 'spark.executor.extraJavaOptions={JVM_FLAGS}' pyspark-shell")
BATCH = "SELECT sex, COUNT(*) FROM adult GROUP BY sex;\n" \
        "SELECT race, income, COUNT(*) FROM adult WHERE age >= 40 GROUP BY race, income;\n"


def _descendants(root: int) -> dict[int, str]:
    """Live processes below ``root``: pid -> command line."""
    parents, commands = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1]
                                           .split()[1])
            commands[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ") \
                .decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
    found, todo = {}, [root]
    while todo:
        pid = todo.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found[child] = commands.get(child, "")
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_local_cluster_answers_a_batch_and_stops(spark_session, tmp_path):
    con = duckdb.connect(raw_adult_file(), read_only=True)
    con.execute(f"COPY adult TO '{tmp_path / 'adult.parquet'}' (FORMAT parquet)")
    truth = {sql: {tuple(r[:-1]): r[-1] for r in con.execute(sql).fetchall()}
             for sql in BATCH.strip().split(";\n") if sql}
    con.close()
    path = str(tmp_path / "control.duckdb")
    with dpsql.connect(path, create=True, spark=spark_session) as db:   # protect: schema only
        db.protect("adult", dict(ADULT_POLICY, epsilon=100, delta=0.5, source={
            "engine": "spark", "path": str(tmp_path / "adult.parquet")}))
    (tmp_path / "batch.sql").write_text(BATCH)
    cli = [sys.executable, "-m", "dpsql", "run", path, str(tmp_path / "batch.sql"),
           "--epsilon", "50", "--delta", "1e-6", "--json",
           "--spark-master", "local-cluster[2,1,1024]"]
    # two shuffle partitions, as the shared test session has: dpsql runs its queries with
    # adaptive execution off, so Spark's default of 200 would make the GROUPING SETS query
    # 400 tasks (about a minute on two 1-core executors) where 4 do the same
    proc = subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2]),
                                     PYSPARK_SUBMIT_ARGS=SUBMIT_ARGS))
    executors: set[int] = set()
    while proc.poll() is None:
        executors |= {pid for pid, cmd in _descendants(proc.pid).items()
                      if "CoarseGrainedExecutorBackend" in cmd}
        time.sleep(0.5)
    out, err = proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    assert len(executors) >= 2, executors          # two workers, an executor each
    # an executor exits once its driver is gone (no deadline: a leftover one hangs the test
    # rather than passing it, and a loaded machine only makes it slower)
    while any(_alive(pid) for pid in executors):
        time.sleep(0.5)
    doc = json.loads(out)
    assert [w["status"] for w in doc["workloads"]] == ["released"]
    for sql, table in zip(truth, doc["workloads"][0]["tables"]):
        for row in table["rows"]:
            keys = tuple(row[c] for c in table["columns"][:-4])
            want = truth[sql].get(keys, 0)
            assert abs(row[table["columns"][-4]] - want) < 6 * row["stderr"], (sql, row)
