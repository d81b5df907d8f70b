"""The Spark engine: protected tables in a Spark catalog or in files Spark reads.

Called only by :mod:`dpsql.kernel.data`. The one data-path query
(:func:`dpsql.engines.query.marginals_query`) is rendered for Spark SQL and run by the
session's executors; only its result, one row per non-empty cell of each marginal, is
collected to the driver (never a protected row), so the driver's memory grows with the
answers, not with the table. ``pyspark`` is an optional dependency (``dpsql[spark]``): it is
imported only here, when a policy names a Spark source.

Privacy settings fixed by dpsql around every query (:data:`FIXED`, restored afterwards):
ANSI mode off, so no row value can raise (a cast or an overflow yields NULL or a clamped
value, never an error whose occurrence or text depends on a row); adaptive execution off,
so no plan is re-chosen from runtime statistics of the data; identifiers case-insensitive and
string literals unescaped as the query was rendered. Every Spark failure becomes an
:class:`~dpsql.errors.EngineError` naming what was being done and the error's class, never
its text (which can quote values); the charge made before the query stands.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Iterator

import numpy as np
from sqlglot import exp

from dpsql.engines import base
from dpsql.errors import DpsqlError, EngineError, PolicyError

DIALECT = "spark"

#: session settings that matter for privacy or for reading the query as it was rendered
FIXED = {
    "spark.sql.ansi.enabled": "false",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.caseSensitive": "false",
    "spark.sql.parser.escapedStringLiterals": "false",
}
#: Spark refuses more grouping sets in one query (GROUPING_SIZE_LIMIT_EXCEEDED)
MAX_GROUPING_SETS = 4096

_MISSING = {
    "TABLE_OR_VIEW_NOT_FOUND": "Spark has no table {what}",
    "PATH_NOT_FOUND": "there are no files at {what}",
    "UNABLE_TO_INFER_SCHEMA": "Spark finds no {fmt} files to read at {what}",
}


def render(query: exp.Expression) -> str:
    """The Spark SQL text of the data-path query (the one place it is rendered)."""
    return query.sql(dialect=DIALECT)


def _condition(exc: BaseException) -> str:
    for name in ("getCondition", "getErrorClass"):
        with contextlib.suppress(Exception):
            got = getattr(exc, name)()
            if got:
                return str(got)
    return ""


def guarded(what: str, call, *args):
    """``call(*args)``, any Spark failure turned into an EngineError that withholds Spark's
    text: only the error's class and condition are kept, and the EngineError is raised
    once the handler is left, so it carries neither a cause nor a context holding the
    original (whose message can quote a row)."""
    try:
        return call(*args)
    except (KeyboardInterrupt, DpsqlError):
        raise
    except Exception as exc:
        condition = _condition(exc)
        named = f"{type(exc).__name__} {condition}" if condition else type(exc).__name__
    raise EngineError(f"Spark failed while {what} ({named}; details withheld because "
                      "engine messages can contain data values)")


@contextlib.contextmanager
def fixed_settings(spark) -> Iterator[None]:
    """:data:`FIXED` on the session for the duration of one query, then as they were."""
    before = {key: spark.conf.get(key) for key in FIXED}
    for key, value in FIXED.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            with contextlib.suppress(Exception):
                spark.conf.set(key, value)


class SparkEngine:
    """A protected table's source as the Spark session reads it: a catalog table, or a
    temporary view over its files (:mod:`dpsql.policy.source`)."""

    dialect = DIALECT
    max_grouping_sets = MAX_GROUPING_SETS

    def __init__(self, spark, source, table: str):
        self.spark, self.source, self.table = spark, source, table

    @property
    def view(self) -> str:
        key = f"{self.source.file_format}\0{self.source.path}".encode()
        return f"dpsql_{self.table}_{hashlib.sha256(key).hexdigest()[:12]}"

    def _frame(self):
        """The source as a DataFrame (its schema only is read here; CSV as text, with a
        header row, so that the types never depend on the values)."""
        if self.source.table is not None:
            return self.spark.table(self.source.table)
        reader = self.spark.read.format(self.source.file_format)
        if self.source.file_format == "csv":
            reader = reader.option("header", "true").option("inferSchema", "false")
        return reader.load(self.source.path)

    def relation(self) -> exp.Expression:
        if self.source.table is not None:
            return exp.to_table(self.source.table, dialect=DIALECT)
        guarded("reading the source's files",
                lambda: self._frame().createOrReplaceTempView(self.view))
        return exp.to_table(self.view, dialect=DIALECT)

    def columns(self) -> dict[str, str]:
        what = self.source.table or self.source.path
        try:
            frame = self._frame()
            fields = frame.schema.fields
        except Exception as exc:        # catalog and schema only: no value is read
            raise _refusal(exc, self.source, what) from None
        return {f.name.lower(): f.dataType.simpleString() for f in fields}

    def fetch(self, query: exp.Expression, what: str) -> dict[str, np.ndarray]:
        text = render(query)

        def run():
            with fixed_settings(self.spark):
                frame = self.spark.sql(text)
                # one row per non-empty cell: the answers' size, never the table's
                return list(frame.columns), frame.collect()
        names, rows = guarded(what, run)
        return {name: np.asarray([r[k] for r in rows]) if rows else np.zeros(0, np.int64)
                for k, name in enumerate(names)}


def _refusal(exc: BaseException, source, what: str) -> DpsqlError:
    """A clear error for a source Spark cannot open (names and classes only)."""
    if isinstance(exc, (KeyboardInterrupt, DpsqlError)):
        raise exc
    condition = _condition(exc)
    text = str(exc)
    if source.file_format == "delta" and source.path is not None and (
            "DATA_SOURCE_NOT_FOUND" in condition + text or "delta" in text.lower()
            and "ClassNotFound" in text):
        return EngineError(
            "the Spark session has no Delta Lake connector, needed to read "
            f"{source.label()}: pip install delta-spark and build the session with "
            "delta.configure_spark_with_delta_pip (or start Spark with --packages "
            "io.delta:delta-spark_2.13:<version>), or point the policy at Parquet files")
    for key, message in _MISSING.items():
        if key in condition:
            return PolicyError(message.format(what=what, fmt=source.file_format)
                               + "; check the policy's source")
    return EngineError(f"Spark could not open {source.label()} ({type(exc).__name__}"
                       f"{' ' + condition if condition else ''}; details withheld)")


# ------------------------------------------------------------------ the engine's calls

def columns(spark, source, table: str) -> dict[str, str]:
    """The source's column names (lower case) and Spark types: the catalog only."""
    return SparkEngine(spark, source, table).columns()


def data_vector(spark, source, table: str, columns, n_cells: int, *, cap=None,
                types=None) -> np.ndarray:
    """The cell counts ``x`` (float64) by one Spark query. Called only by the kernel."""
    return base.data_vector(SparkEngine(spark, source, table), columns, n_cells, cap=cap,
                            types=types)


def data_vectors(spark, source, table: str, columns, n_cells: int, sums=(), *, cap=None,
                 types=None) -> tuple[np.ndarray, list]:
    """The cell counts and each bounded value's exact per-cell sums by one Spark query (the
    same query as DuckDB's: :func:`dpsql.engines.base.data_vectors`). Called only by the
    kernel."""
    return base.data_vectors(SparkEngine(spark, source, table), columns, n_cells, sums,
                             cap=cap, types=types)


def marginals(spark, source, table: str, columns, cliques, *, cap=None, types=None) -> dict:
    """Each clique's marginal by one Spark query (``GROUPING SETS``; one per 4,096 cliques).
    Called only by the kernel."""
    return base.marginals(SparkEngine(spark, source, table), columns, cliques, cap=cap,
                          types=types)


# ------------------------------------------------------------------ sessions

def open_session(master: str | None = None, remote: str | None = None):
    """``(session, started)``: a Spark session for dpsql on ``master`` (``local[2]``,
    ``spark://host:7077``) or over Spark Connect at ``remote`` (``sc://host:15002``), and
    whether dpsql started it (a classic session already running in this process is used as
    it is, and left running). Logs and the console progress bar are off on a classic session
    dpsql starts (a failed task's log could quote a value); a Connect server's are its own.

    Over Spark Connect the session is always a new one, on the server named: the generic
    builder's ``getOrCreate`` would hand back any Connect session already active in the
    process, whatever its server (which dpsql would then read and stop), refuses while a
    classic Spark context runs in the process, and switches the process to Connect mode for
    good (no classic session can be built in it after)."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise EngineError("reading a Spark table needs pyspark: pip install 'dpsql[spark]'") \
            from None
    # a SparkContext already running in this process is the caller's: used, never stopped
    from pyspark import SparkContext

    running = not remote and SparkContext._active_spark_context is not None
    settings = FIXED if remote else {**FIXED, "spark.ui.showConsoleProgress": "false",
                                     "spark.log.level": "OFF"}
    try:
        if remote:
            from pyspark.sql.connect.session import SparkSession as ConnectSession

            return ConnectSession.builder.remote(remote).appName("dpsql").config(
                map=settings).create(), True
        return SparkSession.builder.master(master).appName("dpsql").config(
            map=settings).getOrCreate(), not running
    except ImportError:
        raise EngineError("Spark Connect needs its client libraries: pip install "
                          "'pyspark[connect]'") from None
    except Exception as exc:
        raise EngineError(f"could not start a Spark session at {remote or master} "
                          f"({type(exc).__name__}); check the URL, and that Java 17 is "
                          "installed (java -version)") from None
