"""Benchmark: dpsql's data-vector query against a plain GROUP BY on the same raw columns.

    python benchmarks/data_vector.py [--rows N] [--repeat R] [--file] [--threads T] [--no-verify]

Generates ``N`` rows (default 10,000,000) inside DuckDB (in memory, or with ``--file`` in a
temporary database file, compressed as real data would be), compiles a few realistic
batches through dpsql's real code path (policy -> parse -> compile ->
``data_engine.data_vector``) and times the data vector against
``SELECT <same raw columns>, count(*) FROM t GROUP BY ALL``.
Each query runs once to warm up, then ``R`` times (default 3; dpsql and plain runs are
interleaved); the table shows the best and the median, and the ratio dpsql / plain of the
best times (target: <= 2).

With verification on (the default) every data vector is also checked against an independent
reference: the plain query's raw groups mapped to cells in NumPy by the out-of-domain rules
of :mod:`dpsql.workload.domain` (clamping, step flooring, ``other``, NULL handling).

It is a benchmark, not a test: it prints PASS / FAIL and always exits 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import duckdb
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dpsql.store import database as engine

from dpsql.engines import duckdb as data_engine
from dpsql.workload.categorical import CategoricalDomain  # noqa: E402
from dpsql.workload.ordered import IntegerDomain, NumericDomain  # noqa: E402
from dpsql.policy.policy import table_policy_from_spec  # noqa: E402
from dpsql.sql.compile import compile_workload  # noqa: E402
from dpsql.sql.parse import parse_batch  # noqa: E402

TARGET_RATIO = 2.0

B_VALUES = ["red", "orange", "yellow", "green", "blue", "indigo", "violet", "black"]

POLICY_SPEC = {
    "epsilon": 1.0,
    "delta": 1e-6,
    "columns": {
        # NULLs (not nullable) clamp to min; -3..-1 and 100..105 clamp to [0, 99]
        "a": {"type": "integer", "min": 0, "max": 99},
        # 'zz', 'yy', 'xx' are undeclared -> other; NULL is its own unit
        "b": {"type": "categorical", "values": B_VALUES, "nullable": True},
        # -5.0 and 150.0 clamp to the first / last bin; NULLs (not nullable) -> min
        "c": {"type": "numeric", "min": 0, "max": 100,
              "edges": [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]},
    },
}

# (name, batch SQL, raw columns of the plain GROUP BY)
SCENARIOS = [
    ("i   group by a, b",
     "SELECT a, b, count(*) FROM t GROUP BY a, b",
     ["a", "b"]),
    ("ii  ranges on a, c",
     """
     SELECT count(*) FROM t WHERE a < 30;
     SELECT count(*) FROM t WHERE a BETWEEN 30 AND 59;
     SELECT count(*) FROM t WHERE a >= 60;
     SELECT count(*) FROM t WHERE c >= 50;
     SELECT count(*) FROM t WHERE c < 20;
     SELECT count(*) FROM t WHERE a < 30 AND c >= 50;
     """,
     ["a", "c"]),
    ("iii a, b, c",
     """
     SELECT b, c, count(*) FROM t WHERE a >= 18 GROUP BY b, c;
     SELECT a, count(*) FROM t WHERE c >= 50 GROUP BY a;
     SELECT count(*) FROM t WHERE b IS NULL OR a < 18;
     """,
     ["a", "b", "c"]),
]


def generate(con, n_rows: int) -> None:
    """``t(a INTEGER, b VARCHAR, c DOUBLE)``: about 1 % of each column is NULL or undeclared.

    Columns derive from ``hash(row number)``, so the table is the same for any thread count
    (``random()`` after ``setseed`` is reproducible only single-threaded); the seed is set
    anyway in case a column is ever drawn with ``random()``.
    """
    con.execute("SELECT setseed(0.42)")
    values = "[" + ", ".join(engine.quote_literal(v) for v in B_VALUES + ["zz", "yy", "xx"]) + "]"
    con.execute(f"""
        CREATE OR REPLACE TABLE t AS
        SELECT
          CASE WHEN ha % 1000 < 5 THEN NULL
               WHEN ha % 1000 < 8 THEN CAST(100 + (ha >> 20) % 6 AS INTEGER)
               WHEN ha % 1000 < 10 THEN CAST(-1 - (ha >> 20) % 3 AS INTEGER)
               ELSE CAST((ha >> 20) % 100 AS INTEGER) END AS a,
          CASE WHEN hb % 100 = 0 THEN NULL
               WHEN hb % 100 = 1 THEN {values}[9 + (hb >> 20) % 3]
               ELSE {values}[1 + (hb >> 20) % 8] END AS b,
          CASE WHEN hc % 1000 < 5 THEN NULL
               WHEN hc % 1000 < 7 THEN -5.0
               WHEN hc % 1000 < 10 THEN 150.0
               ELSE CAST((hc >> 20) % 201 AS DOUBLE) / 2 END AS c
        FROM (SELECT CAST(hash(3 * i + 1) >> 1 AS BIGINT) AS ha,
                     CAST(hash(3 * i + 2) >> 1 AS BIGINT) AS hb,
                     CAST(hash(3 * i + 3) >> 1 AS BIGINT) AS hc
              FROM range({int(n_rows)}) r(i))
    """)


def compile_batch(policy, sql: str):
    queries = parse_batch(sql, lambda name, node: policy)
    w = compile_workload(queries, policy)
    columns = [(p.column, policy.column(p.column), p.unit_to_part) for p in w.partitions]
    return w, columns


def plain_sql(raw_columns) -> str:
    cols = ", ".join(raw_columns)
    return f"SELECT {cols}, count(*) AS n FROM t GROUP BY ALL"


def run_plain(con, raw_columns):
    # the outer aggregate is trivial: it forces the whole GROUP BY without paying for a
    # Python fetch of every raw group
    return con.execute(f"SELECT count(*), sum(n) FROM ({plain_sql(raw_columns)})").fetchone()


def timed(fns, repeat: int) -> list[list[float]]:
    """Seconds per run of each function: one warm-up each, then the runs interleaved (so a
    change in machine load hits every function alike)."""
    for fn in fns:
        fn()  # warm-up
    out = [[] for _ in fns]
    for _ in range(repeat):
        for fn, times in zip(fns, out):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return out


# --------------------------------------------------------------------------- reference


def _units(domain, values: list) -> np.ndarray:
    """Unit of each raw value, by the rules in dpsql.workload.domain (independent of engine SQL)."""
    if isinstance(domain, CategoricalDomain):
        index = {v: i for i, v in enumerate(domain.values)}
        null_unit = domain.null_unit if domain.nullable else domain.other_unit
        return np.array([null_unit if v is None else index.get(v, domain.other_unit)
                         for v in values], dtype=np.int64)
    top = domain.n_value_units - 1
    null_unit = domain.null_unit if domain.nullable else 0
    is_null = np.array([v is None for v in values])
    x = np.array([np.nan if v is None else float(v) for v in values])
    if isinstance(domain, IntegerDomain):
        u = np.floor((np.nan_to_num(x) - domain.min) / domain.step)
    else:
        assert isinstance(domain, NumericDomain)
        u = np.searchsorted(np.asarray(domain.edges[1:-1], dtype=float),
                            np.nan_to_num(x), side="right").astype(float)
    u = np.clip(u, 0, top).astype(np.int64)
    u[is_null] = null_unit
    return u


def reference_vector(con, columns, n_cells: int, raw_columns) -> np.ndarray:
    rows = con.execute(plain_sql(raw_columns)).fetchall()
    by_name = dict(zip(raw_columns, zip(*rows))) if rows else {}
    cell = np.zeros(len(rows), dtype=np.int64)
    for name, domain, unit_to_part in columns:
        n_parts = int(unit_to_part.max()) + 1
        cell = cell * n_parts + unit_to_part[_units(domain, list(by_name[name]))]
    counts = np.array([r[-1] for r in rows], dtype=np.float64)
    return np.bincount(cell, weights=counts, minlength=n_cells).astype(np.float64)


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: all)")
    ap.add_argument("--file", action="store_true",
                    help="use a temporary database file instead of an in-memory database")
    ap.add_argument("--no-verify", action="store_true",
                    help="skip the check against the NumPy reference")
    args = ap.parse_args(argv)

    t_start = time.perf_counter()
    tmp = tempfile.TemporaryDirectory(prefix="dpsql-bench-") if args.file else None
    path = os.path.join(tmp.name, "bench.duckdb") if tmp else ":memory:"
    con = duckdb.connect(path)
    if args.threads:
        con.execute(f"SET threads = {int(args.threads)}")
    t0 = time.perf_counter()
    generate(con, args.rows)
    threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    print(f"generated {args.rows:,} rows in {time.perf_counter() - t0:.2f} s "
          f"({'file' if tmp else 'in memory'}, duckdb {duckdb.__version__}, {threads} threads)")

    policy = table_policy_from_spec("t", POLICY_SPEC)
    results = []
    all_ok = True
    for name, sql, raw in SCENARIOS:
        w, columns = compile_batch(policy, sql)
        n_cells = w.n_cells

        def dp():
            return data_engine.data_vector(con, "t", columns, n_cells)

        x = dp()
        if x.sum() != args.rows:
            print(f"[{name}] data vector sums to {x.sum():,.0f}, expected {args.rows:,}")
            all_ok = False
        if not args.no_verify:
            ref = reference_vector(con, columns, n_cells, raw)
            if not np.array_equal(x, ref):
                bad = np.flatnonzero(x != ref)
                print(f"[{name}] MISMATCH with the reference in {len(bad)} cells "
                      f"(first: {bad[:5].tolist()})")
                all_ok = False
        n_groups = run_plain(con, raw)[0]
        t_dp, t_plain = timed([dp, lambda: run_plain(con, raw)], args.repeat)
        shape = "x".join(str(p.n_parts) for p in w.partitions)
        results.append((name, shape, n_cells, n_groups, t_dp, t_plain))

    print()
    head = (f"{'scenario':<20} {'cells':>12} {'raw groups':>10}  {'dpsql best':>10} "
            f"{'median':>7}  {'plain best':>10} {'median':>7}  {'ratio':>6}")
    print(head)
    print("-" * len(head))
    worst = 0.0
    for name, shape, n_cells, n_groups, t_dp, t_plain in results:
        ratio = min(t_dp) / min(t_plain)
        worst = max(worst, ratio)
        cells = f"{shape}={n_cells}"
        print(f"{name:<20} {cells:>12} {n_groups:>10}  {min(t_dp):>10.3f} "
              f"{statistics.median(t_dp):>7.3f}  {min(t_plain):>10.3f} "
              f"{statistics.median(t_plain):>7.3f}  {ratio:>6.2f}")
    print()
    print(f"seconds; ratio = dpsql best / plain best; {args.repeat} interleaved runs after "
          "one warm-up")
    verdict = "PASS" if worst <= TARGET_RATIO else "FAIL"
    print(f"{verdict}: worst ratio {worst:.2f} (target <= {TARGET_RATIO:g})"
          + ("" if all_ok else "; CORRECTNESS CHECK FAILED (see above)")
          + f"; total {time.perf_counter() - t_start:.1f} s")
    con.close()
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    main()
    sys.exit(0)
