"""SQLAlchemy dialect ``dpsql://`` for an embedded database file (entry point ``dpsql``).

    engine = sqlalchemy.create_engine("dpsql:///adult.duckdb?epsilon=0.1&delta=1e-6")
    pandas.read_sql("SELECT sex, count(*) FROM adult GROUP BY sex", engine)

A thin dialect over the DB-API driver (:mod:`dpsql.interfaces.dbapi`), in the manner of
duckdb_engine: every execute is one charged release under the URL's settings (the query
string's names are the declared settings, parsed from text by :data:`dpsql.request.declared.SETTINGS`
as a script's ``SET`` would be). The inspector is answered from public metadata only:
protected tables with their declared columns and types, and the result tables dpsql wrote.
Transactions do not exist (every release is committed before its answers are returned):
``COMMIT`` and ``ROLLBACK`` from the pool are no-ops. For a server, use SQLAlchemy's own
``postgresql+psycopg://`` URL instead (docs/server.md).
"""

from __future__ import annotations

from sqlalchemy import types as sqltypes
from sqlalchemy.engine import default

from dpsql.request.declared import CONNECTION_SETTINGS, SETTINGS
from dpsql.store.database import table_columns
from dpsql.store.ledger import entries, is_result_table

_TYPES = {"VARCHAR": sqltypes.VARCHAR, "BIGINT": sqltypes.BIGINT, "INTEGER": sqltypes.INTEGER,
          "DOUBLE": sqltypes.DOUBLE_PRECISION, "BOOLEAN": sqltypes.BOOLEAN}


class DpsqlDialect(default.DefaultDialect):
    name = "dpsql"
    driver = "dbapi"
    paramstyle = "qmark"
    supports_statement_cache = True
    supports_native_boolean = True
    supports_alter = False
    supports_sequences = False
    default_schema_name = "main"

    @classmethod
    def import_dbapi(cls):
        from dpsql.interfaces import dbapi

        return dbapi

    def create_connect_args(self, url):
        settings = {}
        for name, raw in url.query.items():
            setting = SETTINGS.get(name) or CONNECTION_SETTINGS.get(name)
            if setting is None:
                known = sorted(set(SETTINGS) | set(CONNECTION_SETTINGS))
                raise ValueError(f"unknown dpsql setting {name!r} in the URL; settings are "
                                 f"{known}")
            settings[name] = setting.parse(raw if isinstance(raw, str) else raw[-1],
                                           "script")
        return [url.database or ":memory:"], settings

    def initialize(self, connection):
        self.server_version_info = ()
        self.default_isolation_level = None

    def _get_default_schema_name(self, connection):
        return "main"

    def do_rollback(self, dbapi_connection):
        """No-op: every release was committed before its answers were returned."""

    def do_commit(self, dbapi_connection):
        """No-op, as the DB-API's commit."""

    def get_isolation_level(self, dbapi_connection):
        return None

    def do_ping(self, dbapi_connection):
        return not dbapi_connection.closed

    # ---------------------------------------------------------------- inspection
    @staticmethod
    def _session(connection):
        return connection.connection.dbapi_connection.session

    def _results(self, connection) -> dict:
        """Result tables dpsql wrote (name -> columns and types), from the catalog."""
        session = self._session(connection)
        with session.db.connect() as con:
            names = {t for e in entries(con) for t in (e["result_tables"] or [])}
            return {n: table_columns(con, n) for n in sorted(names) if is_result_table(con, n)}

    def get_table_names(self, connection, schema=None, **kw):
        return sorted(self._session(connection).policies()) + list(self._results(connection))

    def has_table(self, connection, table_name, schema=None, **kw):
        return table_name.lower() in self.get_table_names(connection, schema)

    def get_columns(self, connection, table_name, schema=None, **kw):
        from dpsql.store.database import key_sql_type

        policies = self._session(connection).policies()
        if table_name.lower() in policies:
            p = policies[table_name.lower()]
            typed = [(c, key_sql_type(p.column(c))) for c in p.column_names]
        else:
            typed = list(self._results(connection).get(table_name.lower(), {}).items())
        return [{"name": c, "type": _TYPES.get(t, sqltypes.VARCHAR)(), "nullable": True,
                 "default": None} for c, t in typed]

    def get_view_names(self, connection, schema=None, **kw):
        return []

    def get_schema_names(self, connection, **kw):
        return ["main"]

    def get_pk_constraint(self, connection, table_name, schema=None, **kw):
        return {"constrained_columns": [], "name": None}

    def get_foreign_keys(self, connection, table_name, schema=None, **kw):
        return []

    def get_indexes(self, connection, table_name, schema=None, **kw):
        return []

    def get_unique_constraints(self, connection, table_name, schema=None, **kw):
        return []

    def get_check_constraints(self, connection, table_name, schema=None, **kw):
        return []

    def get_table_comment(self, connection, table_name, schema=None, **kw):
        return {"text": None}


dialect = DpsqlDialect
