"""Issue 20 on Spark: clamped value sums (SUM/AVG) and the per-unit row cap are built once
(:mod:`dpsql.engines.query`) and give DuckDB's vectors exactly.

Passing means: on the same rows (a DuckDB table and its Parquet export), the count vector
and every bounded value's per-cell sums in whole units are identical in both engines, for
text, double and integer value columns holding hostile values (NULL, NaN, ±inf, 1e308,
unparsable text, halves of a unit, which both engines round away from zero) under several
bounds; with a per-unit cap (a NULL unit its own unit) the same rows are kept: vectors and
clique marginals identical, and no unit contributes more than ``k`` rows. A user-level table
in Spark answers a SUM/AVG batch through the whole release path with the same noise-free
measurements as the same table in DuckDB.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

import dpsql
from dpsql.engines import duckdb as duck_engine
from dpsql.engines import spark as spark_engine
from dpsql.engines.query import Cap, Sum
from dpsql.policy.policy import table_policy_from_spec
from dpsql.workload.values import ValueBound

from ..privacy.test_units import BATCH, VISITS, make_visits
from .support import parquet_source, to_parquet

pytestmark = pytest.mark.spark

KEY = "0123456789abcdef" * 4
HALF = 2.0 ** -31          # half a unit of the bounds (-1, 1): a tie for ROUND
TEXT = ["5", "-3", "150", None, "abc", "nan", "NaN", "-inf", "inf", "1e308", "-1e308", "",
        " 4 ", "1e-300", "2.5", "7.25", "1_000", "0x10", "1.5d", repr(HALF), repr(-HALF),
        repr(3 * HALF), repr(-5 * HALF)]
DOUBLES = [5.0, -3.0, 150.0, None, float("nan"), float("inf"), float("-inf"), 1e308, -1e308,
           2.5, HALF, -HALF, 3 * HALF, -5 * HALF, 0.0, -0.0, 1e-300, 9.999999]
BOUNDS = [(0, 10), (-2, 4.5), (-100, -1), (3, 1e9), (-1, 1)]
POLICY = {"epsilon": 1, "delta": 0, "columns": {
    "g": {"type": "categorical", "values": ["a", "b", "c", "d"]},
    "n": {"type": "integer", "min": 0, "max": 9}}}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """Table ``m`` (g, n, person, t text, d double, i bigint) in DuckDB and as Parquet."""
    rows = []
    for r in range(240):
        rows.append((("a", "b", "c")[r % 3], r % 7 if r % 11 else None,
                     None if r % 13 == 0 else r % 17, TEXT[r % len(TEXT)],
                     DOUBLES[r % len(DOUBLES)], (r * 7919) % 301 - 150))
    con = duckdb.connect()
    con.execute("CREATE TABLE m (g VARCHAR, n BIGINT, person BIGINT, t VARCHAR, d DOUBLE, "
                "i BIGINT)")
    con.executemany("INSERT INTO m VALUES (?, ?, ?, ?, ?, ?)", rows)
    path = to_parquet(con, "m", str(tmp_path_factory.mktemp("sums") / "m.parquet"))
    yield con, parquet_source(path)
    con.close()


def _columns():
    policy = table_policy_from_spec("m", POLICY)
    return [(c, policy.column(c), np.arange(policy.column(c).n_units)) for c in ("g", "n")]


def _sums():
    out = []
    for lo, hi in BOUNDS:
        b = ValueBound(lo, hi)
        out += [Sum(c, b.exponent, b.lo_units, b.hi_units) for c in ("t", "d", "i")]
    return out


@pytest.mark.parametrize("cap", [None, Cap("person", 2, KEY), Cap("person", 1, "f" * 64)],
                         ids=["rows", "cap2", "cap1"])
def test_value_sums_are_identical_on_both_engines(hostile, spark_session, cap):
    con, source = hostile
    cols = _columns()
    n_cells = int(np.prod([len(u) for _, _, u in cols]))
    x_d, s_d = duck_engine.data_vectors(con, "m", cols, n_cells, _sums(), cap=cap)
    x_s, s_s = spark_engine.data_vectors(spark_session, source, "m", cols, n_cells, _sums(),
                                         cap=cap)
    assert x_d.dtype == np.float64 and all(s.dtype == np.int64 for s in s_d)
    assert np.array_equal(x_d, x_s)
    for spec, a, b in zip(_sums(), s_d, s_s):
        assert np.array_equal(a, b), spec
    assert any(s.any() for s in s_d)
    if cap is None:
        assert x_d.sum() == 240
    else:                       # at most k rows per unit; NULL units all kept
        per_unit = con.execute("SELECT count(*) FROM m WHERE person IS NOT NULL "
                               "GROUP BY person").fetchall()
        nulls = con.execute("SELECT count(*) FROM m WHERE person IS NULL").fetchone()[0]
        assert x_d.sum() == sum(min(n, cap.k) for (n,) in per_unit) + nulls


def test_ties_round_away_from_zero_in_both_engines(hostile, spark_session):
    """Half a unit is a tie: both engines' ROUND go away from zero (the documented rule)."""
    con, source = hostile
    b = ValueBound(-1, 1)
    assert b.unit == HALF * 2
    spec = [Sum("d", b.exponent, b.lo_units, b.hi_units)]
    got = {}
    for name, fetch in (("duckdb", lambda: duck_engine.data_vectors(con, "m", [], 1, spec)),
                        ("spark", lambda: spark_engine.data_vectors(
                            spark_session, source, "m", [], 1, spec))):
        got[name] = int(fetch()[1][0][0])
    want = sum(_units(v, b) for (v,) in con.execute("SELECT d FROM m").fetchall())
    assert got["duckdb"] == got["spark"] == want


def _units(v, b: ValueBound) -> int:
    """The documented rule, independently of the engines: NULL 0, NaN and +inf the upper
    bound, else clamped and rounded to whole units, half away from zero."""
    if v is None:
        return 0
    if v != v:
        return b.hi_units
    x = min(max(v, float(b.lo_units * b.unit)), float(b.hi_units * b.unit)) / float(b.unit)
    r = int(abs(x) + 0.5) * (1 if x >= 0 else -1)
    return min(max(r, b.lo_units), b.hi_units)


def test_capped_marginals_are_identical_on_both_engines(hostile, spark_session):
    con, source = hostile
    cols = _columns()
    cap = Cap("person", 2, KEY)
    cliques = [(0, 1), (0,), (1,), ()]
    duck = duck_engine.marginals(con, "m", cols, cliques, cap=cap)
    spark = spark_engine.marginals(spark_session, source, "m", cols, cliques, cap=cap)
    for c in cliques:
        assert np.array_equal(duck[c], spark[c]), c
    # one read, one selection: every marginal sums to the same kept rows
    assert len({float(T.sum()) for T in duck.values()}) == 1


class _Recorded:
    """Releases the exact measurements and keeps them (tests only, non-private)."""

    private = False

    def __init__(self):
        self.seen: list = []

    def sample(self, values, sigma, *, sensitivity=None):
        self.seen.append(np.asarray(values, dtype=float).copy())
        return np.asarray(values, dtype=float), 0.0

    def laplace(self, values, scale, *, sensitivity=None, epsilon=None):
        return self.sample(values, scale)


def test_a_user_level_spark_table_releases_sums_like_duckdb(tmp_path, spark_session):
    """The whole path on a Spark source with a privacy unit: the noise-free measurements
    (the sampler's input) and the answers equal those of the same rows, same selection key,
    in DuckDB."""
    duck_noise, spark_noise = _Recorded(), _Recorded()
    duck_db, rows = make_visits(str(tmp_path / "v.duckdb"), sampler=duck_noise)
    with duck_db.db.connect() as con:
        key = con.execute("SELECT unit_key FROM dpsql.policies").fetchone()[0]
    plain = duckdb.connect()            # the same rows, as Parquet files for Spark
    plain.execute("CREATE TABLE visits (person_id INTEGER, item VARCHAR, amount DOUBLE, "
                  "day INTEGER)")
    plain.executemany("INSERT INTO visits VALUES (?, ?, ?, ?)", rows)
    parquet = to_parquet(plain, "visits", str(tmp_path / "visits.parquet"))
    plain.close()
    spark_db = dpsql.connect(str(tmp_path / "control.duckdb"), create=True,
                             spark=spark_session, sampler=spark_noise)
    spark_db.protect("visits", dict(VISITS, source={"engine": "spark", "path": parquet,
                                                    "format": "parquet"}))
    with spark_db.db.connect() as con:      # the same selection key as the DuckDB table's
        con.execute("UPDATE dpsql.policies SET unit_key = ?", [key])
    batch = [BATCH, "SELECT item, AVG(amount) FROM visits GROUP BY item"]
    try:
        answers = [[r.rows for r in db.answer(batch, epsilon=1, delta=1e-6).results]
                   for db in (duck_db, spark_db)]
    finally:
        duck_db.close()
        spark_db.close()
    assert duck_noise.seen and len(duck_noise.seen) == len(spark_noise.seen)
    for a, b in zip(duck_noise.seen, spark_noise.seen):
        assert np.array_equal(a, b)
    assert answers[0] == answers[1]
