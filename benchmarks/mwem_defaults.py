"""The synthetic study behind MWEM's default rounds, replay and N share (issue 21 item 1).

    python benchmarks/mwem_defaults.py [--runs R] [--part rounds|share]

No Adult data: every data set is generated here, with shapes chosen before any Adult run of
the new defaults (the rule in :mod:`dpsql.mechanisms.mwem.defaults` was fitted on this
study's output and committed before ``benchmarks/mwem_adult.py`` was run with it).

Data (seeded; public synthetic data, not noise):

- ``spike``: 1-D, ``n`` cells, 60% of the rows at cell 0, the rest a geometric tail with a
  few secondary spikes (a zero-inflated monetary column);
- ``smooth``: 1-D, a two-component discretised normal mixture;
- ``ridge``: 2-D ``60 x 80``, a correlated discretised normal (a ridge) plus a uniform floor.

Workloads: 1,000 random ranges (both ends uniform, sorted) for 1-D, 1,000 random
rectangles for 2-D. ``N`` ∈ {10,000, 50,000}; ε ∈ {0.01, 0.05, 0.1, 0.5}.

``--part rounds``: for each (data, N, ε) the mean MSE over ``R`` runs of every T in the grid,
both ``measure="query"`` and ``"partition"``, N public, ``replay = 100``; prints the best T per
configuration and the (ε N) the rule uses. ``--part share``: at the rule's T, the MSE with N
public against N estimated with share s of ε, s ∈ {1/40, 1/20, 1/10, 1/5}.

MeasureOracle is the kernel's own class with the seeded test sampler (not private: a study).
Process CPU time is printed (the machine is shared; wall time is not meaningful).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from fractions import Fraction

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dpsql.kernel.oracles import MeasureOracle  # noqa: E402
from dpsql.mechanisms.mwem.core import Block, MWEMOptions, run_mwem  # noqa: E402
from dpsql.noise.samplers import SeededTestSampler  # noqa: E402

EPSILONS = (0.01, 0.05, 0.1, 0.5)
TOTALS = (10_000, 50_000)
T_GRID = (2, 3, 5, 8, 12, 20, 30)
REPLAY = 100
N_QUERIES = 1000


def spike(n: int, rng) -> np.ndarray:
    p = 0.4 * 0.995 ** np.arange(n)
    p /= p.sum() / 0.4
    p[0] += 0.6
    for c in rng.choice(np.arange(1, n), 5, replace=False):
        p[c] += 0.01
    return p / p.sum()


def smooth(n: int, rng) -> np.ndarray:
    i = np.arange(n)
    p = (np.exp(-0.5 * ((i - 0.3 * n) / (0.08 * n)) ** 2)
         + 0.5 * np.exp(-0.5 * ((i - 0.7 * n) / (0.15 * n)) ** 2))
    return p / p.sum()


def ridge(shape, rng) -> np.ndarray:
    a, b = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
    u, v = a / shape[0] - 0.4, b / shape[1] - 0.5
    p = np.exp(-0.5 * ((u - 0.8 * v) ** 2 / 0.01 + v ** 2 / 0.05)) + 0.02
    return (p / p.sum()).reshape(-1)


def counts(p: np.ndarray, total: int, rng) -> np.ndarray:
    return rng.multinomial(total, p).astype(float)


def range_rows(n: int, k: int, rng) -> sp.csr_matrix:
    ends = np.sort(rng.integers(0, n, (k, 2)), axis=1)
    lo, hi = ends[:, 0], ends[:, 1]
    lengths = hi - lo + 1
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    cols = np.arange(indptr[-1]) - np.repeat(indptr[:-1] - lo, lengths)
    return sp.csr_matrix((np.ones(cols.size), cols, indptr), shape=(k, n))


def rect_rows(shape, k: int, rng) -> sp.csr_matrix:
    rows = []
    for _ in range(k):
        a = np.sort(rng.integers(0, shape[0], 2))
        b = np.sort(rng.integers(0, shape[1], 2))
        mask = np.zeros(shape)
        mask[a[0]:a[1] + 1, b[0]:b[1] + 1] = 1
        rows.append(sp.csr_matrix(mask.reshape(1, -1)))
    return sp.vstack(rows).tocsr()


def cases():
    rng = np.random.default_rng(2026)
    out = []
    for n in (1000, 4000):
        out.append((f"spike n={n}", spike(n, rng), range_rows(n, N_QUERIES, rng), None))
    out.append(("smooth n=2000", smooth(2000, rng), range_rows(2000, N_QUERIES, rng), None))
    shape = (60, 80)
    out.append(("ridge 60x80", ridge(shape, rng), rect_rows(shape, N_QUERIES, rng), shape))
    return out


def mse(W, x, shape, eps, seed, **options) -> float:
    block = Block(W, [], W.shape[1], shape=shape)
    oracle = MeasureOracle([x], SeededTestSampler(seed), Fraction(repr(eps)))
    result = run_mwem([block], Fraction(repr(eps)), oracle, MWEMOptions(**options))
    return float(np.mean((result.answers[0] - W @ x) ** 2))


def part_rounds(runs: int, measures=("query", "partition"), skip: int = 0) -> None:
    print(f"rounds: mean MSE over {runs} runs, N public, replay={REPLAY}; columns T in "
          f"{list(T_GRID)}; 'best' = argmin T; eN = ε·N")
    rng = np.random.default_rng(7)
    for i, (label, p, W, shape) in enumerate(cases()):
        for total in TOTALS:
            x = counts(p, total, rng)
            if i < skip:
                continue
            for eps in EPSILONS:
                for measure in measures:
                    means = []
                    for T in T_GRID:
                        vals = [mse(W, x, shape, eps, 1000 * r + T, rounds=T, replay=REPLAY,
                                    total=float(x.sum()), measure=measure)
                                for r in range(runs)]
                        means.append(float(np.mean(vals)))
                    best = T_GRID[int(np.argmin(means))]
                    print(f"{label:<14} N={total:<6} eps={eps:<5} {measure:<9} eN={eps * total:<8g}"
                          f" best T={best:<3} " + " ".join(f"{m:.3g}" for m in means),
                          flush=True)


SHARES = (Fraction(1, 40), Fraction(1, 20), Fraction(1, 10), Fraction(1, 5))


def part_share(runs: int, skip: int = 0) -> None:
    """N public (T by the rule on the true N) against N estimated with share s of ε (T by
    the rule on the noisy N, as an analyst's run does), measure=partition, replay=REPLAY."""
    from dpsql.mechanisms.mwem import defaults
    print(f"share: mean MSE over {runs} runs with the default options (rounds='rule', "
          f"replay={defaults.REPLAY}, measure='partition'); columns: T (N public), MSE with N "
          f"public, then N estimated with s in {[str(v) for v in SHARES]} (ratio to N public)")
    rng = np.random.default_rng(7)
    for i, (label, p, W, shape) in enumerate(cases()):
        for total in TOTALS:
            x = counts(p, total, rng)
            if i < skip:
                continue
            for eps in EPSILONS:
                T = defaults.default_rounds(eps, float(x.sum()), 1)
                base = np.mean([mse(W, x, shape, eps, 1000 * r, total=float(x.sum()))
                                for r in range(runs)])
                row = [np.mean([mse(W, x, shape, eps, 1000 * r, total_share=s)
                                for r in range(runs)]) / base for s in SHARES]
                print(f"{label:<14} N={total:<6} eps={eps:<5} T={T:<3} {base:.3g} "
                      + " ".join(f"x{v:.2f}" for v in row), flush=True)


def fit(paths) -> None:
    """Fit ``T_block = C (ε N)^A`` to the rounds table(s) (``--part rounds`` output): the
    (C, A) on a grid minimising the mean over configurations of log(MSE(T_rule) / min MSE),
    the MSE at T_rule interpolated linearly in (log T, log MSE) between the grid's T values
    (``partition`` rows: the default measurement)."""
    rows = []
    for path in paths:
        for text in open(path, encoding="utf-8"):
            parts = text.split()
            if "partition" not in parts or "best" not in parts:
                continue
            eN = float(next(p for p in parts if p.startswith("eN=")).split("=")[1])
            rows.append((eN, np.log([float(v) for v in parts[-len(T_GRID):]])))
    logT = np.log(T_GRID)
    best = None
    for C in np.arange(0.05, 1.5, 0.01):
        for A in np.arange(0.2, 0.8, 0.01):
            loss = 0.0
            for eN, logm in rows:
                T = min(max(C * eN ** A, T_GRID[0]), T_GRID[-1])
                loss += float(np.interp(np.log(T), logT, logm) - logm.min())
            if best is None or loss < best[0]:
                best = (loss, C, A)
    loss, C, A = best
    print(f"fit over {len(rows)} configurations: C = {C:.2f}, A = {A:.2f}; mean MSE(T_rule) / "
          f"min over the grid = exp({loss / len(rows):.3f}) = {math.exp(loss / len(rows)):.2f}")
    for eN, logm in rows:
        T = min(max(C * eN ** A, T_GRID[0]), T_GRID[-1])
        ratio = math.exp(float(np.interp(np.log(T), logT, logm) - logm.min()))
        print(f"  eN={eN:<8g} T_rule={T:5.1f} best grid T={T_GRID[int(np.argmin(logm))]:<3} "
              f"MSE ratio {ratio:.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--part", choices=("rounds", "share", "fit"), default="rounds")
    ap.add_argument("--tables", nargs="*", default=[], help="--part fit: rounds output files")
    ap.add_argument("--measures", nargs="*", default=["query", "partition"])
    ap.add_argument("--skip", type=int, default=0, help="skip the first k data sets")
    args = ap.parse_args(argv)
    started = time.process_time()
    print(f"# python benchmarks/mwem_defaults.py --part {args.part} --runs {args.runs}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if args.part == "fit":
        fit(args.tables)
    elif args.part == "rounds":
        part_rounds(args.runs, tuple(args.measures), args.skip)
    else:
        part_share(args.runs, args.skip)
    print(f"process CPU time {time.process_time() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
