"""Benchmark: the data path on DuckDB and on Spark local[2], side by side (issue 19).

    python benchmarks/spark_engine.py [--rows 10000000] [--large 100000000]
                                      [--max-seconds 900] [--partitions 200] [--dir DIR]

The Adult rows are replicated to ``--rows`` rows and written as Parquet into a temporary
directory (removed at the end; never committed). The data-path operation is the one the
kernel asks for on a high-dimensional batch: all 45 two-way marginals over the 10 demo
columns (sex, race, income, marital_status, workclass, education, occupation, age,
education_num, hours_per_week; domains from ``dpsql/data/adult_policy.toml``), one
``GROUPING SETS`` query built by :func:`dpsql.engines.query.marginals_query`, run by each
engine's public call (``dpsql.engines.duckdb.marginals`` on a view over the Parquet files,
``dpsql.engines.spark.marginals`` on the files as a Spark source).

Each engine runs in a fresh Python process of its own (so that its peak memory is its
own), twice (the first run pays for loading and warming up; both are printed): wall time,
CPU time (DuckDB: the process; Spark: the Python driver plus the JVM), rows per second, the
Python process's peak RSS and, for Spark, the JVM's (``spark.driver.memory=1g``). The
marginals of both engines are then compared cell for cell. With ``--large`` the same is
done at that row count when the disk has room for it and the run at ``--rows`` predicts it
to finish within ``--max-seconds`` (it is skipped, saying why, otherwise).

Spark settings: ``local[2]``, ``spark.driver.memory=1g``, dpsql's fixed settings (ANSI
and adaptive execution off); ``spark.sql.shuffle.partitions`` is Spark's default (200)
unless ``--partitions`` says otherwise. DuckDB: 2 threads.

A benchmark, not a test: it prints the figures and always exits 0.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

DEMO10 = ["sex", "race", "income", "marital_status", "workclass", "education", "occupation",
          "age", "education_num", "hours_per_week"]
ADULT_ROWS = 32561


def columns_and_cliques():
    from dpsql.policy.policy import table_policy_from_spec

    with open(os.path.join(ROOT, "dpsql", "data", "adult_policy.toml"), "rb") as f:
        spec = tomllib.load(f)["tables"]["adult"]
    policy = table_policy_from_spec("adult", spec)
    columns = [(c, policy.column(c), np.arange(policy.column(c).n_units)) for c in DEMO10]
    return columns, list(itertools.combinations(range(len(DEMO10)), 2))


def generate(directory: str, rows: int) -> str:
    """Adult replicated to ``rows`` rows, as one Parquet file; returns its path."""
    import duckdb

    from tests.conftest import adult_csv

    path = os.path.join(directory, f"adult_{rows}.parquet")
    con = duckdb.connect()
    con.execute("SET threads = 2")
    con.execute("CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true)", [adult_csv()])
    copies = -(-rows // ADULT_ROWS)
    con.execute(f"COPY (SELECT adult.* FROM range({copies}) r, adult LIMIT {rows}) "
                f"TO '{path}' (FORMAT parquet)")
    con.close()
    return path


# ------------------------------------------------------------------ workers

def _jvm_cpu_and_peak() -> tuple[float, float]:
    """CPU seconds and peak RSS (MB) of this process's child processes (the JVM)."""
    cpu, peak = 0.0, 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) != os.getpid():
                continue
            cpu += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak += int(line.split()[1]) / 1024
        except (OSError, ValueError, IndexError):
            continue
    return cpu, peak


def _own_peak_mb() -> float:
    """This process's peak RSS (MB): VmHWM, which starts afresh at exec (``ru_maxrss``
    does not on Linux: it would carry the parent's peak, which generated the data)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def worker(engine: str, parquet: str, out: str, partitions: int | None) -> None:
    """Run the marginals twice on ``engine``; print one JSON line; save the marginals."""
    columns, cliques = columns_and_cliques()
    runs = []
    if engine == "duckdb":
        import duckdb

        from dpsql.engines import duckdb as duck

        con = duckdb.connect()
        con.execute("SET threads = 2")
        con.execute(f"CREATE VIEW adult AS SELECT * FROM read_parquet('{parquet}')")

        def run():
            return duck.marginals(con, "adult", columns, cliques)
        jvm = None
    else:
        from pyspark.sql import SparkSession

        from dpsql.engines import spark as spark_engine
        from dpsql.policy.source import Source

        builder = (SparkSession.builder.master("local[2]").appName("dpsql-benchmark")
                   .config("spark.driver.memory", "1g").config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.log.level", "OFF"))
        if partitions:
            builder = builder.config("spark.sql.shuffle.partitions", str(partitions))
        spark = builder.getOrCreate()
        source = Source("spark", path=parquet, format="parquet")

        def run():
            return spark_engine.marginals(spark, source, "adult", columns, cliques)
        jvm = _jvm_cpu_and_peak
    for _ in range(2):
        cpu0, wall0 = _self_cpu(), time.perf_counter()
        jvm0 = jvm()[0] if jvm else 0.0
        got = run()
        wall = time.perf_counter() - wall0
        cpu = _self_cpu() - cpu0 + ((jvm()[0] - jvm0) if jvm else 0.0)
        runs.append({"wall": wall, "cpu": cpu})
    np.savez(out, **{"_".join(map(str, c)): got[c] for c in cliques})
    figures = {"runs": runs, "python_peak_mb": _own_peak_mb(),
               "cells": int(sum(T.size for T in got.values()))}
    if jvm:
        figures["jvm_peak_mb"] = jvm()[1]
    print(json.dumps(figures), flush=True)


# ------------------------------------------------------------------ the comparison

def _run_worker(engine: str, parquet: str, out: str, partitions) -> dict | None:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", engine, "--data", parquet,
           "--out", out] + (["--partitions", str(partitions)] if partitions else [])
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        print(f"  {engine} failed (exit {done.returncode}): {done.stderr.strip()[-600:]}")
        return None
    return json.loads(lines[-1])


def compare(directory: str, rows: int, partitions) -> float | None:
    """One row count: both engines, their figures, the check; returns Spark's seconds."""
    t0 = time.perf_counter()
    parquet = generate(directory, rows)
    size = os.path.getsize(parquet) / 2 ** 20
    print(f"\n{rows:,} rows ({size:,.0f} MB of Parquet, written in "
          f"{time.perf_counter() - t0:.1f} s); 45 two-way marginals over 10 columns")
    figures = {}
    for engine in ("duckdb", "spark"):
        figures[engine] = _run_worker(engine, parquet, os.path.join(directory, f"{engine}.npz"),
                                      partitions if engine == "spark" else None)
    head = (f"  {'engine':<14}{'run':>4}{'wall s':>9}{'CPU s':>9}{'rows/s':>14}"
            f"{'Python peak MB':>16}{'JVM peak MB':>13}")
    print(head)
    print("  " + "-" * (len(head) - 2))
    for engine, fig in figures.items():
        if fig is None:
            continue
        label = "DuckDB" if engine == "duckdb" else "Spark local[2]"
        for k, r in enumerate(fig["runs"], 1):
            jvm = f"{fig['jvm_peak_mb']:>13,.0f}" if "jvm_peak_mb" in fig else f"{'-':>13}"
            print(f"  {label:<14}{k:>4}{r['wall']:>9.2f}{r['cpu']:>9.2f}"
                  f"{rows / r['wall']:>14,.0f}{fig['python_peak_mb']:>16,.0f}{jvm}")
    if all(figures.values()):
        a, b = (np.load(os.path.join(directory, f"{e}.npz")) for e in ("duckdb", "spark"))
        same = set(a.files) == set(b.files) and all(np.array_equal(a[k], b[k]) for k in a.files)
        total = sum(float(a[k].sum()) for k in a.files[:1])
        print(f"  marginals: {figures['duckdb']['cells']:,} cells per engine; "
              f"{'IDENTICAL' if same else 'DIFFERENT'} (first marginal sums to {total:,.0f})")
    os.remove(parquet)
    spark = figures.get("spark")
    return sum(r["wall"] for r in spark["runs"]) if spark else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--large", type=int, default=100_000_000,
                    help="also at this many rows, where disk and --max-seconds allow (0: no)")
    ap.add_argument("--max-seconds", type=float, default=900)
    ap.add_argument("--partitions", type=int, default=None,
                    help="spark.sql.shuffle.partitions (default: Spark's, 200)")
    ap.add_argument("--dir", default=None, help="where the Parquet files go (a temp dir)")
    ap.add_argument("--worker", choices=("duckdb", "spark"), help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.data, args.out, args.partitions)
        return 0
    directory = tempfile.mkdtemp(prefix="dpsql-spark-bench-", dir=args.dir)
    print(f"dpsql data path, DuckDB (2 threads) against Spark local[2] "
          f"(spark.driver.memory=1g, shuffle partitions "
          f"{args.partitions or 'Spark default (200)'}); machine: {os.cpu_count()} cores")
    try:
        spark_seconds = compare(directory, args.rows, args.partitions)
        if args.large:
            free = shutil.disk_usage(directory).free
            need = 1.2 * args.large / args.rows * 200 * 2 ** 20     # generous per-10M size
            predicted = (spark_seconds or float("inf")) * args.large / args.rows
            if free < need:
                print(f"\n{args.large:,} rows skipped: {free / 2 ** 30:.1f} GB free on disk, "
                      f"about {need / 2 ** 30:.1f} GB needed")
            elif predicted > args.max_seconds:
                print(f"\n{args.large:,} rows skipped: predicted {predicted:,.0f} s for "
                      f"Spark's two runs from the {args.rows:,}-row run, over --max-seconds "
                      f"{args.max_seconds:g}")
            else:
                compare(directory, args.large, args.partitions)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    main()
    sys.exit(0)
