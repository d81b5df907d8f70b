"""What ``dpsql run`` / ``explain`` print: text, ``--quiet``, ``--csv [DIR]`` or ``--json``.

* text (default): each workload as it is released, then the budget left;
* ``--quiet``: one line per workload;
* ``--csv``: CSV blocks on stdout, one per result table (its own header, starting with
  ``release`` and ``table``), separated by an empty line;
* ``--csv DIR``: one CSV file per result table, ``DIR/<table>.csv`` (one header each:
  ``release`` then the table's columns); a dry run writes ``DIR/plan.csv``; stdout gets
  the ``--quiet`` lines;
* ``--json``: one JSON document on stdout for jobs: every workload with its release,
  cost, strategy, expected RMSE and result tables (answers with standard errors and 95%
  intervals), and the ε spent and left per table (docs/scripts.md, "Output").
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import sys
import tempfile
from fractions import Fraction

from dpsql.errors import UsageError
from dpsql.store.results import format_table

BUDGET_COLUMNS = ("table", "eps_spent", "eps_limit", "eps_left", "delta_spent", "delta_limit",
                  "delta_left")
METRIC_COLUMNS = ("metric_eps_spent", "metric_eps_limit", "metric_eps_left")
_METRIC_KEYS = ("metric_epsilon_spent", "metric_epsilon_limit", "metric_epsilon_remaining")
PLAN_COLUMNS = ("workload", "lines", "release", "status", "table", "epsilon", "delta",
                "strategy", "sigma", "expected_rmse", "n_queries", "n_cells", "model")


def _budget_rows(budgets: dict) -> list:
    metric = any("metric_epsilon_limit" in b for b in budgets.values())
    rows = []
    for t, b in sorted(budgets.items()):
        row = (t, float(b["epsilon_spent"]), float(b["epsilon_limit"]),
               float(b["epsilon_remaining"]), float(b["delta_spent"]), float(b["delta_limit"]),
               float(b["delta_remaining"]))
        if metric:
            row += tuple(float(b[k]) if k in b else None for k in _METRIC_KEYS)
        rows.append(row)
    return rows


def budget_table(budgets: dict, title: str | None = None) -> str:
    """The budget per table; metric (d_X) budget columns when a table declares a metric
    (epsilon per unit distance; NULL for tables without one)."""
    metric = any("metric_epsilon_limit" in b for b in budgets.values())
    return format_table(BUDGET_COLUMNS + (METRIC_COLUMNS if metric else ()),
                        _budget_rows(budgets), title=title)


def rmse_text(value) -> str:
    """An expected RMSE for display: ``n/a`` when there is none (MWEM: data-dependent)."""
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.4g}"


def release_text(release) -> str:
    """A release as printed: ``expected RMSE=n/a`` when the error is data-dependent."""
    return str(release).replace("expected RMSE=nan", "expected RMSE=n/a")


def cost_text(eps, dlt, model: str = "dp") -> str:
    if model == "metric":
        return f"metric epsilon={float(eps):g} (per unit distance)"
    return f"epsilon={float(eps):g}, delta={float(dlt):g}"


def _number(value):
    """NaN / inf (no sigma or expected RMSE: MWEM, d_X) as None (an empty CSV field, JSON
    null); exact fractions as floats."""
    if isinstance(value, Fraction):
        value = float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _exact(value) -> dict:
    f = Fraction(repr(value)) if isinstance(value, float) else Fraction(value)
    return {"value": float(f), "exact": f"{f.numerator}/{f.denominator}"}


def csv_directory(path: str) -> str:
    """``--csv DIR``: created if missing; checked before anything is read or spent."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--csv {path!r} is a file; give a directory for the CSV files "
                         "(one per result table), or --csv alone for stdout")
    try:
        os.makedirs(path, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=path, prefix=".dpsql-", delete=True)
        probe.close()
    except OSError as exc:
        raise UsageError(f"--csv {path!r} cannot be written ({exc.strerror or exc}); give "
                         "a directory you can write to") from None
    return path


def _file_name(table: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", table).lstrip(".") or "table"


def _write_csv(path: str, header, rows) -> None:
    """Write one CSV file whole (a temporary file renamed: a reader never sees half)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".dpsql-",
                               suffix=".csv")
    with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
    os.replace(tmp, path)


def _plan_row(item) -> tuple:
    w, e, rec = item.workload, item.explanation, item.recorded
    status = "recorded" if rec is not None else "free" if item.free else "new"
    return (w.number, w.lines, w.name, status, e.table, float(item.epsilon),
            float(item.delta), e.strategy, _number(e.sigma), _number(e.rmse), e.n_queries,
            e.n_cells, w.model)


def _table_json(t) -> dict:
    return {"name": t.name, "columns": list(t.columns),
            "rows": [dict(zip(t.columns, (_number(v) for v in row))) for row in t.rows]}


class ScriptOutput:
    """Prints (or writes) a script's plan and each released workload, in the chosen form."""

    def __init__(self, args, n_workloads: int):
        csv_arg = getattr(args, "csv", None)
        self.dir = csv_arg if csv_arg not in (None, "-") else None
        self.json = bool(getattr(args, "json", False))
        self.stream = csv.writer(sys.stdout, lineterminator="\n") if csv_arg == "-" else None
        self.quiet = bool(args.quiet) or self.dir is not None
        self.n = n_workloads
        self.blocks = 0
        self.doc: dict = {"workloads": []}

    def _head(self, w) -> str:
        where = "" if self.quiet else f" ({w.lines})"
        return f"workload {w.number}/{self.n}{where} {w.name!r}"

    def _block(self, header) -> None:
        if self.blocks:
            print()
        self.blocks += 1
        self.stream.writerow(header)

    def plan(self, plan) -> None:
        """A dry run's plan (printed before anything would be spent)."""
        rows = [_plan_row(item) for item in plan.items]
        if self.json:
            self.doc["workloads"] = [dict(zip(PLAN_COLUMNS, r)) for r in rows]
            self.doc["reads"] = [{"read": r.number, "label": r.label, "after_workload":
                                  r.after, "sql": r.statement.normalized}
                                 for r in plan.script.reads]
            self.doc["would_charge"] = {t: {"epsilon": _exact(c.epsilon),
                                            "delta": _exact(c.delta)}
                                        for t, c in plan.to_charge.items()}
            return
        if self.stream is not None:
            self._block(PLAN_COLUMNS)
            self.stream.writerows(rows)
            return
        if self.dir is not None:
            _write_csv(os.path.join(self.dir, "plan.csv"), PLAN_COLUMNS, rows)
        for item in plan.items:
            print(self._plan_text(item))
        for r in plan.script.reads:
            print(f"{r.label}: reads result tables back after workload {r.after}: free")
        if not self.quiet:
            print(_totals(plan))

    def _plan_text(self, item) -> str:
        from dpsql.interfaces.scripts_check import target_text

        w, e, rec = item.workload, item.explanation, item.recorded
        cost = cost_text(item.epsilon, item.delta, w.model)
        if w.target is not None:
            cost += (f" (the smallest epsilon for {target_text(w)}"
                     + ("" if w.confirm else "; a run needs SET dpsql.confirm = true") + ")")
        if rec is not None:
            return (f"{self._head(w)}: already released as release {rec['release_id']}; "
                    "nothing would be charged")
        if item.free:
            return (f"{self._head(w)}: past releases answer it; nothing would be charged"
                    + (f" (strategy reuse, expected RMSE {rmse_text(e.rmse)})" if self.quiet
                       else f"\n{e}\n"))
        if self.quiet:
            return (f"{self._head(w)}: would charge {cost} on {e.table}; strategy "
                    f"{e.strategy}, expected RMSE {rmse_text(e.rmse)}")
        return f"{self._head(w)}: would charge {cost}\n{e}\n"

    def outcome(self, o) -> None:
        """One workload, as soon as it is released (or its recorded answers returned)."""
        w, r = o.workload, o.release
        if self.json:
            self.doc["workloads"].append(_outcome_json(o))
            return
        if self.stream is not None:
            for t in r.results:
                self._block(("release", "table") + tuple(t.columns))
                self.stream.writerows((w.name, t.name) + tuple(_blank(v) for v in row)
                                      for row in t.rows)
            sys.stdout.flush()
            return
        if self.dir is not None:
            for t in r.results:
                _write_csv(os.path.join(self.dir, _file_name(t.name) + ".csv"),
                           ("release",) + tuple(t.columns),
                           [(w.name,) + tuple(_blank(v) for v in row) for row in t.rows])
        if r.reused:
            what = f"already released as release {r.release_id}, nothing charged"
        elif r.strategy == "reuse":
            what = (f"answered from past releases as release {r.release_id} on {r.table}, "
                    "nothing charged")
        else:
            what = f"released as release {r.release_id} on {r.table}"
        if self.quiet:
            cost = ("" if r.reused or r.strategy == "reuse" else
                    f" ({cost_text(r.epsilon, r.delta, w.model)}, strategy {r.strategy})")
            print(f"{self._head(w)}: {what}{cost}; tables: {', '.join(r.tables)}", flush=True)
        else:
            print(("\n" if self.blocks else "") + f"{self._head(w)}: {what}\n"
                  f"{release_text(r)}", flush=True)
            self.blocks += 1

    def read(self, r, table) -> None:
        """One read of result tables (free post-processing), as soon as it ran."""
        rows = [tuple(_blank(v) for v in row) for row in table.rows]
        if self.json:
            self.doc.setdefault("reads", []).append(
                {"read": r.number, "label": r.label, "after_workload": r.after,
                 **_table_json(table)})
            return
        if self.stream is not None:
            self._block(tuple(table.columns))
            self.stream.writerows(rows)
            sys.stdout.flush()
            return
        if self.dir is not None:
            _write_csv(os.path.join(self.dir, f"read-{r.number}.csv"), table.columns, rows)
        if self.quiet:
            print(f"{r.label}: {len(table.rows)} rows read back, free", flush=True)
        else:
            print(("\n" if self.blocks else "") + f"{r.label}: result tables read back, "
                  f"free\n{table}", flush=True)
            self.blocks += 1

    def finish(self, db, tables, *, dry_run: bool) -> None:
        """After the last workload: the budget left (text), or the whole JSON document."""
        if self.json:
            print(json_document(dry_run=dry_run, **self.doc,
                                budget=_budgets_json({t: db.budget(t) for t in tables})))
        elif tables and not (dry_run or self.quiet or self.stream is not None):
            print()
            print(budget_table({t: db.budget(t) for t in sorted(tables)}, title="budget"))


def json_document(**parts) -> str:
    """One JSON document for jobs (``run``/``explain``/``budget``/``ledger`` ``--json``):
    ``{"dpsql": version, **parts}``; NaN is refused (:func:`_number` makes it null)."""
    from dpsql import __version__

    return json.dumps({"dpsql": __version__, **parts}, indent=1, allow_nan=False)


def _budget_json(budget: dict) -> dict:
    """A table's budget: exact values as ``{"value": float, "exact": "num/den"}``, the
    rest (the accounting route) as is."""
    return {k: v if isinstance(v, str) or v is None else _exact(v)
            for k, v in budget.items()}


def _budgets_json(budgets: dict) -> dict:
    return {t: _budget_json(b) for t, b in sorted(budgets.items())}


def budget_json(budgets: dict) -> str:
    """``dpsql budget --json``: every table's budget as ``run --json`` gives it after a run."""
    return json_document(budget=_budgets_json(budgets))


LEDGER_COLUMNS = ("release_id", "release_name", "created_at", "table_name", "epsilon", "delta",
                  "mechanism", "strategy", "n_queries", "result_tables", "private", "status")
#: the ledger's exact charges (num/den text), shown in JSON as {"value", "exact"}
_EXACT = {"epsilon": "epsilon_exact", "delta": "delta_exact",
          "metric_epsilon": "metric_epsilon_exact"}


def ledger_table(rows: list) -> str:
    """``dpsql ledger``: a row per release (``metric_epsilon`` when one is metric)."""
    cols = LEDGER_COLUMNS
    if any(r.get("metric_epsilon") is not None for r in rows):
        cols = cols[:6] + ("metric_epsilon",) + cols[6:]
    return format_table(cols, [tuple(str(r[c]) if c in ("created_at", "result_tables")
                                     else r[c] for c in cols) for r in rows])


def _entry_json(row: dict) -> dict:
    """A ledger row: the charges exact (``{"value", "exact"}``, null when none), the time
    in ISO 8601, the recorded request as an object, NaN as null."""
    out = {}
    for key, value in row.items():
        if key in _EXACT.values():
            continue
        if key in _EXACT:
            exact = row.get(_EXACT[key])
            value = None if exact is None else _exact(Fraction(exact))
        elif key == "created_at" and value is not None:
            value = value.isoformat()
        elif key == "request" and value is not None:
            value = json.loads(value)
        out[key] = _number(value)
    return out


def ledger_json(rows: list) -> str:
    """``dpsql ledger --json``: every release charged, oldest first."""
    return json_document(ledger=[_entry_json(r) for r in rows])


def _blank(value):
    """NULL (MWEM's stderr and interval) as an empty CSV field."""
    value = _number(value)
    return "" if value is None else value


def _outcome_json(o) -> dict:
    w, r = o.workload, o.release
    status = ("recorded" if r.reused else "free" if r.strategy == "reuse" else "released")
    charged = status == "released"
    return {"workload": w.number, "lines": w.lines, "release": w.name,
            "release_id": r.release_id, "status": status, "table": r.table,
            "model": w.model, "epsilon": float(r.epsilon) if charged else 0.0,
            "delta": float(r.delta) if charged else 0.0, "strategy": r.strategy,
            "sigma": _number(r.sigma), "expected_rmse": _number(r.expected_rmse),
            "private": r.private, "tables": [_table_json(t) for t in r.results]}


def _totals(plan) -> str:
    totals = [f"{t} {cost_text(c.epsilon, c.delta)} of the remaining "
              f"{cost_text(plan.remaining[t].epsilon, plan.remaining[t].delta)}"
              for t, c in plan.to_charge.items()]
    totals += [f"{t} {cost_text(eps, 0, 'metric')} of the remaining "
               f"{cost_text(plan.remaining_metric[t], 0, 'metric')}"
               if plan.remaining_metric.get(t) is not None else
               f"{t} {cost_text(eps, 0, 'metric')}"
               for t, eps in plan.to_charge_metric.items()]
    return ("dry run: nothing was read or spent; a run would charge "
            + ("; ".join(totals) or "nothing"))
