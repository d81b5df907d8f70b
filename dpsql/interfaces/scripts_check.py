"""Checking a whole reporting script before its first workload is charged: every workload
explained (syntax, settings, allow-list, compilation, positions pointing into the script),
release names already recorded, result table names, accuracy targets confirmed, and the
budget left covering every workload still to release. Reads no data, charges nothing; the
result is the :class:`Plan` that :func:`dpsql.interfaces.scripts.run_script` releases.
The rules are those of :mod:`dpsql.interfaces.scripts` and ``docs/scripts.md``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction

from sqlglot import exp

from dpsql.noise import composition
from dpsql.store import database as engine
from dpsql.store import ledger
from dpsql.noise.accounting import PrivacyCost
from dpsql.errors import BudgetExceededError, DpsqlError, PolicyError, show_exact
from dpsql.store.results import Explanation
from dpsql.session import Session, request_matches
from dpsql.release.support import _flags
from dpsql.sql.readback import references
from dpsql.sql.script import Script, ScriptError, ScriptRead, ScriptWorkload, Statement


def _planned_rho(expl: Explanation, epsilon: Fraction) -> Fraction | None:
    from dpsql.release.matrix import _rho

    if expl.mechanism == "laplace":
        return epsilon * epsilon / 2
    if expl.mechanism != "gaussian":
        return None
    if getattr(expl, "planned_rho", None) is not None:      # as the planner will charge it
        return Fraction(expl.planned_rho) * (1 + Fraction(1, 10**12))
    best = next((c for c in expl.candidates if c.strategy == expl.strategy
                 and c.mechanism == expl.mechanism), None)
    if best is None or getattr(best, "plan", None) is None:
        return None
    rho = _rho(expl, epsilon, best.plan)      # a double: inflated as the ledger reads it
    return Fraction(rho) * (1 + Fraction(1, 10**12))


@dataclass(frozen=True)
class PlannedWorkload:
    workload: ScriptWorkload
    explanation: Explanation
    recorded: dict | None        # ledger entry when already released under its name

    @property
    def epsilon(self) -> Fraction:
        """The epsilon this workload spends: its own, or (accuracy first) the smallest one
        meeting its target, as :meth:`Session.explain` found it; for a workload already
        released under its name, the epsilon recorded then."""
        if self.workload.epsilon is not None:
            return self.workload.epsilon
        if self.recorded is not None:
            request = self.recorded.get("request")
            return (Fraction(json.loads(request)["epsilon"]) if request
                    else Fraction(repr(self.recorded["epsilon"])))
        return Fraction(repr(self.explanation.epsilon))

    def answer_params(self) -> dict:
        """What :meth:`Session.answer` is asked. A recorded accuracy-first workload asks by
        its recorded epsilon: the recorded answers come back, never re-noised (the epsilon
        a target needs can change once past releases are there to combine with)."""
        params = self.workload.answer_params()
        if self.workload.target is not None and self.recorded is not None:
            del params[self.workload.target[0]]
            params["epsilon"] = self.epsilon
        return params

    @property
    def delta(self) -> Fraction:
        """The delta this workload spends: none when its noise is not Gaussian (``auto``
        may choose Laplace noise, which spends epsilon only)."""
        return self.workload.delta if self.explanation.mechanism == "gaussian" else Fraction(0)

    @property
    def rho(self) -> Fraction | None:
        """The zCDP cost the release will record (as :meth:`Session.answer` computes it):
        ``ε²/2`` for pure noise, ``Δ²/2σ²`` for Gaussian noise; None when not known here
        (the zCDP route then stays closed for the script's check, never more permissive)."""
        return _planned_rho(self.explanation, self.epsilon)

    @property
    def free(self) -> bool:
        """Not yet released, and past releases answer all of it (reuse): it charges nothing.
        Earlier workloads of the same script can only add to what is free when it runs."""
        return self.recorded is None and self.explanation.mechanism == "reuse"


@dataclass(frozen=True)
class Plan:
    script: Script
    items: tuple                 # PlannedWorkload
    to_charge: dict              # table -> PrivacyCost of the workloads still to release
    remaining: dict              # table -> PrivacyCost left before this script
    budget_error: DpsqlError | None
    to_charge_metric: dict = field(default_factory=dict)  # table -> metric epsilon to charge
    remaining_metric: dict = field(default_factory=dict)  # table -> metric epsilon left
    confirm_error: DpsqlError | None = None  # accuracy targets without SET dpsql.confirm


# --------------------------------------------------------------------------- checking


def check_script(session: Session, script: Script, *, replace: bool = False) -> Plan:
    """Everything a run checks before it spends: reads no data, charges nothing.

    Raises on the first problem, except a budget shortfall and accuracy targets not
    confirmed, which are returned in ``Plan.budget_error`` and ``Plan.confirm_error`` so
    that a dry run can still show the expected errors and the epsilon each target needs.
    """
    by_name = {e["release_name"]: e for e in session.ledger() if e.get("release_name")}
    items = []
    for w in script.workloads:
        expl = _explain(session, script, w)
        entry = by_name.get(w.name)
        item = PlannedWorkload(w, expl, entry)
        if entry is not None:
            _check_recorded(item)
        items.append(item)
    _check_tables(session, items, replace)
    _check_reads(session, script, items)
    to_charge, remaining, metric, metric_left, error = _check_budget(session, items)
    return Plan(script, tuple(items), to_charge, remaining, error, metric, metric_left,
                _check_confirmed(items))


def target_text(w: ScriptWorkload) -> str:
    """An accuracy target as a script sets it: ``target_rmse = 50``."""
    return f"{w.target[0]} = {w.target[1]:g}"


def _check_confirmed(items) -> ScriptError | None:
    """Workloads asking by an accuracy target spend only with SET dpsql.confirm = true."""
    unconfirmed = [item for item in items if item.workload.target is not None
                   and not item.workload.confirm and item.recorded is None and item.epsilon]
    if not unconfirmed:
        return None
    needs = "; ".join(
        f"{item.workload.label} asks for {target_text(item.workload)}, which needs "
        f"epsilon = {show_exact(item.epsilon)} (delta = {float(item.delta):g}, "
        f"strategy {item.explanation.strategy})" for item in unconfirmed)
    return ScriptError(
        f"{needs}; an accuracy target spends only when confirmed: put SET dpsql.confirm = "
        "true; before its queries (or pass --confirm); nothing was charged",
        workload=unconfirmed[0].workload.number)


def _explain(session: Session, script: Script, w: ScriptWorkload) -> Explanation:
    try:
        return session.explain(w.sql, **w.params())
    except DpsqlError as exc:
        located = exc
    try:  # again on the script's own text, so that positions point into the script
        session.explain(_located_text(script.text, w), **w.params())
    except DpsqlError as exc:
        located = exc
    raise ScriptError(f"{w.label}: {located}", workload=w.number,
                      line=getattr(located, "line", None),
                      column=getattr(located, "column", None), cause=located) from None


def _located_text(text: str, w: ScriptWorkload) -> str:
    """The script with everything but this workload's queries blanked (lines kept)."""
    chars = ["\n" if c == "\n" else " " for c in text]
    for st in w.statements:
        chars[st.start:st.end] = text[st.start:st.end]
        if st.semicolon is not None:
            chars[st.semicolon] = ";"
    return "".join(chars)


def _new_edition_hint(w: ScriptWorkload) -> str:
    if w.named_by == "digest":
        return ("the name comes from the script's text, so the difference is in the privacy "
                "options given on the command line (epsilon, delta, strategy, ...); use the "
                "same ones, or pass --release NAME to publish a new edition")
    if w.named_by == "caller":
        return "pass another --release NAME to publish a new edition"
    return "to publish a new edition, change SET dpsql.release (or pass --release NAME)"


def _recorded_metric(entry: dict) -> bool:
    return entry.get("metric_epsilon") is not None


def _check_recorded(item: PlannedWorkload) -> None:
    w, entry = item.workload, item.recorded
    metric = _recorded_metric(entry)
    epsilon = entry["metric_epsilon"] if metric else entry["epsilon"]
    same = request_matches(entry, ";\n".join(w.sql), item.epsilon, w.delta, w.strategy,
                           w.calibration, w.model, _flags(w.nonnegative, w.integer))
    if not same:
        recorded = (f"metric epsilon={epsilon:g}" if metric else
                    f"epsilon={epsilon:g}, delta={entry['delta']:g}")
        raise ScriptError(
            f"{w.label}: release name {w.name!r} already used for a different batch or "
            f"different parameters (release {entry['release_id']}: {recorded}, strategy "
            f"{entry['strategy']}); nothing was charged; {_new_edition_hint(w)}",
            workload=w.number)
    if entry["status"] != "released":
        raise ScriptError(
            f"{w.label}: release {w.name!r} (release {entry['release_id']}) was charged but "
            "its results were never written (it was interrupted); its budget stays spent and "
            f"it cannot be re-noised for free; {_new_edition_hint(w)}", workload=w.number)


def _targets(w: ScriptWorkload) -> list[tuple[str, bool, Statement]]:
    out = []
    for st in w.statements:
        if isinstance(st.expr, exp.Create) and isinstance(st.expr.this, exp.Table):
            out.append((st.expr.this.name, bool(st.expr.args.get("replace")), st))
    return out


def _check_tables(session: Session, items, replace: bool) -> None:
    seen: dict[str, int] = {}
    for item in items:
        w = item.workload
        for name, _, st in _targets(w):
            first = seen.setdefault(name.lower(), w.number)
            if first != w.number:
                raise ScriptError(
                    f"{w.label}: result table {name!r} (line {st.line}) is also created by "
                    f"workload {first}; give each result table of a script its own name",
                    workload=w.number, line=st.line, column=st.column)
    with session.db.connect() as con:
        for item in items:
            w = item.workload
            if item.recorded is not None:
                for table in item.recorded["result_tables"] or []:
                    _check_still_recorded(con, w, item.recorded["release_id"], table)
                if w.target is not None:
                    _check_recorded_target(con, item)
                continue
            for name, or_replace, st in _targets(w):
                if not engine.table_exists(con, name):
                    continue
                if not (replace or or_replace):
                    raise ScriptError(
                        f"{w.label}: table {name!r} (line {st.line}) already exists; use "
                        "CREATE OR REPLACE TABLE or --replace to overwrite it; nothing was "
                        "charged", workload=w.number, line=st.line, column=st.column)
                if not ledger.is_result_table(con, name):
                    raise ScriptError(
                        f"{w.label}: table {name!r} (line {st.line}) exists and was not "
                        "created by dpsql; dpsql only replaces its own result tables; nothing "
                        "was charged", workload=w.number, line=st.line, column=st.column)


def read_back(session: Session, r: ScriptRead):
    """The rows of one read of result tables (free), or a ScriptError pointing at it."""
    try:
        table = session.read_results(r.statement.normalized)
    except DpsqlError as exc:
        raise ScriptError(f"{r.label}: {exc}", line=r.statement.line,
                          column=r.statement.column, cause=exc) from None
    if table is None:         # its result tables are gone (another process replaced them)
        raise ScriptError(f"{r.label}: it names no result table any more",
                          line=r.statement.line, column=r.statement.column)
    return table


def _check_reads(session: Session, script: Script, items) -> None:
    """Run each read over existing result tables only (free): its mistakes are refused
    before the first charge. A read of a table the script creates runs in its turn."""
    made = {name.lower() for item in items for name, _, _ in _targets(item.workload)}
    for r in script.reads:
        refs = references(r.statement.normalized)
        if refs is not None and not set(refs.tables) & made:
            read_back(session, r)


def _check_still_recorded(con, w: ScriptWorkload, release_id: int, table: str) -> None:
    """A recorded release's answers can be returned only while its tables still hold them."""
    owner = None
    if engine.table_exists(con, table):
        with engine.engine_errors("reading the ledger"):
            (owner,) = con.execute("SELECT max(release_id) FROM dpsql.release_tables "
                                   "WHERE lower(table_name) = lower(?)", [table]).fetchone()
    if owner != release_id:
        state = ("no longer exists" if owner is None
                 else f"now holds the answers of release {owner}")
        raise ScriptError(
            f"{w.label}: release {w.name!r} is recorded, but its result table {table!r} "
            f"{state}; its answers cannot be returned again without a new charge; "
            f"{_new_edition_hint(w)}", workload=w.number)


def _check_recorded_target(con, item: PlannedWorkload) -> None:
    """A recorded accuracy-first release is returned again only if it meets the target."""
    w, entry = item.workload, item.recorded
    key, target = w.target
    if key == "target_rmse":
        error, what = entry["expected_rmse"], "an expected RMSE"
    else:
        error, what = 0.0, "a largest standard error"
        for table in entry["result_tables"] or []:
            with engine.engine_errors("reading a result table"):
                (worst,) = con.execute(f"SELECT max(stderr) FROM main."
                                       f"{engine.quote_ident(table)}").fetchone()
            error = max(error, worst if worst is not None else float("inf"))
    if error is None or not error <= target * (1 + 1e-9):
        raise ScriptError(
            f"{w.label}: release {w.name!r} (release {entry['release_id']}) is recorded with "
            f"{what} of {error:.4g}, which does not meet {target_text(w)}; nothing was "
            f"charged; {_new_edition_hint(w)}", workload=w.number)


def _check_budget(session: Session, items):
    """(to_charge, remaining, metric to_charge, metric remaining, error): the workloads still
    to release, summed per table (standard (epsilon, delta) and, for metric workloads, the
    separate metric budget), against what is left."""
    to_charge: dict[str, PrivacyCost] = {}
    metric: dict[str, Fraction] = {}
    users: dict[tuple, list[int]] = {}
    for item in items:
        if item.recorded is None and not item.free:
            t, w = item.explanation.table, item.workload
            if w.model == "metric":
                metric[t] = metric.get(t, Fraction(0)) + Fraction(item.epsilon)
            else:
                to_charge[t] = (to_charge.get(t, PrivacyCost.zero())
                                + PrivacyCost(item.epsilon, item.delta))
            users.setdefault((t, w.model == "metric"), []).append(w.number)
    budgets = session.budget() if (to_charge or metric) else {}
    remaining = {t: PrivacyCost(budgets[t]["epsilon_remaining"], budgets[t]["delta_remaining"])
                 for t in to_charge}
    metric_left = {t: budgets[t].get("metric_epsilon_remaining") for t in metric}

    def total_of(exc, key):
        if len(items) > 1:
            exc.args = (f"{exc}; the request is the total of workloads "
                        f"{', '.join(map(str, users[key]))}: a script runs only when all "
                        "its workloads fit",)
        return exc

    if to_charge:
        # the accountant's own check (dpsql.noise.composition): it reads only the sums of ε, δ and
        # ρ, so the script's workloads on a table are checked as one request of their totals
        rhos: dict[str, Fraction | None] = {}
        for item in items:
            if item.recorded is None and not item.free and item.workload.model != "metric":
                t, rho = item.explanation.table, item.rho
                rhos[t] = (None if rho is None or rhos.get(t, Fraction(0)) is None
                           else rhos.get(t, Fraction(0)) + rho)
        with session.db.connect() as con:
            policies = ledger.load_policies(con)
            for t, cost in to_charge.items():
                total = composition.Spend(cost.epsilon, cost.delta, rhos.get(t))
                try:
                    composition.check(t, ledger.spends(con, t), total, policies[t].budget)
                except BudgetExceededError as exc:
                    return to_charge, remaining, metric, metric_left, total_of(exc, (t, False))
    for t, eps in metric.items():
        b = budgets[t]
        if "metric_epsilon_limit" not in b:   # explain refuses this first; kept as a guard
            return to_charge, remaining, metric, metric_left, PolicyError(
                f"table {t!r} declares no metric model; metric (d_X) workloads need a "
                "[tables.<name>.metric] section in its policy")
        if b["metric_epsilon_spent"] + eps > b["metric_epsilon_limit"]:
            exc = BudgetExceededError(t, "metric epsilon", b["metric_epsilon_spent"], eps,
                                      b["metric_epsilon_limit"])
            return to_charge, remaining, metric, metric_left, total_of(exc, (t, True))
    return to_charge, remaining, metric, metric_left, None
