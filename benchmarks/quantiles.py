"""Quantiles released together vs one by one at the same ε (issue 20 item 3).

Five quantile statements by group on the Adult extract (the shipped data and demo policy):

    median age by race and sex; p90 hours_per_week by income; p25 age by sex;
    median age by income; median education_num (DISC) by marital status

released (a) **together**, one batch at ε (one measurement of all their CDF counts, the
strategy chosen for the whole batch), and (b) **one by one**, each statement alone at ε/5
(the same total ε: the per-query baseline of SmartNoise-style systems), over repeated
releases. Printed per statement and mode: the RMSE of the released quantiles against the
rule on exact counts (the noise-free answer of the same rule: the error the noise causes),
the RMSE against DuckDB's exact quantile (adds the declared bins' discretisation), the
median interval width, the interval's coverage of the exact-count value, and the share of
NULL (groups whose noisy count is not distinguishable from empty). Units differ between
statements (years, hours): no figure mixes them; the last line gives the ratio of the two
modes' RMSE per statement.

Noise: the **seeded test sampler** (continuous Gaussian/Laplace from a seeded generator,
reproducible; releases marked non-private) by default, ``--secure`` for the exact secure
sampler (slower draws; the same distributions up to the lattice). Default settings first:
ε = 0.5, δ = 1e-6, strategy auto, 20 releases per mode.

    PYTHONPATH=. python benchmarks/quantiles.py [--epsilon 0.5] [--releases 20] [--secure]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import tomllib
from importlib import resources

import duckdb
import numpy as np

import dpsql
from dpsql.noise.samplers import SecureSampler, SeededTestSampler

DATA = resources.files("dpsql") / "data"
SPEC = tomllib.loads((DATA / "adult_policy.toml").read_text())["tables"]["adult"]

#: (name, SQL, column, q, kind, group columns)
STATEMENTS = [
    ("median age by race, sex",
     "SELECT race, sex, MEDIAN(age) FROM adult GROUP BY race, sex", "age", 0.5, "cont",
     ("race", "sex")),
    ("p90 hours by income",
     "SELECT income, QUANTILE_CONT(hours_per_week, 0.9) FROM adult GROUP BY income",
     "hours_per_week", 0.9, "cont", ("income",)),
    ("p25 age by sex",
     "SELECT sex, QUANTILE_CONT(age, 0.25) FROM adult GROUP BY sex", "age", 0.25, "cont",
     ("sex",)),
    ("median age by income",
     "SELECT income, MEDIAN(age) FROM adult GROUP BY income", "age", 0.5, "cont",
     ("income",)),
    ("median education_num by marital",
     "SELECT marital_status, QUANTILE_DISC(education_num, 0.5) FROM adult "
     "GROUP BY marital_status", "education_num", 0.5, "disc", ("marital_status",)),
]


def _units(column: str):
    """(lower edges, upper edges, unit values, min, max) of a declared ordered column."""
    spec = SPEC["columns"][column]
    if spec["type"] == "integer":
        values = np.arange(spec["min"], spec["max"] + 1, dtype=float)
        return values - 0.5, values + 0.5, values, spec["min"], spec["max"]
    e = np.array(spec["edges"], dtype=float)
    return e[:-1], e[1:], e[:-1], spec["min"], spec["max"]


def _unit_index(column: str, value: float) -> int:
    lo, hi, key, _, _ = _units(column)
    spec = SPEC["columns"][column]
    v = min(max(value, spec["min"]), spec["max"])
    return int(np.searchsorted(key, v, side="right") - 1) if spec["type"] == "numeric" \
        else int(round(v) - spec["min"])


def truths(con) -> list[dict]:
    """Per statement: group key -> (rule on exact counts, DuckDB's exact quantile)."""
    return [truth(con, column, q, kind, groups) for _, _, column, q, kind, groups in STATEMENTS]


def truth(con, column: str, q: float, kind: str, groups: tuple) -> dict:
    """Group key -> (rule on exact counts, DuckDB's exact quantile) of one quantile of
    ``column`` by ``groups`` over the whole ``adult`` table (no WHERE)."""
    lo, hi, key, low, high = _units(column)
    cols = ", ".join(groups)
    counts: dict = {}
    for row in con.execute(f"SELECT {cols}, {column}, count(*) FROM adult "
                           f"WHERE {column} IS NOT NULL GROUP BY ALL").fetchall():
        counts.setdefault(tuple(row[:-2]), np.zeros(len(key)))[
            _unit_index(column, row[-2])] += row[-1]
    fn = "quantile_cont" if kind == "cont" else "quantile_disc"
    exact = dict((tuple(r[:-1]), r[-1]) for r in con.execute(
        f"SELECT {cols}, {fn}({column}, {q}) FROM adult GROUP BY ALL").fetchall())
    table = {}
    for g, c in counts.items():
        C = np.cumsum(c)
        u = int(np.argmax(C >= q * C[-1]))
        before = C[u - 1] if u else 0.0
        rule = key[u] if kind == "disc" else \
            min(max(lo[u] + (q * C[-1] - before) / (C[u] - before) * (hi[u] - lo[u]),
                    low), high)
        table[g] = (float(rule), float(exact[g]))
    return table


def _session(path: str, secure: bool, seed: int):
    sampler = SecureSampler() if secure else SeededTestSampler(seed)
    db = dpsql.connect(path, sampler=sampler, reuse=False)
    db.protect("adult", dict(SPEC, epsilon=1e6, delta=0.5), replace=True)
    return db


def run(mode: str, path: str, eps: float, releases: int, secure: bool, truth) -> tuple:
    """Errors per statement over ``releases`` releases; (stats per statement, CPU s)."""
    db = _session(path, secure, 1 if mode == "together" else 2)
    errs = [[] for _ in STATEMENTS]
    start = time.process_time()
    for _ in range(releases):
        if mode == "together":
            tables = db.answer(";\n".join(s[1] for s in STATEMENTS), epsilon=eps,
                               delta=1e-6).results
        else:
            tables = [db.answer(s[1], epsilon=eps / len(STATEMENTS), delta=1e-6).results[0]
                      for s in STATEMENTS]
        for i, t in enumerate(tables):
            for row in t.rows:
                key, (value, _se, low, high) = tuple(row[:-4]), row[-4:]
                if key in truth[i]:
                    errs[i].append((value, low, high) + truth[i][key])
    cpu = time.process_time() - start
    db.close()
    return [_stats(e) for e in errs], cpu


def _stats(rows: list) -> dict:
    got = [r for r in rows if r[0] is not None]
    v, lo, hi, rule, exact = (np.array(c, dtype=float) for c in zip(*got)) if got else \
        (np.array([np.nan]),) * 5
    return {"rmse": float(np.sqrt(np.mean((v - rule) ** 2))),
            "rmse_exact": float(np.sqrt(np.mean((v - exact) ** 2))),
            "width": float(np.median(hi - lo)),
            "coverage": float(np.mean((lo <= rule) & (rule <= hi))),
            "null": 1 - len(got) / max(1, len(rows))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epsilon", type=float, default=0.5)
    ap.add_argument("--releases", type=int, default=20)
    ap.add_argument("--secure", action="store_true", help="the exact secure sampler")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dpsql-quantiles-") as tmp:
        path = os.path.join(tmp, "adult.duckdb")
        con = duckdb.connect(path)
        con.execute("CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true)",
                    [str(DATA / "adult.csv.gz")])
        truth = truths(con)
        con.close()
        sampler = "secure (OpenDP)" if args.secure else "seeded test sampler (non-private)"
        print(f"Adult, 5 quantile statements by group; epsilon={args.epsilon:g} in total, "
              f"delta=1e-6, strategy auto, {args.releases} releases per mode, {sampler}")
        results = {m: run(m, path, args.epsilon, args.releases, args.secure, truth)
                   for m in ("together", "one-by-one")}
    head = (f"{'statement':<32} {'mode':<10} {'RMSE':>7} {'RMSE/DuckDB':>11} "
            f"{'CI width':>8} {'coverage':>8} {'NULL':>5}")
    print(head + "\n" + "-" * len(head))
    for i, (name, *_rest) in enumerate(STATEMENTS):
        for mode in ("together", "one-by-one"):
            s = results[mode][0][i]
            print(f"{name:<32} {mode:<10} {s['rmse']:>7.3f} {s['rmse_exact']:>11.3f} "
                  f"{s['width']:>8.2f} {s['coverage']:>8.3f} {s['null']:>5.2f}")
    ratios = [results["one-by-one"][0][i]["rmse"] / results["together"][0][i]["rmse"]
              for i in range(len(STATEMENTS))]
    print("RMSE one-by-one / together, per statement: "
          + ", ".join(f"{r:.2f}" for r in ratios))
    print(f"CPU seconds for all releases: together {results['together'][1]:.1f}, "
          f"one by one {results['one-by-one'][1]:.1f}")


if __name__ == "__main__":
    main()
