"""Parse and compile speed of large SQL batches (issues 16 and 21), process CPU seconds.

Two batches, each timed as a list of statements (as the benchmarks and the DB-API send
them) and as one multi-statement text (as a script or the shell sends it):

- ``points+ranges``: issue 21's 1,024 point queries and 1,500 random ranges on one integer
  column (:func:`benchmarks.strategies.points_and_ranges`), 2,524 statements;
- ``ranges x marginals``: :func:`benchmarks.highdim_sql.ranges_sql`, 24,975 statements over
  the Adult demo table.

``parse`` is :func:`dpsql.sql.parse.parse_batch` (the allow-list parse to the IR, nothing
remembered); ``compile`` is :func:`dpsql.sql.implicit.compile_batch` (the form the matrix
mechanism's explain compiles). Each phase is timed ``--repeat`` times in this process (the
first run after the imports and one warm-up parse of a few statements); the table shows the
median. Whether sqlglot's compiled build (``sqlglotc``, the ``sqlglot[c]`` extra) is loaded
is printed first.

Run: ``python benchmarks/parse_speed.py [--repeat 3]``
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.highdim_sql import ADULT_SPEC, ranges_sql  # noqa: E402
from benchmarks.strategies import points_and_ranges  # noqa: E402
from dpsql.policy.policy import table_policy_from_spec  # noqa: E402
from dpsql.sql.implicit import compile_batch  # noqa: E402
from dpsql.sql.parse import parse_batch  # noqa: E402


def compiled_sqlglot() -> str:
    """Which sqlglot build is loaded: the compiled one, or pure Python."""
    import sqlglot
    import sqlglot.expressions.core
    import sqlglot.parser
    import sqlglot.tokenizer_core
    compiled = [m.__name__ for m in (sqlglot.tokenizer_core, sqlglot.parser,
                                     sqlglot.expressions.core)
                if not str(getattr(m, "__file__", "")).endswith(".py")]
    version = getattr(sqlglot, "__version__", "?")
    return (f"sqlglot {version}, compiled modules: {', '.join(compiled)}" if compiled
            else f"sqlglot {version}, pure Python")


def batches() -> list[tuple[str, object, list]]:
    points = table_policy_from_spec("t", {"epsilon": 10.0, "delta": 1e-5, "columns": {
        "x": {"type": "integer", "min": 0, "max": 1023, "step": 1}}})
    adult = table_policy_from_spec("adult", ADULT_SPEC)
    return [("points+ranges", points, points_and_ranges()[1]),
            ("ranges x marginals", adult, ranges_sql())]


def cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def timed(fn) -> tuple[float, object]:
    gc.collect()
    t = cpu()
    out = fn()
    return cpu() - t, out


def run(repeat: int) -> list[str]:
    lines = [f"{compiled_sqlglot()}; python {sys.version.split()[0]}",
             f"{'batch':<20} {'form':<6} {'statements':>10} {'parse s':>8} {'compile s':>9}"
             f" {'parse ms/stmt':>13}"]
    print("\n".join(lines), flush=True)
    for name, policy, sql in batches():
        resolve = (lambda p: lambda table, node: p)(policy)
        parse_batch(sql[:3], resolve)                     # warm: imports, dialect, caches
        for form, given in (("list", sql), ("text", ";\n".join(sql) + ";")):
            parse_s, compile_s = [], []
            for _ in range(repeat):
                seconds, queries = timed(lambda: parse_batch(given, resolve))
                parse_s.append(seconds)
                seconds, _ = timed(lambda: compile_batch(queries, policy))
                compile_s.append(seconds)
            p, c = statistics.median(parse_s), statistics.median(compile_s)
            lines.append(f"{name:<20} {form:<6} {len(sql):>10,} {p:>8.2f} {c:>9.2f}"
                         f" {1000 * p / len(sql):>13.3f}")
            print(lines[-1], flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    run(args.repeat)


if __name__ == "__main__":
    main()
