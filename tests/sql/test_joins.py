"""Joins to public tables (issue 20 item 4): the policy's checks, the allow-list's
refusals, and the rewrite: a join batch compiles to exactly the rows of the same batch
written on the key, and DuckDB's exact join answers equal ``W @ x``."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

from dpsql.errors import PolicyError, UnknownTableError, UnsupportedQueryError
from dpsql.policy.policy import TablePolicy, load_policy
from dpsql.sql.compile import compile_workload
from dpsql.sql.parse import parse_batch

LEVELS = [["HS-grad", "secondary", 12], ["Bachelors", "tertiary", 16],
          ["Masters", "tertiary", 18], ["11th", "secondary", 11], ["Preschool", "primary", 1]]


def spec(**public):
    return {"tables": {
        "t": {"epsilon": 1, "delta": 1e-6, "columns": {
            "edu": {"type": "categorical", "nullable": True, "values": [
                "HS-grad", "Bachelors", "Masters", "Doctorate", "11th", "Preschool"]},
            "sex": {"type": "categorical", "values": ["F", "M"]},
            "age": {"type": "integer", "min": 0, "max": 9}},
            "public": public or {"levels": {"key": "edu", "columns": ["edu", "level", "years"],
                                            "rows": LEVELS}}},
        "u": {"epsilon": 1, "delta": 0, "columns": {"edu": {"type": "categorical",
                                                            "values": ["HS-grad"]}}}}}


POLICIES = load_policy(spec())
POLICY = POLICIES["t"]


def parse(sql):
    def resolve(name, node):
        if name not in POLICIES:
            raise UnknownTableError(f"table {name!r} is not a protected table")
        return POLICIES[name]
    return parse_batch(sql, resolve)


# --------------------------------------------------------------------------- the policy


@pytest.mark.parametrize("public,words", [
    ({"levels": {"key": "edu", "columns": ["edu", "level"],
                 "rows": [["HS-grad", "a"], ["HS-grad", "b"]]}}, "appears twice"),
    ({"levels": {"key": "sex", "columns": ["sex", "x"], "rows": [["F", 1]]},
      "ages": {"key": "age", "columns": ["age", "band"], "rows": [[1, "young"]]}},
     "must be a categorical column"),
    ({"levels": {"key": "edu", "columns": ["edu", "level"], "rows": [["Kindergarten", "a"]]}},
     "is not a declared value of the key column"),
    ({"levels": {"key": "nope", "columns": ["edu", "level"], "rows": [["HS-grad", "a"]]}},
     "`key` must name one of its columns"),
    ({"levels": {"key": "edu", "columns": ["edu", "level"], "rows": [["HS-grad"]]}},
     "row 1 must list 2 values"),
    ({"levels": {"key": "edu", "columns": ["edu", "level"], "rows": [["HS-grad", 1],
                                                                     ["Masters", "x"]]}},
     "strings only or finite numbers only"),
    ({"levels": {"key": "edu", "columns": ["edu", "level"], "rows": [["HS-grad", True]]}},
     "strings only or finite numbers only"),
    ({"levels": {"key": "edu", "columns": ["edu", "edu"], "rows": [["HS-grad", "x"]]}},
     "listed twice"),
    ({"t": {"key": "edu", "columns": ["edu"], "rows": [["HS-grad"]]}},
     "cannot have the protected table's name"),
    ({"levels": {"key": "edu", "columns": ["edu"], "rows": [["HS-grad"]], "extra": 1}},
     "declare exactly `key`, `columns` and `rows`"),
])
def test_protect_checks_the_public_tables(public, words):
    with pytest.raises(PolicyError) as info:
        load_policy(spec(**public))
    assert words in str(info.value) and "\n" not in str(info.value)


def test_public_rows_are_stored_with_the_policy():
    again = TablePolicy.from_json(POLICY.to_json())
    assert again == POLICY and again.public_table("LEVELS").rows[0] == tuple(LEVELS[0])


def test_protect_refuses_a_bad_public_table_before_storing(tmp_path):
    import dpsql

    path = str(tmp_path / "p.duckdb")
    con = duckdb.connect(path)
    con.execute("CREATE TABLE t (edu VARCHAR, sex VARCHAR, age INTEGER)")
    con.close()
    db = dpsql.connect(path)
    bad = spec(levels={"key": "edu", "columns": ["edu", "l"], "rows": [["HS-grad", "a"],
                                                                       ["HS-grad", "b"]]})
    with pytest.raises(PolicyError):
        db.protect("t", bad["tables"]["t"])
    assert db.policies() == {}
    db.protect("t", spec()["tables"]["t"])
    assert db.policies()["t"].public == POLICY.public
    db.close()


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("sql,words", [
    ("SELECT COUNT(*) FROM t JOIN u USING (edu)", "JOIN of two protected tables"),
    ("SELECT COUNT(*) FROM t JOIN people USING (edu)", "not a public table of 't'"),
    ("SELECT COUNT(*) FROM t RIGHT JOIN levels USING (edu)", "RIGHT JOIN is not supported"),
    ("SELECT COUNT(*) FROM t FULL OUTER JOIN levels USING (edu)", "FULL JOIN"),
    ("SELECT COUNT(*) FROM t CROSS JOIN levels", "CROSS JOIN"),
    ("SELECT COUNT(*) FROM t NATURAL JOIN levels", "NATURAL JOIN"),
    ("SELECT COUNT(*) FROM t SEMI JOIN levels USING (edu)", "SEMI JOIN"),
    ("SELECT COUNT(*) FROM t, levels", "without ON or USING (a cross join)"),
    ("SELECT COUNT(*) FROM t JOIN levels ON t.edu <> levels.edu", "join on the key only"),
    ("SELECT COUNT(*) FROM t JOIN levels ON t.age = levels.years", "join on the key only"),
    ("SELECT COUNT(*) FROM t JOIN levels ON t.edu = levels.edu AND levels.years > 3",
     "put other conditions in WHERE"),
    ("SELECT COUNT(*) FROM t JOIN levels USING (level)", "write USING (edu)"),
    ("SELECT COUNT(*) FROM t JOIN levels USING (edu) JOIN levels l USING (edu)",
     "a second time"),
    ("SELECT COUNT(*) FROM t JOIN levels ON t.edu = levels.edu WHERE edu = 'x'",
     "the ambiguous column 'edu'"),
    ("SELECT COUNT(*) FROM t JOIN levels USING (edu) WHERE levels.nope = 1",
     "not a column of public table 'levels'"),
    ("SELECT COUNT(*) FROM t JOIN levels USING (edu) WHERE level = 3",
     "compares text with a number"),
    ("SELECT MEDIAN(years) FROM t JOIN levels USING (edu)", "of a public table's column"),
    ("SELECT COUNT(*) FROM t JOIN (SELECT 1) s ON t.edu = s.edu", "JOIN with SUBQUERY"),
])
def test_other_joins_are_refused_naming_the_reason(sql, words):
    with pytest.raises(UnsupportedQueryError) as info:
        parse(sql)
    assert words in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- the rewrite


EQUIVALENT = [
    ("SELECT COUNT(*) FROM t JOIN levels USING (edu)",
     "SELECT COUNT(*) FROM t WHERE edu IN ('HS-grad', 'Bachelors', 'Masters', '11th', "
     "'Preschool')"),
    ("SELECT sex, COUNT(*) FROM t JOIN levels l ON t.edu = l.edu WHERE l.years >= 12 "
     "GROUP BY sex",
     "SELECT sex, COUNT(*) FROM t WHERE edu IN ('HS-grad', 'Bachelors', 'Masters') "
     "GROUP BY sex"),
    ("SELECT level, COUNT(*) FROM t JOIN levels USING (edu) GROUP BY level",
     "SELECT COUNT(*) FROM t WHERE edu IN ('HS-grad', '11th'); "
     "SELECT COUNT(*) FROM t WHERE edu IN ('Bachelors', 'Masters'); "
     "SELECT COUNT(*) FROM t WHERE edu IN ('Preschool')"),
    ("SELECT COUNT(*) FROM t LEFT JOIN levels USING (edu) WHERE NOT (level = 'tertiary')",
     "SELECT COUNT(*) FROM t WHERE edu IN ('HS-grad', '11th', 'Preschool')"),
    ("SELECT COUNT(*) FROM t LEFT JOIN levels USING (edu) WHERE level IS NULL",
     "SELECT COUNT(*) FROM t WHERE edu NOT IN ('HS-grad', 'Bachelors', 'Masters', '11th', "
     "'Preschool') OR edu IS NULL"),
]


@pytest.mark.parametrize("joined,on_key", EQUIVALENT, ids=[e[0][:60] for e in EQUIVALENT])
def test_a_join_batch_is_the_batch_written_on_the_key(joined, on_key):
    a = compile_workload(parse(joined), POLICY)
    b = compile_workload(parse(on_key), POLICY)
    rows_a = a.W[np.concatenate([np.atleast_1d(o.rows if hasattr(o, "rows")
                                               else np.arange(o.start, o.stop))
                                 for o in a.outputs])]
    assert a.W.shape[1] == b.W.shape[1]
    assert np.array_equal(rows_a.toarray(), b.W.toarray())


def _table(con):
    con.execute("CREATE TABLE t (edu VARCHAR, sex VARCHAR, age INTEGER)")
    rng = np.random.default_rng(3)
    edus = ["HS-grad", "Bachelors", "Masters", "11th", "Doctorate", "?", None]
    rows = [(rng.choice(edus[:-1]) if rng.random() > 0.05 else None,
             str(rng.choice(["F", "M"])), int(rng.integers(0, 10))) for _ in range(500)]
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    con.execute("CREATE TABLE levels (edu VARCHAR, level VARCHAR, years INTEGER)")
    con.executemany("INSERT INTO levels VALUES (?, ?, ?)", LEVELS)


JOINED = [
    "SELECT level, sex, COUNT(*) FROM t JOIN levels USING (edu) GROUP BY level, sex",
    "SELECT sex, level, COUNT(*) FROM t LEFT JOIN levels USING (edu) "
    "WHERE years > 11 OR age < 3 GROUP BY sex, level",
    "SELECT level, COUNT(*) FROM t AS a JOIN levels AS l ON l.edu = a.edu "
    "WHERE NOT (l.years < 12) GROUP BY level",
    "SELECT COUNT(years) FROM t LEFT JOIN levels USING (edu)",
    "SELECT level, sex, COUNT(*) FROM t JOIN levels USING (edu) GROUP BY ROLLUP (level, sex)",
]


@pytest.mark.parametrize("sql", JOINED)
def test_duckdb_join_answers_equal_w_x(sql):
    """Every group DuckDB returns equals dpsql's row; dpsql's other declared groups (here
    the empty 'primary' level: no Preschool row in the data) are 0."""
    from dpsql.engines import duckdb as data_engine

    con = duckdb.connect()
    _table(con)
    w = compile_workload(parse(sql), POLICY)
    cols = [(p.column, POLICY.column(p.column), p.unit_to_part) for p in w.partitions]
    x = data_engine.data_vector(con, "t", cols, w.n_cells)
    (out,) = w.outputs
    rows = out.rows if hasattr(out, "rows") else np.arange(out.start, out.stop)
    mine = dict(zip(out.keys, np.asarray(w.W @ x).reshape(-1)[rows]))
    exact = {tuple(r[:-1]): r[-1] for r in con.execute(sql).fetchall()}
    assert set(exact) <= set(mine)
    for key, value in mine.items():
        assert value == exact.get(key, 0), key
    if "level" in out.key_columns and "LEFT" not in sql:
        at = out.key_columns.index("level")
        assert any(k[at] == "primary" for k in mine)
        assert not any(k[at] == "primary" for k in exact)
