"""Free answers from past releases: what a second, overlapping batch costs (issue 8 §3).

    python benchmarks/reuse.py

On the Adult extract, each scenario asks a first batch of statements, then a second batch that
repeats half of them and adds as many new ones, both *by accuracy* (``max_stderr``: every
answer's standard error at most the target, the smallest ε that meets it, dpsql's
accuracy-first path). With reuse the repeated half is answered from the first release's
measurements and only the new half is paid for; without reuse (``reuse=False``, a fresh
database) the whole second batch is. The issue's number: the second batch costs at most half
of the first, and the repeated half's errors are no larger than they were the first time.

A second table asks the same second batch at a *fixed* ε (the first batch's): the repeated
half is free, the ε buys the new half only, and the repeated half's error is compared again.

What a batch costs by accuracy is set by its hardest query: reuse halves the cost when the new
half is no harder than the repeated one (the marginals), not when the new queries are the
hardest of all (the random age ranges: the repeated half is still free and more accurate).
Errors are the exact expected ones (explain/answer report them; no simulation). The noise is
the seeded test sampler (the costs and errors do not depend on it). Always exits 0.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dpsql  # noqa: E402
from dpsql.noise.samplers import SeededTestSampler

SHARED = ROOT.parent / "shared" / "data" / "adult.csv"
PACKAGED = ROOT / "dpsql" / "data" / "adult.csv.gz"

POLICY = {
    "epsilon": 100, "delta": 1e-5,
    "columns": {
        "sex": {"type": "categorical", "values": ["Female", "Male"]},
        "race": {"type": "categorical", "values": ["White", "Black", "Asian-Pac-Islander",
                                                   "Amer-Indian-Eskimo", "Other"]},
        "income": {"type": "categorical", "values": ["<=50K", ">50K"]},
        "relationship": {"type": "categorical", "values": [
            "Husband", "Not-in-family", "Own-child", "Unmarried", "Wife", "Other-relative"]},
        "workclass": {"type": "categorical", "values": [
            "Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov",
            "State-gov", "Without-pay", "Never-worked"]},
        "marital_status": {"type": "categorical", "values": [
            "Married-civ-spouse", "Never-married", "Divorced", "Separated", "Widowed",
            "Married-spouse-absent", "Married-AF-spouse"]},
        "age": {"type": "integer", "min": 17, "max": 90},
    },
}

PAIRS = [("sex", "race"), ("sex", "income"), ("race", "income"), ("relationship", "sex"),
         ("workclass", "income"), ("relationship", "income"), ("workclass", "sex"),
         ("race", "relationship")]


def marginal(a: str, b: str) -> str:
    return f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}"


def ranges(seed: int, k: int) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(k):
        lo, hi = sorted(rng.integers(17, 91, size=2))
        out.append(f"SELECT COUNT(*) FROM adult WHERE age BETWEEN {lo} AND {hi}")
    return out


SCENARIOS = [
    # (name, first batch, second batch: first half of the first + as many new, target)
    ("2-way marginals, 8 statements", [marginal(*p) for p in PAIRS],
     [marginal(*p) for p in PAIRS[:4]] + [marginal(*p) for p in
                                          [("workclass", "race"), ("relationship", "workclass"),
                                           ("marital_status", "sex"),
                                           ("marital_status", "income")]], 10.0),
    ("age ranges, 16 statements", ranges(1, 16), ranges(1, 16)[:8] + ranges(2, 8), 10.0),
]


def fresh_db(raw: str, workdir: str, tag: str):
    path = os.path.join(workdir, f"{tag}.duckdb")
    shutil.copyfile(raw, path)
    db = dpsql.connect(path, sampler=SeededTestSampler(7))
    db.protect("adult", POLICY)
    return db


def stderr_by_statement(release) -> list[np.ndarray]:
    """Each statement's standard errors, in order."""
    return [np.array([row[list(t.columns).index("stderr")] for row in t.rows], dtype=float)
            for t in release.results]


def main() -> None:
    workdir = tempfile.mkdtemp(prefix="dpsql-reuse-bench-")
    raw = os.path.join(workdir, "raw.duckdb")
    con = duckdb.connect(raw)
    con.execute("CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true)",
                [str(SHARED if SHARED.exists() else PACKAGED)])
    con.close()
    print(f"# python benchmarks/reuse.py   data: {SHARED if SHARED.exists() else PACKAGED}; "
          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    print("accuracy-first (max_stderr target, delta = 1e-6): epsilon charged per batch\n")
    head = (f"{'scenario':<32} {'target':>6} {'eps 1st':>8} {'eps 2nd':>8} {'2nd/1st':>7} "
            f"{'2nd, no reuse':>13} {'free rows':>9} {'repeated: max se 1st':>21} "
            f"{'-> 2nd':>7} {'seconds':>7}")
    print(head)
    print("-" * len(head))
    fixed = []
    for k, (name, first, second, target) in enumerate(SCENARIOS):
        t0 = time.perf_counter()
        db = fresh_db(raw, workdir, f"s{k}")
        r1 = db.answer(first, max_stderr=target, delta=1e-6, confirm=True)
        e2 = db.explain(second, max_stderr=target, delta=1e-6)
        r2 = db.answer(second, max_stderr=target, delta=1e-6, confirm=True)
        half = len(second) // 2
        se1 = stderr_by_statement(r1)[:half]
        se2 = stderr_by_statement(r2)[:half]
        db.close()
        base = fresh_db(raw, workdir, f"b{k}")
        base.answer(first, max_stderr=target, delta=1e-6, confirm=True)
        cold = base.explain(second, max_stderr=target, delta=1e-6, reuse=False)
        base.close()
        secs = time.perf_counter() - t0
        m1 = max(float(a.max()) for a in se1)
        m2 = max(float(a.max()) for a in se2)
        worse = any(np.any(b > a * (1 + 1e-9)) for a, b in zip(se1, se2))
        print(f"{name:<32} {target:>6g} {r1.epsilon:>8.4g} {r2.epsilon:>8.4g} "
              f"{r2.epsilon / r1.epsilon:>7.3f} {cold.epsilon:>13.4g} "
              f"{len(e2.free):>4}/{e2.n_queries:<4} {m1:>21.4g} {m2:>7.4g} {secs:>7.1f}"
              + ("  REPEATED HALF WORSE" if worse else ""))
        fixed.append((name, first, second, r1.epsilon))
    print("\nfixed epsilon (the second batch at the first batch's epsilon)\n")
    head = (f"{'scenario':<32} {'eps':>8} {'free rows':>9} {'repeated: max se 1st':>21} "
            f"{'-> 2nd':>7} {'new half: rmse fresh':>21} {'-> with reuse':>13}")
    print(head)
    print("-" * len(head))
    for k, (name, first, second, eps) in enumerate(fixed):
        db = fresh_db(raw, workdir, f"f{k}")
        r1 = db.answer(first, epsilon=eps, delta=1e-6)
        cold = db.explain(second, epsilon=eps, delta=1e-6, reuse=False)
        e2 = db.explain(second, epsilon=eps, delta=1e-6)
        r2 = db.answer(second, epsilon=eps, delta=1e-6)
        half = len(second) // 2
        se1 = np.concatenate(stderr_by_statement(r1)[:half])
        se2 = np.concatenate(stderr_by_statement(r2)[:half])
        new_rows = np.concatenate([np.arange(s, e) for i, s, e in e2.statements if i >= half])
        print(f"{name:<32} {eps:>8.4g} {len(e2.free):>4}/{e2.n_queries:<4} "
              f"{se1.max():>21.4g} {se2.max():>7.4g} "
              f"{np.sqrt(np.mean(cold.stderr[new_rows] ** 2)):>21.4g} "
              f"{np.sqrt(np.mean(e2.stderr[new_rows] ** 2)):>13.4g}")
        db.close()
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
