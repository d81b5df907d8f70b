"""Every internal table of dpsql, its schema version, and the migrations between versions.

dpsql keeps its own tables in the database's ``dpsql`` schema, beside the analyst's data:

- ``dpsql.policies``, ``dpsql.ledger``, ``dpsql.release_tables``: policies, charges and the
  result tables they paid for (:mod:`dpsql.store.ledger`);
- ``dpsql.measurements``: every matrix-mechanism release's noisy measurements (a wide
  batch's as one piece per clique measurement, ``pieces``), for free answers later
  (:mod:`dpsql.mechanisms.reuse.records`);
- ``dpsql.strategy_cache``, ``dpsql.selection_cache``, ``dpsql.solver_cache``,
  ``dpsql.halfwidth_cache``: public, re-verified caches (:mod:`dpsql.store.strategy_cache`,
  :mod:`dpsql.store.selection_cache`);
- ``dpsql_results.answers_<types>``: every release's answers, in tables shared by all
  releases, one per tuple of column types (rows keyed by ``_release``, ``_t``, ``_r``); the
  result tables in ``main`` are views over them (:func:`dpsql.store.database.write_tables`,
  which creates each on first use; releases of dpsql before 2026-11-29 wrote
  ``dpsql_results.r<release>_<k>``, one per release and layout, still read through their
  views);
- ``dpsql.schema_version``: one row per migration applied (``version``, the ``dpsql_version``
  that applied it, ``applied_at``); the database's schema version is the largest ``version``.

This module is the only place that creates or alters them.

Versions. :data:`MIGRATIONS` is an ordered list; migration ``k`` turns a database at version
``k - 1`` into one at version ``k``, and :data:`SCHEMA_VERSION` is the last one's number.
Version 0 is a database without ``dpsql.schema_version``: one written by dpsql at commit
5a7e430 or earlier, whose tables were created piecemeal (``CREATE TABLE IF NOT EXISTS`` and
``ALTER TABLE ... ADD COLUMN IF NOT EXISTS`` spread over several modules), so any subset of
the tables may exist, some without later columns. Migration 1 creates whatever is missing
and adds the columns older releases lacked, which brings every such database (and an empty
one) to the same version-1 schema. A new database is built by the same migrations, from 0:
there is one definition of the schema, not a second copy that could drift from it.

Opening a database (:meth:`dpsql.store.database.Database.connect`) calls :func:`check`:

- no ``dpsql`` tables at all: nothing to do (they are created by the first write,
  :func:`ensure`, e.g. ``protect``);
- an older version (or none): every pending migration runs, in order, and each is stamped
  in ``dpsql.schema_version``, all inside one transaction: a failure (or Ctrl-C) rolls the
  whole upgrade back and leaves the database as it was;
- the current version: one cheap read, nothing else;
- a newer version: :class:`~dpsql.errors.SchemaVersionError`, before anything is written.
  That database was written by a newer dpsql, whose tables this one may misread (a ledger
  column it does not know could hold charges it would not count): upgrade dpsql.

Changing the schema (a new ledger column, a policy field, a cache table): append a
:class:`Migration` with the next number and the statements that take the previous version
to the new one, and say why. Never edit a migration that has been released: databases in
the field were built by it. The statements run inside the upgrade's transaction; DuckDB
DDL is transactional. ``tests/test_schema_migration.py`` opens a database written by the
released 5a7e430 (``tests/fixtures/``) with every migration.

The caches' tolerance is unchanged: a cache row that does not decode or fit is ignored and
overwritten; the migration never reads or rewrites cached values.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

import duckdb

from dpsql.errors import EngineError, SchemaVersionError


@dataclass(frozen=True)
class Migration:
    """Statements that take the schema from ``version - 1`` to ``version``."""

    version: int
    why: str
    statements: tuple


# Version 1: the tables as dpsql 5a7e430 left them. Every statement is idempotent, because a
# version-0 database may hold any subset of them, created by any earlier release.
_V1 = (
    "CREATE SCHEMA IF NOT EXISTS dpsql",
    # one row per protected table, its validated policy as JSON
    """CREATE TABLE IF NOT EXISTS dpsql.policies (
        table_name VARCHAR PRIMARY KEY,
        policy VARCHAR NOT NULL,
        created_at TIMESTAMP NOT NULL DEFAULT current_timestamp)""",
    # a new value each time the owner (re-)protects the table: past releases' measurements
    # are reused only within one epoch (after reloading the data, protect(replace=True))
    "ALTER TABLE dpsql.policies ADD COLUMN IF NOT EXISTS data_epoch VARCHAR",
    # one row per charge (exact ε and δ as num/den text; the DOUBLEs are for reading)
    """CREATE TABLE IF NOT EXISTS dpsql.ledger (
        release_id BIGINT PRIMARY KEY,
        created_at TIMESTAMP NOT NULL DEFAULT current_timestamp,
        table_name VARCHAR NOT NULL,
        epsilon DOUBLE NOT NULL,
        delta DOUBLE NOT NULL,
        epsilon_exact VARCHAR NOT NULL,
        delta_exact VARCHAR NOT NULL,
        rho DOUBLE,
        mechanism VARCHAR NOT NULL,
        strategy VARCHAR NOT NULL,
        calibration VARCHAR,
        sigma DOUBLE,
        sensitivity DOUBLE,
        n_queries BIGINT NOT NULL,
        n_cells BIGINT NOT NULL,
        expected_rmse DOUBLE,
        sql_text VARCHAR NOT NULL,
        result_tables VARCHAR[],
        private BOOLEAN NOT NULL,
        status VARCHAR NOT NULL,
        release_name VARCHAR UNIQUE,
        bound_ratio DOUBLE)""",
    # columns later releases added to the ledger, in the order they came
    "ALTER TABLE dpsql.ledger ADD COLUMN IF NOT EXISTS metric_epsilon DOUBLE",
    "ALTER TABLE dpsql.ledger ADD COLUMN IF NOT EXISTS metric_epsilon_exact VARCHAR",
    "ALTER TABLE dpsql.ledger ADD COLUMN IF NOT EXISTS request VARCHAR",
    "ALTER TABLE dpsql.ledger ADD COLUMN IF NOT EXISTS reused_from VARCHAR",
    """CREATE TABLE IF NOT EXISTS dpsql.release_tables (
        release_id BIGINT NOT NULL,
        statement_index INTEGER NOT NULL,
        table_name VARCHAR NOT NULL,
        sql_text VARCHAR NOT NULL,
        n_rows BIGINT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS dpsql.measurements (
        release_id BIGINT PRIMARY KEY,
        table_name VARCHAR NOT NULL,
        domain_fingerprint VARCHAR NOT NULL,
        private BOOLEAN NOT NULL,
        partitions VARCHAR NOT NULL,
        noise VARCHAR NOT NULL,
        scale DOUBLE NOT NULL,
        strategy BLOB NOT NULL,
        y BLOB NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS dpsql.strategy_cache (
        fingerprint VARCHAR PRIMARY KEY,
        strategy VARCHAR NOT NULL,
        n BIGINT NOT NULL,
        rows BIGINT NOT NULL,
        matrix BLOB NOT NULL,
        notes VARCHAR NOT NULL,
        seconds DOUBLE NOT NULL,
        created_at TIMESTAMP NOT NULL DEFAULT current_timestamp)""",
    # sparse plans (CSR); caches of dense plans only gain the columns, NULL for their rows
    "ALTER TABLE dpsql.strategy_cache ADD COLUMN IF NOT EXISTS indptr BLOB",
    "ALTER TABLE dpsql.strategy_cache ADD COLUMN IF NOT EXISTS indices BLOB",
    """CREATE TABLE IF NOT EXISTS dpsql.selection_cache (
        key VARCHAR PRIMARY KEY,
        workload_hash VARCHAR NOT NULL,
        n_queries BIGINT NOT NULL,
        n_cells BIGINT NOT NULL,
        svdb DOUBLE NOT NULL,
        candidates VARCHAR NOT NULL,
        factors BLOB NOT NULL,
        created_at TIMESTAMP NOT NULL DEFAULT current_timestamp)""",
    """CREATE TABLE IF NOT EXISTS dpsql.solver_cache (
        solver_key VARCHAR PRIMARY KEY,
        n BIGINT NOT NULL,
        factor BLOB NOT NULL,
        created_at TIMESTAMP NOT NULL DEFAULT current_timestamp)""",
    """CREATE TABLE IF NOT EXISTS dpsql.halfwidth_cache (
        key VARCHAR PRIMARY KEY,
        n_queries BIGINT NOT NULL,
        units BLOB NOT NULL,
        created_at TIMESTAMP NOT NULL DEFAULT current_timestamp)""",
    """CREATE TABLE IF NOT EXISTS dpsql.schema_version (
        version INTEGER NOT NULL,
        dpsql_version VARCHAR NOT NULL,
        applied_at TIMESTAMP NOT NULL DEFAULT current_timestamp)""",
)

# Version 5: the large BLOBs of the plan caches are stored uncompressed. DuckDB 2 compresses
# a BLOB column with ZSTD at checkpoint: closing the connection after a cold explain at
# n = 1,024 (a 4 MB plan and an 8 MB Cholesky factor) cost ~0.12 s of CPU instead of
# ~0.03 s, to save 30-50% of their size on disk (plan 4.2 -> 2.9 MB, factor 8.4 -> 4.2 MB).
# DuckDB 1.4 stores BLOBs uncompressed anyway and accepts the clause. A column's compression
# cannot be changed in place: each table is rebuilt with the same columns, in the same
# order, and its rows copied (cached values are moved, never read or rewritten).
_UNCOMPRESSED = "BLOB USING COMPRESSION uncompressed"
_V5 = (
    f"""CREATE TABLE dpsql.strategy_cache_v5 (
        fingerprint VARCHAR PRIMARY KEY,
        strategy VARCHAR NOT NULL,
        n BIGINT NOT NULL,
        rows BIGINT NOT NULL,
        matrix {_UNCOMPRESSED} NOT NULL,
        notes VARCHAR NOT NULL,
        seconds DOUBLE NOT NULL,
        created_at TIMESTAMP NOT NULL DEFAULT current_timestamp,
        indptr {_UNCOMPRESSED},
        indices {_UNCOMPRESSED})""",
    "INSERT INTO dpsql.strategy_cache_v5 SELECT fingerprint, strategy, n, rows, matrix, "
    "notes, seconds, created_at, indptr, indices FROM dpsql.strategy_cache",
    "DROP TABLE dpsql.strategy_cache",
    "ALTER TABLE dpsql.strategy_cache_v5 RENAME TO strategy_cache",
    f"""CREATE TABLE dpsql.solver_cache_v5 (
        solver_key VARCHAR PRIMARY KEY,
        n BIGINT NOT NULL,
        factor {_UNCOMPRESSED} NOT NULL,
        created_at TIMESTAMP NOT NULL DEFAULT current_timestamp)""",
    "INSERT INTO dpsql.solver_cache_v5 SELECT solver_key, n, factor, created_at "
    "FROM dpsql.solver_cache",
    "DROP TABLE dpsql.solver_cache",
    "ALTER TABLE dpsql.solver_cache_v5 RENAME TO solver_cache",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "one versioned schema: every internal table and the columns that earlier "
                 "releases added one ALTER at a time (databases of 5a7e430 and before)", _V1),
    Migration(2, "user-level privacy (issue 20): the secret key of a table's per-unit row "
                 "selection, kept beside its policy and out of the policy's JSON (never shown)",
              ("ALTER TABLE dpsql.policies ADD COLUMN IF NOT EXISTS unit_key VARCHAR",)),
    Migration(3, "result tables as views (issue 16): each release's answers are stored in "
                 "one table per column layout in the schema dpsql_results, and every result "
                 "table an analyst names is a view over its slice (24,975 base tables of one "
                 "256 KB block each took 6.3 GB and ~96 s); result tables written before stay "
                 "base tables until replaced",
              ("CREATE SCHEMA IF NOT EXISTS dpsql_results",)),
    Migration(4, "measurements of batches compiled to blocks (issue 16): one release's "
                 "clique measurements are kept as pieces, each over its own columns only "
                 "(the full product is never stored); NULL for a measurement over all the "
                 "release's cells",
              ("ALTER TABLE dpsql.measurements ADD COLUMN IF NOT EXISTS pieces VARCHAR",)),
    Migration(5, "issue 21: the plan caches' matrices and Cholesky factors are stored "
                 "uncompressed (a checkpoint's ZSTD of a new 8 MB BLOB cost a cold explain "
                 "~0.05 s of CPU per BLOB)", _V5),
)

#: the schema holding every release's answers (:func:`dpsql.store.database.write_tables`)
RESULTS_SCHEMA = "dpsql_results"

#: the schema version this dpsql writes (and the newest it reads)
SCHEMA_VERSION = MIGRATIONS[-1].version

#: every internal table at :data:`SCHEMA_VERSION`
TABLES = ("policies", "ledger", "release_tables", "measurements", "strategy_cache",
          "selection_cache", "solver_cache", "halfwidth_cache", "schema_version")


def dpsql_version() -> str:
    """The installed dpsql's version (recorded with each migration)."""
    try:
        return metadata.version("dpsql")
    except metadata.PackageNotFoundError:    # a source checkout that was never installed
        return "unknown"


def _refuse(found: int, writer: str | None, where: str) -> SchemaVersionError:
    return SchemaVersionError(
        f"database {where} has dpsql schema version {found} (written by dpsql "
        f"{writer or 'unknown'}), newer than version {SCHEMA_VERSION} that this dpsql "
        f"{dpsql_version()} reads: upgrade dpsql to open it (nothing was changed)")


def version(con) -> int | None:
    """The database's schema version: None when it has no dpsql tables at all, 0 when it
    has some but no version table (written by 5a7e430 or earlier)."""
    return _read(con)


def _read(con) -> int | None:
    try:     # max(): a fraction of a millisecond, it runs on every opening
        (found,) = con.execute("SELECT max(version) FROM dpsql.schema_version").fetchone()
    except duckdb.CatalogException:
        pass
    except duckdb.Error:
        raise EngineError("the database engine failed while reading dpsql's schema version "
                          "(details withheld)") from None
    else:     # an empty table (an upgrade that never finished) counts as version 0
        return 0 if found is None else int(found)
    try:
        (n,) = con.execute("SELECT count(*) FROM duckdb_tables() "
                           "WHERE schema_name = 'dpsql'").fetchone()
    except duckdb.Error:
        raise EngineError("the database engine failed while reading the catalog "
                          "(details withheld)") from None
    return 0 if n else None


def _writer(con, found: int) -> str | None:
    """The dpsql version that stamped schema version ``found``."""
    try:
        row = con.execute("SELECT dpsql_version FROM dpsql.schema_version WHERE version = ? "
                          "LIMIT 1", [found]).fetchone()
    except duckdb.Error:
        return None
    return None if row is None else str(row[0])


def check(con, where: str = "") -> int | None:
    """On opening a database: refuse a newer schema, migrate an older one, leave a database
    without dpsql tables alone. Returns the version it is at afterwards (None: no tables)."""
    found = _read(con)
    if found is None:
        return None
    return _upgrade(con, found, where)


def ensure(con, where: str = "") -> int:
    """Before writing dpsql's tables: create them (a new database) or migrate them, at the
    current version. Cheap when they are current (one read)."""
    found = _read(con)
    return _upgrade(con, 0 if found is None else found, where)


def _upgrade(con, found: int, where: str) -> int:
    if found == SCHEMA_VERSION:
        return found
    if found > SCHEMA_VERSION:
        raise _refuse(found, _writer(con, found), where or "this database")
    pending = [m for m in MIGRATIONS if m.version > found]
    try:
        con.execute("BEGIN TRANSACTION")
        for m in pending:
            for statement in m.statements:
                con.execute(statement)
            con.execute("INSERT INTO dpsql.schema_version (version, dpsql_version) "
                        "VALUES (?, ?)", [m.version, dpsql_version()])
        con.execute("COMMIT")
    except BaseException as exc:
        try:
            con.execute("ROLLBACK")
        except Exception:   # noqa: BLE001, S110 — the transaction may already be gone
            pass
        if isinstance(exc, duckdb.Error):
            raise EngineError(
                f"could not upgrade dpsql's tables in {where or 'this database'} from schema "
                f"version {found} to {SCHEMA_VERSION} ({type(exc).__name__}; details "
                "withheld); nothing was changed") from None
        raise
    return SCHEMA_VERSION


__all__ = ["MIGRATIONS", "RESULTS_SCHEMA", "SCHEMA_VERSION", "TABLES", "Migration", "check",
           "dpsql_version", "ensure", "version"]



def replace_row(con, table: str, row: dict) -> None:
    """``INSERT OR REPLACE`` of one row of a cache table keyed by its first column, as a
    DELETE and an INSERT. DuckDB's own INSERT OR REPLACE copies a large BLOB many times: an
    8 MB Cholesky factor took 0.55-0.75 s of CPU that way, 0.03-0.05 s this way. Outside a
    transaction the two commit separately: a crash between them loses one cache entry, which
    the next request recomputes (no transaction is opened here: DuckDB cannot tell whether
    one is open without failing, and a failed BEGIN aborts the caller's)."""
    names, values = list(row), list(row.values())
    con.execute(f"DELETE FROM {table} WHERE {names[0]} = ?", [values[0]])
    con.execute(f"INSERT INTO {table} ({', '.join(names)}) "
                f"VALUES ({', '.join('?' * len(names))})", values)
