"""DuckDB is the oracle: for every query, ``W @ x`` equals DuckDB's exact answer to the same SQL.

The Adult data set is loaded into an in-memory DuckDB. Three tables/policies are queried:

- ``adult``: every column the queries use is declared, every categorical value is listed;
- ``adult_nulls``: a copy in which ``age``, ``sex``, ``workclass`` and ``hours_per_week`` are
  set to NULL deterministically (by ``fnlwgt`` modulo a prime); those columns are declared
  ``nullable = true``, so SQL three-valued logic is exercised;
- ``adult_other``: a view of ``adult`` whose policy declares ``workclass`` WITHOUT ``'?'`` and
  ``'Never-worked'`` (they fall in the undeclared ``other`` unit).

dpsql compiles each statement to ``W`` over cells, the engine counts ``x`` with one GROUP BY,
and every row of ``W @ x`` is compared with DuckDB's own GROUP BY result (with
``GROUPING(...)`` to tell a rolled-up NULL from a real NULL). DuckDB groups that dpsql does not
return (undeclared values) are ignored; dpsql groups missing from DuckDB's result must be 0.

A last group of cases checks the documented *out-of-domain* rules (clamping, step grid, NULL
in a column not declared nullable) against DuckDB on a view that applies those rules by hand.
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path

import duckdb
import numpy as np
import pytest
import sqlglot
from sqlglot import exp


from dpsql.engines import duckdb as data_engine
from dpsql.workload.categorical import CategoricalDomain
from dpsql.workload.ordered import IntegerDomain, NumericDomain
from dpsql.errors import UnsupportedQueryError
from dpsql.policy.policy import table_policy_from_spec
from dpsql.sql.compile import compile_workload
from dpsql.sql.parse import parse_batch
from ..conftest import adult_csv
from .statements import statements

ADULT_CSV = Path(os.environ.get("DPSQL_ADULT_CSV", adult_csv()))

# --------------------------------------------------------------------------- policies
# Value lists read once from adult.csv and hard-coded (a policy is never inferred from data).

SEX = ["Female", "Male"]
RACE = ["Amer-Indian-Eskimo", "Asian-Pac-Islander", "Black", "Other", "White"]
WORKCLASS = ["?", "Federal-gov", "Local-gov", "Never-worked", "Private", "Self-emp-inc",
             "Self-emp-not-inc", "State-gov", "Without-pay"]
EDUCATION = ["10th", "11th", "12th", "1st-4th", "5th-6th", "7th-8th", "9th", "Assoc-acdm",
             "Assoc-voc", "Bachelors", "Doctorate", "HS-grad", "Masters", "Preschool",
             "Prof-school", "Some-college"]
MARITAL = ["Divorced", "Married-AF-spouse", "Married-civ-spouse", "Married-spouse-absent",
           "Never-married", "Separated", "Widowed"]
INCOME = ["<=50K", ">50K"]
HOURS_EDGES = [0, 10, 20, 30, 40, 50, 60, 80, 100]


def _columns(nullable: frozenset = frozenset(), workclass=WORKCLASS) -> dict:
    def n(col):
        return {"nullable": True} if col in nullable else {}

    return {
        "age": {"type": "integer", "min": 17, "max": 90, **n("age")},
        "workclass": {"type": "categorical", "values": list(workclass), **n("workclass")},
        "education": {"type": "categorical", "values": EDUCATION},
        "education_num": {"type": "integer", "min": 1, "max": 16},
        "marital_status": {"type": "categorical", "values": MARITAL},
        "race": {"type": "categorical", "values": RACE},
        "sex": {"type": "categorical", "values": SEX, **n("sex")},
        "hours_per_week": {"type": "numeric", "min": 0, "max": 100, "edges": HOURS_EDGES,
                           **n("hours_per_week")},
        "income": {"type": "categorical", "values": INCOME},
    }


NULLED = frozenset({"age", "sex", "workclass", "hours_per_week"})

POLICIES = {
    "adult": table_policy_from_spec("adult", {
        "epsilon": 1, "delta": 0, "columns": _columns()}),
    "adult_nulls": table_policy_from_spec("adult_nulls", {
        "epsilon": 1, "delta": 0, "columns": _columns(NULLED)}),
    # workclass declared WITHOUT '?' and 'Never-worked': those rows fall in 'other';
    # education_num declared as an integer-valued categorical with only some of its values
    "adult_other": table_policy_from_spec("adult_other", {
        "epsilon": 1, "delta": 0,
        "columns": {
            **_columns(workclass=[w for w in WORKCLASS if w not in ("?", "Never-worked")]),
            "education_num": {"type": "categorical", "values": [9, 10, 13, 14, 16]},
        },
    }),
    # out-of-domain rules: age clamped to [20, 64] on a step-5 grid; sex and hours_per_week
    # NOT nullable although the data (adult_nulls) holds NULLs; data read from adult_nulls
    "adult_ood": table_policy_from_spec("adult_ood", {
        "epsilon": 1, "delta": 0,
        "columns": {
            "age": {"type": "integer", "min": 20, "max": 64, "step": 5},
            "workclass": {"type": "categorical", "values": WORKCLASS, "nullable": True},
            "sex": {"type": "categorical", "values": SEX},
            "hours_per_week": {"type": "numeric", "min": 25, "max": 60,
                               "edges": [25, 40, 45, 60]},
            "income": {"type": "categorical", "values": INCOME},
        },
    }),
}

#: which table holds the raw rows dpsql counts for a policy (default: the policy's own table)
DATA_TABLE = {"adult_ood": "adult_nulls"}


@pytest.fixture(scope="module")
def con():
    if not ADULT_CSV.is_file():
        pytest.skip(f"Adult data not found at {ADULT_CSV}")
    c = duckdb.connect(":memory:")
    path = str(ADULT_CSV).replace("'", "''")
    c.execute(f"CREATE TABLE adult AS SELECT * FROM read_csv('{path}')")
    c.execute("""
        CREATE TABLE adult_nulls AS SELECT * REPLACE (
            CASE WHEN fnlwgt % 7 = 0 THEN NULL ELSE age END AS age,
            CASE WHEN fnlwgt % 11 = 0 THEN NULL ELSE sex END AS sex,
            CASE WHEN fnlwgt % 13 = 0 THEN NULL ELSE workclass END AS workclass,
            CASE WHEN fnlwgt % 5 = 0 THEN NULL ELSE hours_per_week END AS hours_per_week
        ) FROM adult""")
    c.execute("CREATE VIEW adult_other AS SELECT * FROM adult")
    # the out-of-domain rules of dpsql/workload/domain.py, applied by hand for the oracle
    c.execute("""
        CREATE VIEW adult_ood AS SELECT * REPLACE (
            20 + 5 * CAST(floor((least(greatest(coalesce(age, 20), 20), 64) - 20) / 5)
                          AS BIGINT) AS age,
            coalesce(sex, '~undeclared~') AS sex,
            least(greatest(coalesce(hours_per_week, 25), 25), 60) AS hours_per_week
        ) FROM adult_nulls""")
    # sanity: the data really is what the policies assume
    assert c.execute("SELECT count(*) FROM adult").fetchone()[0] == 32561
    assert c.execute("SELECT count(*) FROM adult_nulls WHERE age IS NULL").fetchone()[0] > 0
    yield c
    c.close()


def resolve(name, node):
    if name not in POLICIES:
        from dpsql.sql.refusals import _position
        line, col = _position(node)
        raise UnsupportedQueryError(f"table {name!r} is not a protected table", line, col)
    return POLICIES[name]


def compile_sql(sql):
    queries = parse_batch(sql, resolve)
    policy = POLICIES[queries[0].table]
    return policy, queries, compile_workload(queries, policy)


def answers(con, sql):
    """Compile ``sql`` and return (policy, workload, W @ x)."""
    policy, _, workload = compile_sql(sql)
    columns = [(p.column, policy.column(p.column), p.unit_to_part)
               for p in workload.partitions]
    x = data_engine.data_vector(con, DATA_TABLE.get(policy.table, policy.table), columns,
                           workload.n_cells)
    assert x.shape == (workload.n_cells,)
    assert x.sum() == 32561  # every row lands in exactly one cell
    return policy, workload, workload.W @ x


# --------------------------------------------------------------------------- the oracle

_UNDECLARED = object()


def _group_key(domain, value):
    """The dpsql group key of a raw (already DuckDB-grouped) value, or _UNDECLARED."""
    if value is None:
        return None if domain.nullable else _UNDECLARED  # (none of our cases hit the latter)
    if isinstance(domain, CategoricalDomain):
        return value if value in domain.values else _UNDECLARED
    if isinstance(domain, IntegerDomain):
        v = min(max(value, domain.min), domain.max)
        return domain.min + (v - domain.min) // domain.step * domain.step
    if isinstance(domain, NumericDomain):
        i = bisect.bisect_right(domain.edges, value) - 1
        return float(domain.edges[min(max(i, 0), len(domain.edges) - 2)])
    raise AssertionError(domain)


def oracle(con, policy, output) -> dict:
    """DuckDB's exact answer to ``output.query``: {(keys, grouping id): count}.

    The statement is DuckDB's own GROUP BY / WHERE / COUNT; only the select list is rebuilt
    as (key columns, GROUPING(key columns), the COUNT) so that rows can be matched.
    """
    tree = sqlglot.parse_one(output.query.sql, dialect="duckdb")
    select = tree.args["expression"] if isinstance(tree, exp.Create) else tree
    count = next(e.this if isinstance(e, exp.Alias) else e for e in select.expressions
                 if isinstance(e.this if isinstance(e, exp.Alias) else e, exp.Count))
    keys = list(output.key_sources)
    items = [exp.column(k).as_(f"__k{i}") for i, k in enumerate(keys)]
    several_sets = output.grouping_ids is not None
    if several_sets:
        items.append(exp.Anonymous(this="GROUPING",
                                   expressions=[exp.column(k) for k in keys]).as_("__gid"))
    items.append(count.copy().as_("__n"))
    select = select.copy()
    select.set("expressions", items)
    rows = con.execute(select.sql(dialect="duckdb")).fetchall()
    out: dict = {}
    for row in rows:
        raw, gid, n = row[:len(keys)], (row[len(keys)] if several_sets else 0), row[-1]
        key = []
        for i, (k, v) in enumerate(zip(keys, raw)):
            rolled = bool(gid >> (len(keys) - 1 - i) & 1)
            key.append(None if rolled else _group_key(policy.column(k), v))
        if any(k is _UNDECLARED for k in key):
            continue  # dpsql returns declared groups only
        out[(tuple(key), gid)] = out.get((tuple(key), gid), 0) + n
    return out


def check_against_oracle(con, sql):
    policy, workload, wx = answers(con, sql)
    assert len(workload.outputs) >= 1
    for output in workload.outputs:
        expected = oracle(con, policy, output)
        gids = output.grouping_ids or [0] * (output.stop - output.start)
        assert len(output.keys) == len(gids) == output.stop - output.start
        got = {}
        for row, key, gid in zip(range(output.start, output.stop), output.keys, gids):
            assert (tuple(key), gid) not in got, f"duplicate group {key} / {gid}"
            got[(tuple(key), gid)] = wx[row]
        # every declared group dpsql returns matches DuckDB (0 when DuckDB has no such row)
        for k, v in got.items():
            assert v == expected.get(k, 0), f"{output.query.sql}: group {k}: {v} != " \
                                            f"{expected.get(k, 0)}"
        # every declared group DuckDB returns is among dpsql's groups
        missing = set(expected) - set(got)
        assert not missing, f"{output.query.sql}: groups missing from dpsql: {missing}"
    # W is a 0/1 matrix
    assert set(np.unique(workload.W.data)) <= {1.0}
    return workload


# --------------------------------------------------------------------------- cases

#: the accepted statements, one entry each in tests/sql/fixtures/adult_accept.sql (group
#: `oracle`, with the section headings that were comments here)
CASES = statements("adult_accept.sql", "accept", "oracle")


def _case_id(sql: str) -> str:
    return sql.replace("SELECT ", "").replace("COUNT(*) ", "")[:70]


@pytest.mark.parametrize("sql", CASES, ids=[_case_id(s) for s in CASES])
def test_matches_duckdb(con, sql):
    check_against_oracle(con, sql)


def test_case_count():
    assert len(CASES) >= 35


@pytest.mark.parametrize("table", ["adult", "adult_nulls", "adult_other", "adult_ood"])
def test_whole_batch_matches_duckdb(con, table):
    """All cases of a table compiled as one batch (finer shared cells) still agree."""
    sqls = [s for s in CASES if f" FROM {table} " in s + " " and ";" not in s]
    # keep the product of the parts under the cell limit: batches over few columns
    for start in range(0, len(sqls), 6):
        check_against_oracle(con, ";\n".join(sqls[start:start + 6]))


# --------------------------------------------------------------------------- coarsest cells


@pytest.mark.parametrize("sql, shape", [
    ("SELECT COUNT(*) FROM adult", ()),
    ("SELECT COUNT(*) FROM adult WHERE age < 30", (2,)),
    ("SELECT COUNT(*) FROM adult WHERE age BETWEEN 30 AND 39", (2,)),
    ("SELECT COUNT(*) FROM adult WHERE age BETWEEN 30 AND 39 OR age >= 60", (2,)),
    ("SELECT COUNT(*) FROM adult WHERE sex = 'Male'", (2,)),
    ("SELECT COUNT(*) FROM adult WHERE hours_per_week >= 40", (2,)),
    ("SELECT COUNT(*) FROM adult WHERE TRUE", ()),
    # nullable: NULL is UNKNOWN for the comparison; at the top level UNKNOWN and FALSE both
    # leave a row out, so NULL joins the FALSE part; under NOT they differ
    ("SELECT COUNT(*) FROM adult_nulls WHERE age < 30", (2,)),
    ("SELECT COUNT(*) FROM adult_nulls WHERE NOT (age < 30 AND sex = 'Male')", (3, 3)),
    ("SELECT COUNT(age) FROM adult_nulls", (2,)),
    # GROUP BY: one part per declared group, plus 'other' (in no group)
    ("SELECT sex, COUNT(*) FROM adult GROUP BY sex", (3,)),
    ("SELECT sex, COUNT(*) FROM adult_nulls GROUP BY sex", (4,)),
    ("SELECT sex, COUNT(*) FROM adult WHERE age < 30 GROUP BY sex", (2, 3)),
    # an integer GROUP BY has exactly one part per value
    ("SELECT education_num, COUNT(*) FROM adult GROUP BY education_num", (16,)),
    # a batch: parts are the common refinement of every statement's conditions
    ("SELECT COUNT(*) FROM adult WHERE age < 30; SELECT COUNT(*) FROM adult WHERE age < 50",
     (3,)),
])
def test_coarsest_cells(con, sql, shape):
    _, _, workload = compile_sql(sql)
    assert workload.shape == shape
    assert workload.n_cells == int(np.prod(shape, dtype=np.int64))


def test_unused_columns_are_summed_out():
    _, _, workload = compile_sql(
        "SELECT COUNT(*) FROM adult WHERE age < 30 AND sex = 'Male'")
    assert [p.column for p in workload.partitions] == ["age", "sex"]  # policy order
    # cells in C order, first used column slowest: (age<30, F), (age<30, M), (>=30, F), ...
    assert workload.W.toarray().tolist() == [[0, 1, 0, 0]]
