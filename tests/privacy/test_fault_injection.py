"""Fault injection at every step boundary of the one release path, for every release route.

For each route (matrix Gaussian, matrix Laplace, answers free from reuse, accuracy first,
MWEM, d_X Laplace, d_X MWEM, d_X SmallDB (the d_X exponential mechanism), a batch of three
result tables, and the implicit path of issue 16 — a batch over a product above
``DENSE_MAX_CELLS`` compiled to Kronecker blocks and measured through the cliques' marginals,
with the Gaussian ``residual`` plan and the Laplace ``marginals`` plan — and the joint
release of issue 20, a batch mixing COUNT, SUM and AVG read by one ``data_vectors`` call)
and each step
boundary of ``dpsql/release/path.py`` and the kernel (after the plan, before the charge,
after the charge's commit, after the data vector or the marginals are read, after the first
noise draw, after the kernel returns, after inference, after the result rows are staged and
after every result table is created (one bulk write, :func:`dpsql.store.database.
write_tables`), before
and after ``mark_released``, after the measurements are stored, after the results' commit),
a child process runs the release and

- **kill**: is SIGKILLed there (no handler, no cleanup, no ``finally``);
- **raise**: has ``KeyboardInterrupt`` raised there (an interrupt that is not a signal);
- **sigint**: sends itself SIGINT there (a real Ctrl-C, which the release path defers from
  the start of the release to the committed result tables).

Then, after reopening the database as a new process would (:func:`check_invariant`): every
``released`` entry has all its result tables with all their rows and, for the matrix routes,
its stored measurements (the implicit path's as pieces); a ``charged``-only entry has none
of them and exists only after a fault at or after the charge (never after a pre-charge
fault, never after a Ctrl-C, which completes the release); no table is orphaned; the budget
read back equals the exact sum of the ledger. After a kill before the charge, after it, just
before the results' commit and after it, a new process retries the same request: it is a
normal release charged once more (docs/threat-model.md D11: an unnamed retry is paid again;
free only from released measurements, the reuse route), and the totals read back exactly.
On the implicit routes a kill is injected at every point, the raised interrupt and Ctrl-C
only from the charge to the inference (:data:`KERNEL_SECTION`, their own code) and the
retry follows only the kill after the charge: planning's cancel, the write step and the
retry are the shared path's code, covered by the dense routes (keeps the file fast).

Faults are injected by patching module attributes in a child forked from one driver process
(``python -c``, dpsql imported once); the library has no hooks for it. The step boundaries are
enumerated from the code: :func:`test_every_call_of_the_path_is_a_known_step` fails when a
call is added to the path, or to the kernel's release methods and the functions of the
kernel's modules they reach (the implicit section ``release_marginals`` and its helpers, the
scale checks, the data reads of ``dpsql/kernel/data.py``), without being classified here, and
:func:`test_an_unfaulted_release_reaches_every_declared_point` fails when a route no longer
reaches the points declared for it.
"""

from __future__ import annotations

import ast
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
from fractions import Fraction

import duckdb
import pytest

from ..conftest import ADULT_POLICY, ROOT, adult_csv

SEX = "SELECT sex, COUNT(*) FROM adult GROUP BY sex"
TWO = SEX + "; SELECT COUNT(*) FROM adult WHERE age BETWEEN 20 AND 30"
THREE = ("CREATE TABLE weekly_sex AS SELECT sex, COUNT(*) FROM adult GROUP BY sex;\n"
         "SELECT race, COUNT(*) FROM adult WHERE age < 40 GROUP BY race;\n"
         "CREATE TABLE weekly_total AS SELECT COUNT(*) FROM adult WHERE income = '>50K'")
#: batches over a product of parts above ``DENSE_MAX_CELLS`` (age 74 × sex × race × income:
#: 1,480 > 1,024), compiled to Kronecker blocks and measured through marginals (issue 16):
#: all six 2-way GROUP BYs plan the Gaussian ``residual`` strategy at δ > 0; two disjoint
#: 2-way GROUP BYs plan Laplace on each clique's marginal (``marginals``) at δ = 0
PAIRS = ";\n".join(f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}" for a, b in
                   [("age", "sex"), ("age", "race"), ("age", "income"), ("sex", "race"),
                    ("sex", "income"), ("race", "income")])
SPLIT = ("SELECT age, race, COUNT(*) FROM adult GROUP BY age, race;\n"
         "SELECT sex, income, COUNT(*) FROM adult GROUP BY sex, income")
#: a batch mixing COUNT, SUM and AVG: one joint release of three blocks (issue 20)
SUMS = ("SELECT sex, SUM(hours_per_week) FROM adult GROUP BY sex;\n"
        "SELECT race, AVG(CLAMP(age, 17, 80)) FROM adult GROUP BY race;\n"
        "SELECT COUNT(*) FROM adult WHERE income = '>50K'")
METRIC = {"epsilon": 50, "columns": {"age": {"weight": 0.1}, "sex": {"different": 1}}}
ROWS = 400

#: route: (request, whether a release stores measurements for reuse)
ROUTES = {
    "gaussian": (dict(sql=TWO, epsilon=0.5, delta=1e-6, strategy="identity"), True),
    "laplace": (dict(sql=TWO, epsilon=0.5, delta=0), True),
    "reuse": (dict(sql=SEX, epsilon=0.5, delta=0, reuse=True), False),
    "accuracy": (dict(sql=TWO, target_rmse=40, delta=1e-6, confirm=True), True),
    "mwem": (dict(sql=TWO, epsilon=0.5, delta=0, strategy="mwem(rounds=2)"), False),
    "dx_laplace": (dict(sql=TWO, epsilon=1, delta=0, model="metric"), False),
    "dx_mwem": (dict(sql=TWO, epsilon=1, delta=0, model="metric",
                     strategy="dx_mwem(rounds=2)"), False),
    "dx_smalldb": (dict(sql=SEX, epsilon=1, delta=0, model="metric",
                        strategy="dx_smalldb(size=4)"), False),
    "batch3": (dict(sql=THREE, epsilon=0.25, delta=1e-6, strategy="workload"), True),
    "implicit_residual": (dict(sql=PAIRS, epsilon=0.5, delta=1e-6), True),
    "implicit_marginals": (dict(sql=SPLIT, epsilon=0.5, delta=0), True),
    "joint": (dict(sql=SUMS, epsilon=0.5, delta=1e-6), False),
}
#: the implicit routes and the strategy each must plan (checked by the unfaulted run)
IMPLICIT = {"implicit_residual": "residual", "implicit_marginals": "marginals"}

#: step boundaries, in path order: (name, target, before/after the call, which call,
#: the ledger state a kill there leaves: none / charged / released)
POINTS = [
    ("planned", "dpsql.release.path:mechanism", "planner", 1, "none"),
    ("before_charge", "dpsql.store.ledger:charge", "before", 1, "none"),
    ("charged", "dpsql.store.ledger:charge", "after", 1, "charged"),
    ("data_vector", "dpsql.engines.duckdb:data_vector", "after", 1, "charged"),
    ("data_vectors", "dpsql.engines.duckdb:data_vectors", "after", 1, "charged"),
    ("marginals", "dpsql.engines.duckdb:marginals", "after", 1, "charged"),
    ("noise", "sampler", "after", 1, "charged"),
    ("measured", "dpsql.release.path:KernelHandle.receipt", "after", 1, "charged"),
    ("inferred", "dpsql.release.path:write_results", "before", 1, "charged"),
    ("staged", "dpsql.store.database:_store_rows", "after", 1, "charged"),
    ("tables", "dpsql.store.database:_create_tables", "after", 1, "charged"),
    ("before_mark", "dpsql.store.ledger:mark_released", "before", 1, "charged"),
    ("after_mark", "dpsql.store.ledger:mark_released", "after", 1, "charged"),
    ("measurements", "dpsql.mechanisms.reuse.records:store", "after", 1, "charged"),
    ("committed", "dpsql.release.path:write_results", "after", 1, "released"),
]
PHASE = {p[0]: p[4] for p in POINTS}
#: where a kill is followed by a retry in a new process: one point per state a kill can
#: leave (the states of the points between them are the same ledger rows, no tables), and
#: the last one before the results' commit (tables and marks written, not committed)
RETRIED = {"planned", "charged", "after_mark", "committed"}
#: where a real Ctrl-C is sent: the boundaries of the guard (it starts after planning and the
#: budget pre-check, ends with the results' commit) and one point of each step between;
#: kill and the raised interrupt cover every point
SIGNALLED = {"planned", "before_charge", "charged", "noise", "inferred", "staged",
             "after_mark", "committed"}
#: on the implicit routes, where the raised interrupt and Ctrl-C are injected and a kill is
#: retried: their own code, from the charge in ``release_marginals`` to the inference (the
#: rest is the shared path's, covered by the dense routes; a kill still hits every point)
KERNEL_SECTION = {"charged", "marginals", "noise", "measured", "inferred"}
IMPLICIT_RETRIED = {"charged"}
_NOT = {"reuse": {"data_vector", "noise", "measurements"},
        "dx_smalldb": {"measurements"},
        **{r: {"data_vector"} for r in IMPLICIT}, "joint": {"data_vector"}}
#: the points only some routes reach: the implicit routes read marginals, not x; the joint
#: release reads x and the value sums in one call
_ONLY = {"marginals": set(IMPLICIT), "data_vectors": {"joint"}}
#: the points each route reaches (checked against an unfaulted run)
REACHED = {r: [p[0] for p in POINTS
               if p[0] not in _NOT.get(r, set()) and r in _ONLY.get(p[0], {r})
               and (p[0] != "measurements" or ROUTES[r][1])] for r in ROUTES}

# ------------------------------------------------------------------ the child's side


def _resolve(target: str):
    module_name, attribute = target.split(":")
    owner = __import__(module_name, fromlist=["_"])
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name


def _fire(name: str, mode: str, seen: list) -> None:
    if mode == "record":
        if name not in seen:
            seen.append(name)
    elif mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "raise":
        raise KeyboardInterrupt(f"injected at {name}")
    elif mode == "sigint":
        seen.append(name)
        os.kill(os.getpid(), signal.SIGINT)   # Python runs the handler at the next bytecode


class _Sampler:
    """The kernel's sampler, seen through: every draw is a call of ``hook``."""

    def __init__(self, sampler, hook):
        self._sampler, self._hook = sampler, hook

    def __getattr__(self, name):
        value = getattr(self._sampler, name)
        if name.startswith("_") or not callable(value):
            return value
        return lambda *a, **k: self._hook(value, a, k)


def install(db, points: list, mode: str, seen: list) -> None:
    """Patch the targets of ``points`` (names) so that each fires ``mode`` at its place."""
    by_target: dict = {}
    for name, target, when, nth, _ in POINTS:
        if name in points:
            by_target.setdefault(target, []).append((when, nth, name))

    def wrap(original, marks):
        calls = []

        def wrapped(*args, **kwargs):
            calls.append(1)
            for when, nth, name in marks:
                if when == "before" and len(calls) == nth:
                    _fire(name, mode, seen)
            result = original(*args, **kwargs)
            for when, nth, name in marks:
                if when in ("after", "planner") and len(calls) == nth:
                    if when == "planner":      # the planner returned is wrapped instead
                        return wrap(result, [("after", 1, name)])
                    _fire(name, mode, seen)
            return result
        return wrapped

    for target, marks in by_target.items():
        if target == "sampler":
            hook = wrap(lambda f, a, k: f(*a, **k), marks)
            db.kernel.sampler = _Sampler(db.kernel.sampler, hook)
            continue
        owner, attribute = _resolve(target)
        setattr(owner, attribute, wrap(getattr(owner, attribute), marks))


def run_job(job: dict) -> dict:
    """In the child: install the fault, run the route's request, say how it ended."""
    import dpsql

    request = dict(ROUTES[job["route"]][0], replace=True)
    sql = request.pop("sql")
    seen: list = []
    with dpsql.connect(job["path"], reuse=request.pop("reuse", False)) as db:
        install(db, job["points"], job["mode"], seen)
        try:
            release = db.answer(sql, **request)
            return {"outcome": "returned", "release_id": release.release_id, "seen": seen,
                    "strategy": release.strategy}
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            return {"outcome": type(exc).__name__, "message": str(exc)[:300], "seen": seen}


def serve() -> None:
    """The driver: one job per stdin line (JSON), each run in a forked child. The first
    line names a scratch database per route: each route runs once here, unfaulted, so that
    the children start warm (imports, parsed batches, lazily built tables)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started ignoring it
    for route, path in json.loads(sys.stdin.readline()).items():
        run_job(dict(path=path, route=route, points=[], mode="none"))
        os.remove(path)
    print("READY", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                result = run_job(job)
                with open(job["out"], "w") as f:
                    json.dump(result, f)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        done = {"signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None}
        if os.path.exists(job["out"]):
            with open(job["out"]) as f:
                done.update(json.load(f))
            os.remove(job["out"])
        print(json.dumps(done), flush=True)


# ------------------------------------------------------------------ the test's side

class Driver:
    """One driver process for the module; :meth:`run` forks a child per job."""

    def __init__(self, tmp, warm: dict):
        env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1",
                   OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        code = ("import sys; sys.path.insert(0, %r); "
                "from tests.privacy.test_fault_injection import serve; serve()" % str(ROOT))
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env,
                                     cwd=str(ROOT))
        self.out = os.path.join(tmp, "result.json")
        self.proc.stdin.write(json.dumps(warm) + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "READY", "the driver did not start"

    def run(self, path: str, route: str, points=(), mode: str = "none") -> dict:
        job = dict(path=path, route=route, points=list(points), mode=mode, out=self.out)
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the driver died (exit {self.proc.poll()})"
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def driver(templates, scratch):
    warm = {route: _fresh(templates, route, scratch, "warm") for route in ROUTES}
    d = Driver(scratch, warm)
    yield d
    d.close()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """Where the faulted databases live: memory-backed when the machine has /dev/shm (each
    release commits twice; fsyncs on a shared disk would dominate the time), else tmp."""
    import tempfile

    shm = "/dev/shm"
    folder = (tempfile.mkdtemp(prefix="dpsql-faults-", dir=shm) if os.path.isdir(shm)
              and os.access(shm, os.W_OK) else str(tmp_path_factory.mktemp("faults")))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def templates(scratch):
    """Per route, a small protected database (ROWS rows of Adult, a standard and a metric
    budget; the reuse route's holds the released measurements it answers from) and its
    ledger as :func:`check_invariant` reads it."""
    import dpsql

    base = os.path.join(scratch, "base.duckdb")
    con = duckdb.connect(base)
    con.execute(f"CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true) "
                f"USING SAMPLE {ROWS} ROWS (reservoir, 7)", [adult_csv()])
    con.close()
    policy = copy.deepcopy(ADULT_POLICY)
    policy.update(epsilon=10, delta=1e-3, metric=METRIC, rows=ROWS)
    with dpsql.connect(base) as db:
        db.protect("adult", policy)
    out = {}
    for route in ROUTES:
        out[route] = os.path.join(scratch, f"template-{route}.duckdb")
        shutil.copyfile(base, out[route])
    with dpsql.connect(out["reuse"]) as db:
        db.answer(SEX, epsilon=1, delta=0)
    for route, path in out.items():      # plans cached in the database, as in production
        request = dict(ROUTES[route][0])
        request.pop("confirm", None)
        with dpsql.connect(path, reuse=request.pop("reuse", False)) as db:
            db.explain(request.pop("sql"), **request)
    return {route: (path, check_invariant(path)) for route, path in out.items()}


def _fresh(templates, route, folder, tag) -> str:
    path = os.path.join(folder, f"{route}-{tag}.duckdb")
    shutil.copyfile(templates[route][0], path)
    return path


def check_invariant(path: str) -> dict:
    """The invariant (module docstring), read with plain DuckDB, then with dpsql. Returns
    ``{release_id: (status, epsilon_exact, metric_epsilon_exact)}``."""
    import dpsql
    from dpsql.noise.accounting import fraction_from_text

    con = duckdb.connect(path)                       # replays the WAL like any restart
    try:
        rows = con.execute("SELECT release_id, status, epsilon_exact, metric_epsilon_exact, "
                           "result_tables, mechanism, strategy FROM dpsql.ledger "
                           "ORDER BY release_id").fetchall()
        linked = con.execute("SELECT release_id, table_name, n_rows FROM "
                             "dpsql.release_tables").fetchall()
        stored = {r[0] for r in con.execute("SELECT release_id FROM dpsql.measurements").fetchall()}
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables WHERE "
                                            "table_schema = 'main' AND table_name <> 'adult'").fetchall()}
        counts = {t: con.execute(f'SELECT count(*) FROM main."{t}"').fetchone()[0]
                  for t in tables}
        answers = set()                 # the releases with stored answers: shared tables
        for (name,) in con.execute(     # answers_<types> (rows by _release), or r<release>_<k>
                "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'dpsql_results'"
        ).fetchall():
            answers |= ({r[0] for r in con.execute(
                f'SELECT DISTINCT _release FROM dpsql_results."{name}"').fetchall()}
                if name.startswith("answers_") else {int(name[1:].split("_")[0])})
    finally:
        con.close()
    status = {r[0]: r[1] for r in rows}
    linked_by: dict = {}
    for release_id, table, n_rows in linked:
        linked_by.setdefault(release_id, []).append(table)
        assert status.get(release_id) == "released", (release_id, status)
        assert counts.get(table) == n_rows, (table, counts.get(table), n_rows)
    for release_id, st, _, _, names, mechanism, strategy in rows:
        assert st in ("charged", "released"), st
        if st == "released":          # every table, every row; the matrix's measurements
            assert sorted(linked_by.get(release_id, [])) == sorted(names)   # (dense or
            kept = not strategy.startswith("joint(")   # implicit; joint releases': not kept)
            assert (release_id in stored) == (mechanism in ("gaussian", "laplace") and kept), \
                (release_id, mechanism, strategy)
        else:                         # nothing of it
            assert release_id not in linked_by and release_id not in stored
    assert tables <= {t for ts in linked_by.values() for t in ts}, "an orphan table"
    assert answers <= {r[0] for r in rows if r[1] == "released"}, "stored answers orphaned"
    epsilon = sum((fraction_from_text(r[2]) for r in rows), Fraction(0))
    metric = sum((fraction_from_text(r[3]) for r in rows if r[3]), Fraction(0))
    with dpsql.connect(path) as db:                  # dpsql reopens it and agrees exactly
        budget = db.budget("adult")
    assert budget["basic_epsilon"] == epsilon and budget["metric_epsilon_spent"] == metric
    return {r[0]: (r[1], fraction_from_text(r[2]),
                   fraction_from_text(r[3]) if r[3] else Fraction(0)) for r in rows}


def _new(before: dict, after: dict) -> dict:
    assert all(after.get(k, (None,))[1:] == v[1:] for k, v in before.items()), "ledger rewritten"
    return {k: v for k, v in after.items() if k not in before}


def _cost(route: str):
    """(ε, metric ε) one release of ``route`` charges; None when found by the request
    (accuracy first: the smallest ε meeting the target)."""
    request = ROUTES[route][0]
    if route == "reuse":
        return Fraction(0), Fraction(0)
    if "epsilon" not in request:
        return None
    eps = Fraction(str(request["epsilon"]))
    return (Fraction(0), eps) if request.get("model") == "metric" else (eps, Fraction(0))


# ------------------------------------------------------------------ the tests

#: every call made by the path's steps and the kernel's release methods: the fault point
#: that covers it, or why none is needed (it writes nothing and reads no data)
PURE = "pure"
KNOWN_CALLS = {
    ("dpsql/release/path.py", "answer"): {
        "ledger.find_named": PURE, "named.recorded_answer": PURE,
        "mechanism": "planned", "mechanism(ask)": "planned", "cancel.check": PURE,
        "locked": PURE, "contextlib.nullcontext": PURE, "_locked_release": PURE},
    # the locked section (planning runs without the database lock, issue 22 item 2)
    ("dpsql/release/path.py", "_locked_release"): {
        "ledger.find_named": PURE, "named.recorded_answer": PURE, "check_unchanged": PURE,
        "check_targets": PURE, "result_names": PURE, "_charge": PURE, "_check_budget": PURE,
        "cancel.check": PURE, "cancel.committed": PURE,
        "_completed_on_interrupt": PURE, "_interrupts_deferred": PURE, "KernelHandle": PURE,
        "plan.measure": "charged", "handle.receipt": "measured", "plan.infer": "inferred",
        "write": "committed", "done.append": PURE, "InterruptedAfterRelease": PURE},
    ("dpsql/release/path.py", "write_results"): {
        "engine.engine_errors": PURE, "con.execute": "after_mark", "zip": PURE,
        "build_columns": PURE, "engine.write_tables": "tables", "list": PURE, "tuple": PURE,
        "len": PURE, "results.append": PURE, "ResultTable": PURE, "recorded.append": PURE,
        "tables.append": PURE,
        "ledger.mark_released": "before_mark", "records.store": "measurements"},
    ("dpsql/release/path.py", "publish"): {"write_results": "committed", "make": PURE,
                                           "list": PURE},
}
#: the kernel's calls that charge, read data or draw noise (in its release methods and in
#: every function of the modules of dpsql/kernel/ they reach, :func:`_kernel_calls`)
_KERNEL = {"ledger.charge": "charged", "_data_vector": "data_vector",
           "engine.data_vector": "data_vector", "_clique_marginals": "marginals",
           "engine.marginals": "marginals", "_data_vectors": "data_vectors",
           "engine.data_vectors": "data_vectors",
           # the Spark branch's reads: through the source's Reader (DuckDB's engine module
           # or Spark's, the same fault points), after the catalog read before the charge
           "read.data_vector": "data_vector", "read.data_vectors": "data_vectors",
           "read.marginals": "marginals", "engine.columns": PURE,
           # the engine's query pieces (values only), and the per-unit selection key read
           # beside the policy for that query (reads no data, writes nothing)
           "query.Cap": PURE, "query.Sum": PURE, "ledger.unit_key": PURE,
           "self.sampler.sample": "noise", "self.sampler.laplace": "noise",
           "algorithm": "noise", "plan.measure": PURE, "oracle.close": PURE}
#: what touches the ledger, the data or the sampler (``ledger.Charge`` is the charge's type)
_TOUCHING = ("ledger.", "engine.", "read.", "query.", "self.sampler", "kernel.sampler",
             "_data_vector",
             "_clique_marginals", "algorithm", "con.")
#: the kernel's release entry points (all in dpsql/kernel/boundary.py): each charges and
#: reads data exactly where a point is
_ENTRIES = {("Kernel", "release"): "_data_vector", ("Kernel", "release_per_query"): "_data_vector",
            ("Kernel", "release_adaptive"): "_data_vector",
            ("Kernel", "release_adaptive_metric"): "_data_vector",
            ("Kernel", "release_marginals"): "_clique_marginals",
            ("Kernel", "release_adaptive_marginals"): "_clique_marginals",
            ("Kernel", "release_joint"): "_data_vectors"}
#: the kernel's data reads (dpsql/kernel/data.py, the one module importing the engines): each
#: makes its engine call, which a point covers
_READS = {"_data_vector": "read.data_vector", "_clique_marginals": "read.marginals",
          "_data_vectors": "read.data_vectors"}
KERNEL = ROOT / "dpsql" / "kernel"


def _calls(source: str, function: str, cls: str | None = None) -> set:
    tree = ast.parse(source)
    scope = tree if cls is None else next(n for n in tree.body if isinstance(n, ast.ClassDef)
                                          and n.name == cls)
    fn = next(n for n in ast.walk(scope) if isinstance(n, ast.FunctionDef) and n.name == function)
    return {ast.unparse(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)}


def _kernel_modules() -> dict:
    """Each module of dpsql/kernel/ (by stem): its source, its module-level functions, its
    classes' methods, and the names it imports from the other kernel modules."""
    out = {}
    for path in sorted(KERNEL.glob("*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        imported = {a.asname or a.name: (node.module.rsplit(".", 1)[1], a.name)
                    for node in tree.body if isinstance(node, ast.ImportFrom)
                    and (node.module or "").startswith("dpsql.kernel.") for a in node.names}
        out[path.stem] = {
            "source": source, "imported": imported,
            "functions": {n.name for n in tree.body if isinstance(n, ast.FunctionDef)},
            "methods": {c.name: {n.name for n in c.body if isinstance(n, ast.FunctionDef)}
                        for c in tree.body if isinstance(c, ast.ClassDef)}}
    return out


def _kernel_calls(modules: dict, module: str, function: str, cls: str | None) -> dict:
    """The calls of ``function`` and of every function of the kernel's modules it reaches (a
    module-level function called by name, in its module or imported from another kernel
    module; a method called on ``self``), by caller: ``{"boundary:Kernel.release": {...},
    "data:_data_vector": {...}, ...}``."""
    out, todo = {}, [(module, cls, function)]
    while todo:
        mod, owner, name = todo.pop()
        key = f"{mod}:{owner}.{name}" if owner else f"{mod}:{name}"
        if key in out:
            continue
        here = modules[mod]
        out[key] = found = _calls(here["source"], name, owner)
        for call in found:
            if call in here["functions"]:
                todo.append((mod, None, call))
            elif call in here["imported"]:
                other, target = here["imported"][call]
                if target in modules[other]["functions"]:
                    todo.append((other, None, target))
            elif call.startswith("self.") and owner and call[5:] in here["methods"][owner]:
                todo.append((mod, owner, call[5:]))
    return out


def test_every_call_of_the_path_is_a_known_step():
    """Passing: every call in ``path.answer``, ``write_results`` and ``publish`` is classified
    above (a fault point covers it, or it writes nothing); the kernel's release methods call
    the ledger, the data and the sampler only where a point covers them. A new step fails
    here until it is classified (and given a fault point if it writes or reads data)."""
    names = {p[0] for p in POINTS}
    for (file, function), known in KNOWN_CALLS.items():
        found = _calls((ROOT / file).read_text(), function)
        assert found == set(known), (f"{file}:{function}: calls not classified here: "
                                     f"{sorted(found - set(known))}; classified but gone: "
                                     f"{sorted(set(known) - found)}")
        assert {v for v in known.values() if v != PURE} <= names
    modules = _kernel_modules()
    reached = set()
    for (cls, method), reads in _ENTRIES.items():
        by_caller = _kernel_calls(modules, "boundary", method, cls)
        reached |= set(by_caller)
        for caller, found in by_caller.items():
            touching = {c for c in found if c.startswith(_TOUCHING)}
            assert touching <= set(_KERNEL), \
                f"{caller} (from {method}): unclassified {sorted(touching - set(_KERNEL))}"
            # the engines are called from the data module only (as the contract imports)
            assert caller.startswith("data:") or not any(c.startswith("engine.") for c in found), \
                (caller, sorted(found))
        found = by_caller[f"boundary:{cls}.{method}" if cls else f"boundary:{method}"]
        assert "ledger.charge" in found and reads in found, (method, sorted(found))
        # every entry draws its noise where the point covers it (after the charge and read)
        assert any(_KERNEL.get(c) == "noise" for f in by_caller.values() for c in f), method
    for read, call in _READS.items():
        assert call in _calls(modules["data"]["source"], read), (read, call)
    # the implicit section is reached from Kernel.release, with its helpers and the data reads
    assert {"boundary:Kernel.release_marginals", "boundary:_measure_marginal",
            "boundary:Kernel._noisy", "scales:_checked_marginal_scale",
            "scales:_checked_laplace", "scales:_checked_gaussian", "data:_data_vector",
            "data:_clique_marginals"} <= reached, sorted(reached)
    assert {v for v in _KERNEL.values() if v != PURE} <= names


def test_an_unfaulted_release_reaches_every_declared_point(driver, templates, scratch):
    """Passing: each route, run without a fault, releases and reaches exactly its declared
    points in path order (the implicit routes with the strategy they are for); together
    the routes reach every point."""
    reached = set()
    for route in ROUTES:
        path = _fresh(templates, route, scratch, "probe")
        before = templates[route][1]
        done = driver.run(path, route, [p[0] for p in POINTS], "record")
        assert done["outcome"] == "returned", (route, done)
        assert done["seen"] == REACHED[route], route
        if route in IMPLICIT:         # still the implicit plan, not a dense fallback
            assert done["strategy"] == IMPLICIT[route], (route, done)
        new = _new(before, check_invariant(path))
        assert [s for s, _, _ in new.values()] == ["released"], (route, new)
        reached |= set(done["seen"])
    assert reached == {p[0] for p in POINTS}


def _expected(mode: str, point: str, done: dict) -> str:
    """The ledger state a fault leaves, after checking how the child ended."""
    phase = PHASE[point]
    if mode == "kill":
        assert done["signal"] == signal.SIGKILL, done
        return phase
    if mode == "raise":               # the interrupt reaches the caller, the state as a kill's
        assert done["outcome"] == "KeyboardInterrupt", done
        return phase
    # a real Ctrl-C: cancels while planning; from the hand-over to the kernel (after the
    # budget pre-check, before the charge) it is held until the results are committed, then
    # reported: never a charge without its results
    if point == "planned":
        assert done["outcome"] == "KeyboardInterrupt", done
        return "none"
    assert done["outcome"] == "InterruptedAfterRelease", done
    return "released"


@pytest.mark.parametrize("mode", ["kill", "raise", "sigint"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_fault_at_every_step_boundary(driver, templates, scratch, route, mode):
    """At each point the route reaches, a fresh copy of its database and a child faulted
    there. Passing: the child ended as the mode says; the invariant holds after reopening;
    the ledger gained nothing (fault before the charge, or a Ctrl-C while planning), one
    ``charged`` entry (kill or raised interrupt at or after the charge, before the results'
    commit) or one ``released`` entry (after the commit, or any Ctrl-C once the release
    started), at the route's cost. After a kill (at the points of ``RETRIED``; on the
    implicit routes ``IMPLICIT_RETRIED``, and the other modes only in ``KERNEL_SECTION``),
    a new process retries the same request: released, charged once more at the same cost
    (the reuse route: free), totals exact."""
    for point in REACHED[route]:
        if mode == "sigint" and point not in SIGNALLED:
            continue
        if mode != "kill" and route in IMPLICIT and point not in KERNEL_SECTION:
            continue
        path = _fresh(templates, route, scratch, f"{mode}-{point}")
        try:
            _fault_and_retry(driver, path, route, mode, point, templates[route][1])
        finally:
            for leftover in (path, path + ".wal"):
                if os.path.exists(leftover):
                    os.remove(leftover)


def _fault_and_retry(driver, path, route, mode, point, before) -> None:
    done = driver.run(path, route, [point], mode)
    state = _expected(mode, point, done)
    after = check_invariant(path)
    new = _new(before, after)
    assert [s for s, _, _ in new.values()] == ([] if state == "none" else [state]), \
        (route, mode, point, done, new)
    cost = _cost(route)
    if cost is not None:
        assert all((e, m) == cost for _, e, m in new.values()), (route, point, new, cost)
    if mode != "kill" or point not in (IMPLICIT_RETRIED if route in IMPLICIT else RETRIED):
        return
    retry = driver.run(path, route)
    assert retry["outcome"] == "returned", (route, point, retry)
    again = _new(after, check_invariant(path))
    assert [s for s, _, _ in again.values()] == ["released"], (route, point, again)
    paid = [(e, m) for _, e, m in list(new.values()) + list(again.values())]
    assert len(set(paid)) == 1, (route, point, paid)   # the same cost, paid each time
    total = sum((e for _, e, _ in after.values()), Fraction(0))
    assert sum((e for _, e, _ in check_invariant(path).values()), Fraction(0)) \
        == total + paid[-1][0]


def test_the_invariant_check_catches_broken_ledgers(templates, scratch):
    """The check itself can fail: a released entry missing a table, a charged entry with
    linked tables, an orphan table, stored answers of no release and a released matrix
    release without its stored measurements are each refused, and so is an implicit release
    without its stored pieces."""
    import dpsql

    def broken(sql, route="batch3"):
        path = _fresh(templates, route, scratch, "broken")
        with dpsql.connect(path, reuse=False) as db:
            request = dict(ROUTES[route][0])
            db.answer(request.pop("sql"), **request)
        con = duckdb.connect(path)
        con.execute(sql)
        con.close()
        return path

    for sql in ("DROP VIEW weekly_total",
                "UPDATE dpsql.ledger SET status = 'charged'",
                "CREATE TABLE main.stray AS SELECT 1 AS x",
                "CREATE TABLE dpsql_results.r99_0 AS SELECT 1 AS x",
                "INSERT INTO dpsql_results.answers_vdddd SELECT 99, 0, 0, 'x', 1, 1, 1, 1",
                "DELETE FROM dpsql.measurements"):
        with pytest.raises(AssertionError):
            check_invariant(broken(sql))
    with pytest.raises(AssertionError):
        check_invariant(broken("DELETE FROM dpsql.measurements", "implicit_marginals"))
