"""Spark Connect: dpsql reads a table that lives in Spark through a Spark Connect server
(``spark_remote``, ``--spark-remote sc://host:port``), as it does through a master.

A Spark Connect server is started here from the installed ``pyspark`` (its bundled
``spark-connect`` jar), master ``local[1]``, listening on 127.0.0.1 only, once for the
module, and killed (its process group) at the end. This module uses no other Spark session:
its server is the only Spark JVM it starts.

Passing means: the server accepts connections within its deadline (else the module fails,
with the end of the server's log); through it, the data vector and 2-way marginals of the
Adult shape statements over 3,000 rows read from CSV files (every column as text) equal
DuckDB's cell for cell; a release through ``dpsql.connect(spark_remote=…)`` over the same
rows as Parquet (measurements without noise) equals the release over them kept in DuckDB;
``dpsql protect`` and ``run --spark-remote`` release a batch, in a process where the caller
already has a Connect session and a classic Spark context runs: dpsql's session is its own
(the caller's stays usable after dpsql's is stopped) and the process is not switched to
Connect mode; and no process of the server is left once the module is done.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql.engines import spark as spark_engine
from dpsql.policy.source import Source

from ..conftest import ADULT_POLICY, raw_adult_file
from ..sql.test_implicit import _NoNoise
from .support import cliques_of, columns_of, compare, parquet_source, rows_counted, to_parquet
from .test_spark_equivalence import SHAPES, _shape_compiled
from .test_spark_release import DENSE, IMPLICIT, _answers

pytestmark = pytest.mark.spark

ROWS = 3000
#: how long the server may take to listen (about 30 s on a loaded 2-core machine)
STARTUP_SECONDS = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _server_command(home: Path, port: int, work: Path) -> list[str]:
    """``spark-submit`` of the Connect server, every socket on 127.0.0.1; C1 only and the
    serial collector (the JIT's warm-up, not these few rows, is most of its time: about
    half the run time of the default flags)."""
    loopback = {"spark.connect.grpc.binding.address": "127.0.0.1",
                "spark.connect.grpc.binding.port": str(port),
                "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                "spark.ui.enabled": "false", "spark.driver.memory": "512m",
                "spark.sql.shuffle.partitions": "1",
                "spark.sql.warehouse.dir": str(work / "warehouse"),
                "spark.driver.extraJavaOptions": f"-Dderby.system.home={work} "
                "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
    conf = [a for key, value in loopback.items() for a in ("--conf", f"{key}={value}")]
    return [str(home / "bin" / "spark-submit"), "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", "local[1]",
            *conf]


def _wait_until_listening(server: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while not _listening(port):
        if server.poll() is not None or time.monotonic() > deadline:
            what = (f"exited with status {server.returncode}" if server.returncode is not None
                    else f"was not listening on 127.0.0.1:{port} after {STARTUP_SECONDS} s")
            pytest.fail(f"the Spark Connect server {what}; its log ends:\n"
                        f"{log.read_text(errors='replace')[-3000:]}")
        time.sleep(1)


def _members(group: int) -> list[int]:
    """The live processes of a process group (a zombie left to init to reap is not)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            state, _, pgrp = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) == group and state != "Z":
            found.append(int(entry.name))
    return found


def _stop(server: subprocess.Popen) -> None:
    """SIGTERM to the server's process group; SIGKILL to what is left after 60 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while _members(server.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        if _members(server.pid):
            os.killpg(server.pid, signal.SIGKILL)
    server.wait()
    assert not _members(server.pid), "the Spark Connect server's processes outlived it"


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory):
    """``sc://127.0.0.1:PORT`` of a Spark Connect server running for this module."""
    pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed "
                                  "(pip install -e '.[test]')")
    pytest.importorskip("grpc", reason="Spark Connect's client needs pyspark[connect]")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Java 17 is not installed (Debian: apt-get install openjdk-17-jre-headless)")
    home, work = Path(pyspark.__file__).parent, tmp_path_factory.mktemp("spark-connect")
    port, log = _free_port(), work / "server.log"
    env = dict(os.environ, SPARK_HOME=str(home), SPARK_CONNECT_MODE="0")
    with open(log, "wb") as out:
        server = subprocess.Popen(_server_command(home, port, work), cwd=work, env=env,
                                  stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_until_listening(server, port, log)
        yield f"sc://127.0.0.1:{port}"
    finally:
        _stop(server)


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """The first rows of Adult: a DuckDB table, and the same rows as Parquet and CSV."""
    d = tmp_path_factory.mktemp("spark-connect-rows")
    con = duckdb.connect(str(d / "rows.duckdb"))
    con.execute(f"ATTACH '{raw_adult_file()}' AS src (READ_ONLY)")
    con.execute(f"CREATE TABLE adult AS SELECT * FROM src.adult LIMIT {ROWS}")
    con.execute("DETACH src")
    to_parquet(con, "adult", str(d / "adult.parquet"))
    con.execute(f"COPY adult TO '{d / 'adult.csv'}' (FORMAT csv, HEADER)")
    yield con, {"parquet": parquet_source(str(d / "adult.parquet")),
                "csv": Source(engine="spark", path=str(d / "adult.csv"), format="csv")}
    con.close()


@pytest.fixture(scope="module")
def remote_session(connect_url):
    session, started = spark_engine.open_session(remote=connect_url)
    assert started
    yield session
    session.stop()


def test_marginals_through_connect_equal_duckdbs(rows, remote_session):
    """Read from CSV (every column as text); the release below reads Parquet."""
    con, sources = rows
    jobs = []
    for sql in SHAPES:
        policy, w = _shape_compiled(sql)
        cols = columns_of(policy, w)
        jobs.append((sql[:80], cols, cliques_of(len(cols), pairs=1)))
    assert set(rows_counted(con, "adult", jobs)) == {float(ROWS)}
    types = spark_engine.columns(remote_session, sources["csv"], "adult")
    assert {types[c] for c in ADULT_POLICY["columns"]} == {"string"}
    bad = compare(con, "adult", remote_session, sources["csv"], jobs)
    assert not bad, "\n".join(bad)


def _release(path: str, policy: dict, **spark) -> list[dict]:
    with dpsql.connect(path, create=True, sampler=_NoNoise(), **spark) as db:
        db.protect("adult", policy)
        return [a for batch in (DENSE, IMPLICIT)
                for a in _answers(db.answer(batch, epsilon=1, delta=1e-6))]


def test_a_release_through_connect_equals_duckdbs(rows, connect_url, tmp_path):
    con, sources = rows
    policy = dict(ADULT_POLICY, epsilon=100, delta=0.5)
    in_duckdb = str(tmp_path / "duck.duckdb")
    con.execute(f"ATTACH '{in_duckdb}' AS copy")
    con.execute("CREATE TABLE copy.adult AS SELECT * FROM adult")
    con.execute("DETACH copy")
    want = _release(in_duckdb, policy)
    got = _release(str(tmp_path / "control.duckdb"),
                   dict(policy, source={"engine": "spark", "path": sources["parquet"].path}),
                   spark_remote=connect_url)
    every_row = want[len(DENSE) + 1]            # race, sex, income: each row in one group
    assert abs(sum(n for n, _ in every_row.values()) - ROWS) < 1e-6
    assert got == want


def test_the_command_line_over_connect_opens_and_stops_its_own_session(
        rows, connect_url, remote_session, tmp_path, capsys, monkeypatch):
    """``dpsql protect`` / ``run --spark-remote``, in a process where the caller has a
    Connect session (``remote_session``) and a classic Spark context runs (faked: this
    module starts no second JVM): dpsql's session is its own, on the server named, and
    stopped when the command ends; the caller's stays usable, and the process stays in
    classic mode (a classic session can still be started in it)."""
    from pyspark import SparkContext
    from pyspark.sql.utils import is_remote

    from dpsql.interfaces import cli

    monkeypatch.setattr(SparkContext, "_active_spark_context", object())
    path, parquet = str(tmp_path / "control.duckdb"), rows[1]["parquet"].path
    duckdb.connect(path).close()
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[tables.adult]\nepsilon = 100\ndelta = 0.5\nsource = {{ engine = '
                      f'"spark", path = "{parquet}" }}\n'
                      '[tables.adult.columns]\n'
                      'sex = { type = "categorical", values = ["Female", "Male"] }\n')
    script = tmp_path / "report.sql"
    script.write_text("SELECT sex, COUNT(*) FROM adult GROUP BY sex;\n")
    assert cli.main(["protect", path, str(policy), "--spark-remote", connect_url]) == 0
    capsys.readouterr()
    assert cli.main(["run", path, str(script), "--epsilon", "50", "--delta", "1e-6",
                     "--spark-remote", connect_url, "--quiet"]) == 0
    assert "released" in capsys.readouterr().out
    assert remote_session.range(3).count() == 3
    assert not is_remote()
