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
is printed first. Last, the latency of a cancel during the parse of the 24,975-statement
text (wall milliseconds from the cancel to the error; the machine is shared), written one
statement a line (``text``) and all on one line (``line``: statements separated by ``; ``).

``--dbapi``: also through the DB-API (:func:`dbapi_cancel_latency`), where the text is
read for parameters, markers and result-table reads before the request starts.

Run: ``python benchmarks/parse_speed.py [--repeat 3] [--pure] [--cancel-only] [--dbapi]``
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _PurePython:
    """``--pure``: import sqlglot from its ``.py`` sources even where sqlglotc's compiled
    modules sit beside them (the same install timed both ways)."""

    def find_spec(self, name, path=None, target=None):
        if name != "sqlglot" and not name.startswith("sqlglot."):
            return None
        from importlib.machinery import SOURCE_SUFFIXES, FileFinder, SourceFileLoader
        for entry in path or sys.path:
            spec = FileFinder(entry or ".", (SourceFileLoader, SOURCE_SUFFIXES)).find_spec(name)
            if spec is not None:
                return spec
        return None


if "--pure" in sys.argv:
    sys.meta_path.insert(0, _PurePython())

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
    import dpsql
    lines = [f"{compiled_sqlglot()}; python {sys.version.split()[0]}; dpsql from "
             f"{os.path.dirname(os.path.dirname(dpsql.__file__))}",
             f"{'batch':<20} {'form':<6} {'statements':>10} {'parse s':>8} {'compile s':>9}"
             f" {'parse ms/stmt':>13}"]
    print("\n".join(lines), flush=True)
    for name, policy, sql in batches():
        resolve = (lambda p: lambda table, node: p)(policy)
        parse_batch(sql[:3], resolve)                     # warm: imports, dialect, caches
        for form, given in (("list", sql), *texts(sql)):
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


def texts(sql: list[str]) -> list[tuple[str, str]]:
    """The batch as one text: a statement a line, and all on one line."""
    return [("text", ";\n".join(sql) + ";"), ("line", "; ".join(sql) + ";")]


def cancel_latency(delays=(0.05, 0.2, 0.5, 1.0, 2.0)) -> list[str]:
    """Wall milliseconds from a token's cancel (another thread, after ``delay`` seconds) to
    RequestCancelled out of the parse of the 24,975-statement text (each of :func:`texts`),
    and how many statements the parse had read into the IR by then (0: the cancel landed
    while tokenizing)."""
    import threading

    from dpsql import cancel
    from dpsql.errors import RequestCancelled
    from dpsql.sql import parse
    _, policy, sql = batches()[1]
    parsed = [0]
    real = parse._statement

    def counting(*args):
        parsed[0] += 1
        return real(*args)

    parse._statement = counting
    lines = []
    try:
        for (form, text), delay in ((t, d) for t in texts(sql) for d in delays):
            token, stamp, parsed[0] = cancel.Token(), [], 0
            timer = threading.Timer(delay, lambda: (stamp.append(time.perf_counter()),
                                                    token.cancel()))
            timer.start()
            try:
                with cancel.scope(token):
                    parse.parse_batch(text, lambda table, node: policy)
                lines.append(f"{form}: cancel after {delay:.2f} s: parse finished first")
            except RequestCancelled:
                lines.append(f"{form}: cancel after {delay:.2f} s: landed in "
                             f"{1000 * (time.perf_counter() - stamp[0]):.1f} ms, "
                             f"{parsed[0]:,} statements parsed")
            timer.join()
            print(lines[-1], flush=True)
    finally:
        parse._statement = real
    return lines


def dbapi_cancel_latency(delays=(0.5, 2.0, 5.0), patience: float = 90.0) -> list[str]:
    """The DB-API route: ``cursor.execute`` of the one-line 24,975-statement text on a copy
    of the Adult demo table in a thread, ``Connection.cancel()`` from this one after
    ``delay`` seconds; wall milliseconds from the call to the execute's error (nothing is
    charged before the parse ends). Waits ``patience`` seconds for it at most."""
    import shutil
    import tempfile
    import threading

    from benchmarks.highdim_sql import _adult_db
    from dpsql.interfaces import dbapi
    text = texts(batches()[1][2])[1][1]
    where = tempfile.mkdtemp()
    path = os.path.join(where, "adult.duckdb")
    _adult_db(path).close()
    lines, stuck = [], False
    for delay in delays:
        conn = dbapi.connect(path, epsilon=0.1, delta=1e-8)
        done: list = []

        def run() -> None:
            try:
                conn.cursor().execute(text)
                done.append((time.perf_counter(), "finished (charged)"))
            except dbapi.Error as exc:
                done.append((time.perf_counter(), type(exc).__name__))

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        time.sleep(delay)
        stamp = time.perf_counter()
        conn.cancel()
        thread.join(patience)
        if not done:
            stuck = True
            lines.append(f"dbapi line: cancel after {delay:.2f} s: not landed after "
                         f"{patience:.0f} s")
        else:
            lines.append(f"dbapi line: cancel after {delay:.2f} s: {done[0][1]} in "
                         f"{1000 * (done[0][0] - stamp):.1f} ms")
        print(lines[-1], flush=True)
        if stuck:
            break              # the thread still holds the database: no further trial
        conn.close()
    if not stuck:
        shutil.rmtree(where)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pure", action="store_true",
                    help="sqlglot's pure-Python modules even where sqlglotc is installed")
    ap.add_argument("--cancel-only", action="store_true", help="the cancel latencies only")
    ap.add_argument("--dbapi", action="store_true",
                    help="also the DB-API route (execute in a thread, Connection.cancel())")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    if not args.cancel_only:
        run(args.repeat)
    cancel_latency()
    if args.dbapi:
        dbapi_cancel_latency()
        os._exit(0)            # a trial whose cancel never landed may still be running


if __name__ == "__main__":
    main()
