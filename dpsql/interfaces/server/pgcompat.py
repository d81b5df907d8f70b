"""PostgreSQL 15 catalog compatibility for the shadow catalog.

DuckDB's ``pg_catalog`` holds the main PostgreSQL catalog views with most of their
columns; clients (psql ``\\d``, SQLAlchemy's inspector, pgcli, DBeaver, Metabase) also read
columns and catalogs it lacks. :func:`install` creates schema ``pgc`` in the shadow: a view
over DuckDB's catalog with the missing columns added (constants: no row security, no
inheritance, no partitions), and an empty table for each catalog DuckDB does not have, so
those queries return the right shape with no rows. :func:`rewrite` points the catalog
names of a query at ``pgc``.
"""

from __future__ import annotations

import re

#: columns DuckDB's views lack: view -> "expression AS name, ..."
EXTRA_COLUMNS = {
    "pg_class": "false AS relforcerowsecurity",
    "pg_namespace": "",
    "pg_index": "false AS indnullsnotdistinct",
    "pg_collation": "0 AS collnamespace, 'c' AS collprovider, true AS collisdeterministic, "
                    "6 AS collencoding, 'C' AS collcollate, 'C' AS collctype",
    "pg_database": "10 AS datdba, 6 AS encoding, 'C' AS datcollate, 'C' AS datctype, "
                   "NULL::VARCHAR[] AS datacl, -1 AS datconnlimit, 0 AS dattablespace, "
                   "'c' AS datlocprovider, NULL::VARCHAR AS daticulocale",
    "pg_settings": "'' AS unit, 'user' AS context, 'default' AS source, "
                   "NULL::VARCHAR AS category",
}

#: catalogs DuckDB lacks: name -> column definitions (an empty table of that shape)
MISSING = {
    "pg_inherits": "inhrelid BIGINT, inhparent BIGINT, inhseqno INTEGER, "
                   "inhdetachpending BOOLEAN",
    "pg_policy": "oid BIGINT, polname VARCHAR, polrelid BIGINT, polcmd VARCHAR, "
                 "polpermissive BOOLEAN, polroles BIGINT[], polqual VARCHAR, "
                 "polwithcheck VARCHAR",
    "pg_statistic_ext": "oid BIGINT, stxrelid BIGINT, stxname VARCHAR, stxnamespace BIGINT, "
                        "stxowner BIGINT, stxstattarget INTEGER, stxkeys INTEGER[], "
                        "stxkind VARCHAR[], stxexprs VARCHAR",
    "pg_publication": "oid BIGINT, pubname VARCHAR, pubowner BIGINT, puballtables BOOLEAN, "
                      "pubinsert BOOLEAN, pubupdate BOOLEAN, pubdelete BOOLEAN, "
                      "pubtruncate BOOLEAN, pubviaroot BOOLEAN",
    "pg_publication_rel": "oid BIGINT, prpubid BIGINT, prrelid BIGINT, prqual VARCHAR, "
                          "prattrs INTEGER[]",
    "pg_publication_namespace": "oid BIGINT, pnpubid BIGINT, pnnspid BIGINT",
    "pg_trigger": "oid BIGINT, tgrelid BIGINT, tgparentid BIGINT, tgname VARCHAR, "
                  "tgfoid BIGINT, tgtype INTEGER, tgenabled VARCHAR, tgisinternal BOOLEAN, "
                  "tgconstrrelid BIGINT, tgconstrindid BIGINT, tgconstraint BIGINT, "
                  "tgdeferrable BOOLEAN, tginitdeferred BOOLEAN, tgnargs INTEGER",
    "pg_rewrite": "oid BIGINT, rulename VARCHAR, ev_class BIGINT, ev_type VARCHAR, "
                  "ev_enabled VARCHAR, is_instead BOOLEAN",
    "pg_foreign_table": "ftrelid BIGINT, ftserver BIGINT, ftoptions VARCHAR[]",
    "pg_partitioned_table": "partrelid BIGINT, partstrat VARCHAR, partnatts INTEGER, "
                            "partdefid BIGINT",
    "pg_roles": "oid BIGINT, rolname VARCHAR, rolsuper BOOLEAN, rolinherit BOOLEAN, "
                "rolcreaterole BOOLEAN, rolcreatedb BOOLEAN, rolcanlogin BOOLEAN, "
                "rolreplication BOOLEAN, rolconnlimit INTEGER, rolvaliduntil TIMESTAMP, "
                "rolbypassrls BOOLEAN, rolconfig VARCHAR[]",
    "pg_user": "usename VARCHAR, usesysid BIGINT, usecreatedb BOOLEAN, usesuper BOOLEAN",
    "pg_auth_members": "roleid BIGINT, member BIGINT, grantor BIGINT, admin_option BOOLEAN",
    "pg_extension": "oid BIGINT, extname VARCHAR, extowner BIGINT, extnamespace BIGINT, "
                    "extrelocatable BOOLEAN, extversion VARCHAR",
    "pg_range": "rngtypid BIGINT, rngsubtype BIGINT, rngmultitypid BIGINT",
    "pg_operator": "oid BIGINT, oprname VARCHAR, oprnamespace BIGINT, oprleft BIGINT, "
                   "oprright BIGINT, oprresult BIGINT, oprcode VARCHAR",
    "pg_language": "oid BIGINT, lanname VARCHAR",
    "pg_opclass": "oid BIGINT, opcmethod BIGINT, opcname VARCHAR, opcnamespace BIGINT, "
                  "opcdefault BOOLEAN, opcintype BIGINT",
    "pg_matviews": "schemaname VARCHAR, matviewname VARCHAR, matviewowner VARCHAR, "
                   "definition VARCHAR",
    "pg_event_trigger": "oid BIGINT, evtname VARCHAR",
    "pg_stat_activity": "datid BIGINT, datname VARCHAR, pid INTEGER, usename VARCHAR, "
                        "application_name VARCHAR, state VARCHAR, query VARCHAR",
    "pg_foreign_server": "oid BIGINT, srvname VARCHAR",
    "pg_foreign_data_wrapper": "oid BIGINT, fdwname VARCHAR",
    "pg_conversion": "oid BIGINT, conname VARCHAR",
    "pg_aggregate": "aggfnoid BIGINT, aggkind VARCHAR",
    "pg_cast": "oid BIGINT, castsource BIGINT, casttarget BIGINT",
    "pg_shdescription": "objoid BIGINT, classoid BIGINT, description VARCHAR",
    "pg_seclabel": "objoid BIGINT, classoid BIGINT, objsubid INTEGER, provider VARCHAR, "
                   "label VARCHAR",
    "pg_default_acl": "oid BIGINT, defaclrole BIGINT, defaclnamespace BIGINT",
    "pg_largeobject_metadata": "oid BIGINT, lomowner BIGINT",
}

_NAMES = sorted(set(EXTRA_COLUMNS) | set(MISSING), key=len, reverse=True)
_CATALOG = re.compile(r"(?<![\w.\"])(?:pg_catalog\s*\.\s*)?(" + "|".join(_NAMES) + r")\b",
                      re.I)


def install(con) -> None:
    """Create schema ``pgc`` with the completed catalogs in the shadow connection."""
    con.execute("CREATE SCHEMA IF NOT EXISTS pgc")
    hidden = ("WHERE relnamespace NOT IN (SELECT oid FROM pg_catalog.pg_namespace WHERE "
              "nspname IN ('pgc', 'pg_catalog', 'information_schema'))")
    for view, extra in EXTRA_COLUMNS.items():
        where = hidden if view == "pg_class" else \
            "WHERE nspname <> 'pgc'" if view == "pg_namespace" else ""
        star = "* REPLACE (NULL::VARCHAR[] AS reloptions)" if view == "pg_class" else "*"
        con.execute(f"CREATE OR REPLACE VIEW pgc.{view} AS SELECT {star}{', ' if extra else ''}"
                    f"{extra} FROM pg_catalog.{view} {where}")
    for table, columns in MISSING.items():
        con.execute(f"CREATE OR REPLACE TABLE pgc.{table} ({columns})")
    con.execute("INSERT INTO pgc.pg_roles VALUES (10, 'dpsql', false, true, false, false, "
                "true, false, -1, NULL, false, NULL)")


def rewrite(sql: str) -> str:
    """Point the catalog names that ``pgc`` completes at ``pgc``."""
    return _CATALOG.sub(lambda m: "pgc." + m.group(1).lower(), sql)
