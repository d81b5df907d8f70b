"""A batch joined to a public table vs the same batch written on the key (issue 20 item 4).

The shipped demo policy declares the public table ``education_levels`` (education -> level).
One reporting batch is written three ways:

- **join**: ``... FROM adult JOIN education_levels USING (education) ... GROUP BY level``;
- **key IN**: the same counts written on the key, one statement per level with
  ``WHERE education IN (that level's values)`` (what dpsql compiles the join to: the
  workload ``W`` must be identical, hence the accuracy);
- **key GROUP BY**: grouped by ``education`` itself, the levels summed afterwards from the
  released counts (what an analyst without joins would do: a finer workload).

Printed: parse+compile CPU time (median of repeated compiles), explain CPU time, the number
of counts and cells, expected RMSE (explain) and the empirical RMSE of the level counts over
repeated releases against DuckDB's exact join answers, all at the same ε (each form on its
own copy of the database: no strategy cache shared). "exp. RMSE" is over each form's own
counts (the key GROUP BY form's are per education value); "RMSE levels" over the level counts. Noise: the seeded
test sampler (reproducible, releases marked non-private), ``--secure`` for the exact one.
Default settings first: ε = 0.5, δ = 1e-6, strategy auto, 20 releases.

    PYTHONPATH=. python benchmarks/joins.py [--epsilon 0.5] [--releases 20] [--secure]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import tomllib
from importlib import resources

import duckdb
import numpy as np

import dpsql
from dpsql.noise.samplers import SecureSampler, SeededTestSampler
from dpsql.policy.policy import table_policy_from_spec
from dpsql.sql.compile import compile_workload
from dpsql.sql.parse import parse_batch

DATA = resources.files("dpsql") / "data"
SPEC = tomllib.loads((DATA / "adult_policy.toml").read_text())["tables"]["adult"]
LEVELS = SPEC["public"]["education_levels"]["rows"]
ORDER = list(dict.fromkeys(level for _, level in LEVELS))
J = "FROM adult JOIN education_levels USING (education)"

#: (group columns besides level, extra condition)
STATEMENTS = [(("sex",), None), (("income",), None), ((), "age < 40"),
              (("race",), "hours_per_week >= 40")]


def join_batch() -> list[str]:
    out = []
    for cols, cond in STATEMENTS:
        keys = ", ".join(("level",) + cols)
        where = f" WHERE {cond}" if cond else ""
        out.append(f"SELECT {keys}, COUNT(*) {J}{where} GROUP BY {keys}")
    return out


def key_in_batch() -> list[str]:
    out = []
    for cols, cond in STATEMENTS:
        for level in ORDER:
            values = ", ".join(f"'{e}'" for e, lv in LEVELS if lv == level)
            where = f"education IN ({values})" + (f" AND {cond}" if cond else "")
            group = f" GROUP BY {', '.join(cols)}" if cols else ""
            select = ", ".join(cols + ("COUNT(*)",))
            out.append(f"SELECT {select} FROM adult WHERE {where}{group}")
    return out


def key_group_batch() -> list[str]:
    out = []
    for cols, cond in STATEMENTS:
        keys = ", ".join(("education",) + cols)
        where = f" WHERE {cond}" if cond else ""
        out.append(f"SELECT {keys}, COUNT(*) FROM adult{where} GROUP BY {keys}")
    return out


def level_counts(form: str, results) -> list[dict]:
    """Per statement of the join batch: (level, *groups) -> released count."""
    level_of = dict(LEVELS)
    out = []
    if form == "join":
        return [{tuple(r[:-4]): r[-4] for r in t.rows} for t in results]
    if form == "key IN":
        it = iter(results)
        for cols, _ in STATEMENTS:
            table = {}
            for level in ORDER:
                for r in next(it).rows:
                    table[(level,) + tuple(r[:-4])] = r[-4]
            out.append(table)
        return out
    for t in results:                        # key GROUP BY: sum the education groups
        table: dict = {}
        for r in t.rows:
            key = (level_of[r[0]],) + tuple(r[1:-4])
            table[key] = table.get(key, 0.0) + r[-4]
        out.append(table)
    return out


def compile_seconds(sql: list[str], policy, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        start = time.process_time()
        compile_workload(parse_batch(sql, lambda name, node: policy), policy)
        times.append(time.process_time() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epsilon", type=float, default=0.5)
    ap.add_argument("--releases", type=int, default=20)
    ap.add_argument("--secure", action="store_true", help="the exact secure sampler")
    args = ap.parse_args()
    policy = table_policy_from_spec("adult", SPEC)
    forms = {"join": join_batch(), "key IN": key_in_batch(), "key GROUP BY": key_group_batch()}
    a = compile_workload(parse_batch(forms["join"], lambda n, node: policy), policy)
    b = compile_workload(parse_batch(forms["key IN"], lambda n, node: policy), policy)
    same = a.W.shape == b.W.shape and (a.W != b.W).nnz == 0
    with tempfile.TemporaryDirectory(prefix="dpsql-joins-") as tmp:
        path = os.path.join(tmp, "adult.duckdb")
        con = duckdb.connect(path)
        con.execute("CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true)",
                    [str(DATA / "adult.csv.gz")])
        con.execute("CREATE TABLE education_levels (education VARCHAR, level VARCHAR)")
        con.executemany("INSERT INTO education_levels VALUES (?, ?)", LEVELS)
        truth = [{tuple(r[:-1]): r[-1] for r in con.execute(s).fetchall()}
                 for s in forms["join"]]
        con.close()
        sampler = "secure (OpenDP)" if args.secure else "seeded test sampler (non-private)"
        print(f"Adult, {len(STATEMENTS)} join statements by level; epsilon={args.epsilon:g}, "
              f"delta=1e-6, strategy auto, {args.releases} releases per form, {sampler}")
        print(f"join W identical to the key-IN batch's W: {same}")
        head = (f"{'form':<13} {'statements':>10} {'counts':>7} {'cells':>6} "
                f"{'compile s':>9} {'explain s':>9} {'strategy':>9} {'exp. RMSE':>9} "
                f"{'RMSE levels':>11}")
        print(head + "\n" + "-" * len(head))
        warm = dpsql.connect(path)                  # imports and first-call costs, once
        warm.protect("adult", dict(SPEC, epsilon=1e6, delta=0.5), replace=True)
        warm.explain("SELECT sex, COUNT(*) FROM adult WHERE age < 30 GROUP BY sex",
                     epsilon=args.epsilon, delta=1e-6)
        warm.close()
        for form, sql in forms.items():
            fresh = os.path.join(tmp, f"{len(form)}-{form.replace(' ', '_')}.duckdb")
            shutil.copyfile(path, fresh)            # no strategy cache shared between forms
            db = dpsql.connect(fresh, sampler=SecureSampler() if args.secure
                               else SeededTestSampler(3), reuse=False)
            db.protect("adult", dict(SPEC, epsilon=1e6, delta=0.5), replace=True)
            start = time.process_time()
            expl = db.explain(sql, epsilon=args.epsilon, delta=1e-6)
            explain_s = time.process_time() - start
            errors = []
            for _ in range(args.releases):
                r = db.answer(sql, epsilon=args.epsilon, delta=1e-6)
                for got, exact in zip(level_counts(form, r.results), truth):
                    errors += [got[k] - exact.get(k, 0) for k in got]
            db.close()
            rmse = float(np.sqrt(np.mean(np.square(errors))))
            print(f"{form:<13} {len(sql):>10} {expl.n_queries:>7} {expl.n_cells:>6} "
                  f"{compile_seconds(sql, policy):>9.4f} {explain_s:>9.2f} "
                  f"{expl.strategy:>9} {expl.rmse:>9.3f} {rmse:>11.3f}")


if __name__ == "__main__":
    main()
