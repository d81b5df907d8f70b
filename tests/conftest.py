"""Shared fixtures: the Adult extract in a fresh DuckDB file, protected by a test policy."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_CSV = ROOT.parent / "shared" / "data" / "adult.csv"
PACKAGED_CSV = ROOT / "dpsql" / "data" / "adult.csv.gz"


def adult_csv() -> str:
    """The shared extract when present (developer checkouts), else the packaged copy."""
    return str(SHARED_CSV if SHARED_CSV.exists() else PACKAGED_CSV)


ADULT_POLICY = {
    "epsilon": 1.0,
    "delta": 1e-5,
    "columns": {
        "age": {"type": "integer", "min": 17, "max": 90},
        "sex": {"type": "categorical", "values": ["Female", "Male"]},
        "race": {"type": "categorical", "values": ["White", "Black", "Asian-Pac-Islander",
                                                   "Amer-Indian-Eskimo", "Other"]},
        "income": {"type": "categorical", "values": ["<=50K", ">50K"]},
        "hours_per_week": {"type": "numeric", "min": 0, "max": 100,
                           "edges": [0, 20, 40, 60, 100]},
    },
}


_RAW: dict[str, str] = {}


def raw_adult_file() -> str:
    """A DuckDB file holding only the raw ``adult`` table, built once per test process."""
    if "path" not in _RAW:
        import tempfile

        path = os.path.join(tempfile.mkdtemp(prefix="dpsql-tests-"), "raw.duckdb")
        con = duckdb.connect(path)
        con.execute("CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true)",
                    [adult_csv()])
        con.close()
        _RAW["path"] = path
    return _RAW["path"]


def make_adult_db(path: str, *, epsilon=1.0, delta=1e-5, protect=True, sampler=None,
                  reuse=True, zcdp_delta=None):
    """Create ``path`` with table ``adult``; return a dpsql session (policy applied; the
    policy's default ``zcdp_delta`` unless one is given)."""
    import shutil

    import dpsql

    shutil.copyfile(raw_adult_file(), path)
    db = dpsql.connect(path, sampler=sampler, reuse=reuse)
    if protect:
        policy = dict(ADULT_POLICY, epsilon=epsilon, delta=delta)
        if zcdp_delta is not None:
            policy["zcdp_delta"] = zcdp_delta
        db.protect("adult", policy)
    return db


@pytest.fixture
def adult_db(tmp_path):
    db = make_adult_db(str(tmp_path / "adult.duckdb"))
    yield db
    db.close()


@pytest.fixture(scope="session")
def adult_template(tmp_path_factory):
    """A protected Adult database built once; copy it for tests that spend budget."""
    path = str(tmp_path_factory.mktemp("template") / "adult.duckdb")
    make_adult_db(path, epsilon=1000.0, delta=0.5).close()
    return path


def snapshot(db) -> tuple:
    """Everything a refused request must leave untouched: ledger and table list."""
    with db.db.connect() as con:
        tables = sorted(con.execute(
            "SELECT schema_name || '.' || table_name FROM duckdb_tables()").fetchall())
    return (tuple(tuple(sorted((k, str(v)) for k, v in e.items())) for e in db.ledger()),
            tuple(tables))


# --------------------------------------------------------------------------- Spark
#: the one Spark session of a test run (every Spark test shares it: one JVM, started once)
SPARK_PARTITIONS = 2


@pytest.fixture(scope="session")
def spark_session(tmp_path_factory):
    """A local[2] Spark session with two shuffle partitions, started on first use and
    stopped at the end of the run. Skipped (saying why) without pyspark or Java."""
    import shutil

    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[test]')")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Java 17 is not installed (Debian: apt-get install openjdk-17-jre-headless)")
    from pyspark.sql import SparkSession

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    spark = (SparkSession.builder.master(f"local[{SPARK_PARTITIONS}]").appName("dpsql-tests")
             .config("spark.sql.shuffle.partitions", str(SPARK_PARTITIONS))
             .config("spark.default.parallelism", str(SPARK_PARTITIONS))
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.log.level", "OFF")
             .config("spark.sql.warehouse.dir", str(warehouse))
             .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={warehouse}")
             .getOrCreate())
    yield spark
    spark.stop()


# --------------------------------------------------------------------------- scheduling
#: the files that share the session's one Spark (``spark_session``): under ``--dist loadfile``
#: they are one work unit, so one worker starts one JVM for all of them; as separate files
#: they could land on both workers and each start its own (a clean run showed two starts,
#: 54 s and 21 s of setup at load ~8)
SPARK_SESSION_FILES = (
    "tests/engines/test_spark_cluster.py",
    "tests/engines/test_spark_equivalence.py",
    "tests/engines/test_spark_release.py",
    "tests/engines/test_spark_sums_units.py",
)


@pytest.hookimpl(optionalhook=True)   # pytest-xdist's hook: no error when it is not installed
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (the default run) with the Spark files as one unit; any other
    ``--dist`` is xdist's own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LoadFileOneSpark(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "tests/engines (spark session)" if scope in SPARK_SESSION_FILES else scope

    return LoadFileOneSpark(config, log)
