"""Backslash commands, registered with :func:`command` (litecli / pgcli style).

A handler takes the :class:`~dpsql.interfaces.shell.executor.Executor` and the rest of the line and
returns ``False`` to leave the shell (anything else keeps it running). Handlers refuse with
:class:`~dpsql.errors.DpsqlError`; the executor prints the message as one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from dpsql.errors import DpsqlError, UnknownTableError
from dpsql.interfaces.shell import batch, display
from dpsql.interfaces.shell.settings import ASKS, SETTINGS, show_exact


@dataclass(frozen=True)
class MetaCommand:
    name: str
    usage: str
    help: str
    handler: Callable
    aliases: tuple = ()


COMMANDS: dict[str, MetaCommand] = {}   # by name and by alias


def command(name: str, usage: str, help: str, aliases: tuple = ()):
    """Register the decorated function as the handler of ``name`` (and its aliases)."""
    def register(fn: Callable) -> Callable:
        cmd = MetaCommand(name, usage, help, fn, tuple(aliases))
        for key in (name, *aliases):
            COMMANDS[key] = cmd
        return fn
    return register


def names() -> list[str]:
    """Every command name and alias, for completion."""
    return sorted(COMMANDS)


def run(ex, name: str, arg: str):
    cmd = COMMANDS.get(name.lower())
    if cmd is None:
        raise DpsqlError(f"unknown command '{name}'; \\help lists the commands")
    return cmd.handler(ex, arg)


def _table(ex, arg: str) -> str:
    """The table named by ``arg``, else the table in use; refused when neither."""
    policies = ex.state.session.policies()
    name = arg.strip().lower() or ex.state.table
    if not name:
        raise DpsqlError("name a table (\\tables lists the protected tables)")
    if name not in policies:
        known = ", ".join(sorted(policies)) or "none"
        raise UnknownTableError(
            f"table {arg.strip() or name!r} is not protected (protected: {known})")
    return name


@command("\\q", "\\q", "leave the shell (Ctrl-D, or exit / quit typed alone, too)",
         aliases=("\\quit",))
def _quit(ex, arg):
    return False


@command("\\help", "\\help", "list the commands and how statements are entered",
         aliases=("\\?", "\\h"))
def _help(ex, arg):
    seen = []
    for cmd in COMMANDS.values():
        if cmd not in seen:
            seen.append(cmd)
    width = max(len(c.usage) for c in seen)
    ex.say("Type SQL COUNT statements ending with ';'. Statements entered together (pasted,\n"
           "or continued over several lines) are answered as ONE workload. To build a batch\n"
           "line by line: BEGIN WORKLOAD; (or \\begin), the statements, then COMMIT; (or\n"
           "\\end) releases them as ONE workload; ROLLBACK; discards them. Each statement\n"
           "added shows what the batch would cost and its expected error.\n")
    for cmd in seen:
        ex.say(f"  {cmd.usage:<{width}}  {cmd.help}")
    ex.say("\nAsk by accuracy instead of epsilon: \\set target_rmse 50 (the batch's expected\n"
           "RMSE) or \\set max_stderr 10 (every answer's standard error); each query then\n"
           "shows the smallest epsilon meeting it, with delta and strategy, and asks before\n"
           "spending it (\\set confirm on: no question; \\set epsilon 0.1 asks by epsilon\n"
           "again). \\set nonnegative on / \\set integer on: non-negative or whole-number\n"
           "answers (post-processing, no privacy cost).")
    ex.say("\nReuse (on by default): a query that past releases answer at least as accurately\n"
           "is answered from them at no privacy cost (the release is recorded at epsilon 0);\n"
           "only the rest is measured and charged. \\set reuse off measures everything afresh.")
    ex.say("\nCtrl-C clears the line, or cancels a running request (nothing is charged);\n"
           "Ctrl-D or \\q leaves.")


@command("\\set", "\\set [NAME [VALUE]]",
         "show the settings, or set one: " + " or ".join(k for k in SETTINGS if k in ASKS)
         + ", " + ", ".join(k for k in SETTINGS if k not in ASKS))
def _set(ex, arg):
    parts = arg.split(None, 1)
    if not parts:
        for key in SETTINGS:
            ex.say(ex.state.show(key))
        return
    if len(parts) == 1:
        key = parts[0].lower()
        if key not in SETTINGS:
            raise DpsqlError(f"unknown setting {parts[0]!r}; settings are {', '.join(SETTINGS)}")
        ex.say(ex.state.show(key))
        return
    ex.note(ex.state.set(parts[0], parts[1]))   # a remark: stderr in CSV mode


@command("\\explain", "\\explain SQL",
         "expected error of each strategy for SQL; reads no data, spends nothing")
def _explain(ex, arg):
    if not arg.strip():
        raise DpsqlError("\\explain needs SQL: \\explain SELECT sex, COUNT(*) FROM t GROUP BY "
                         "sex;  (or type the statements, then \\explain on its own line)")
    ex.explain(arg)


_BUDGET_KEYS = ("epsilon_spent", "epsilon_limit", "epsilon_remaining", "delta_spent",
                "delta_limit", "delta_remaining")
_METRIC_KEYS = ("metric_epsilon_spent", "metric_epsilon_limit", "metric_epsilon_remaining")


def has_metric(budgets: dict) -> bool:
    """Does any of these tables declare a metric (d_X) budget?"""
    return any("metric_epsilon_limit" in b for b in budgets.values())


@command("\\budget", "\\budget [TABLE]",
         "spent and remaining epsilon and delta (and metric epsilon, if declared), exact")
def _budget(ex, arg):
    session = ex.state.session
    budgets = {_table(ex, arg): session.budget(_table(ex, arg))} if arg.strip() \
        else session.budget()
    if not budgets:
        raise DpsqlError("no protected tables in this database")
    cols = ("table", "eps_spent", "eps_limit", "eps_left", "delta_spent", "delta_limit",
            "delta_left")
    keys = _BUDGET_KEYS
    if has_metric(budgets):   # metric (d_X) budget: epsilon per unit distance
        cols += ("metric_eps_spent", "metric_eps_limit", "metric_eps_left")
        keys += _METRIC_KEYS
    ex.table(cols, [(t, *(show_exact(b[k]) if k in b else "-" for k in keys))
                    for t, b in sorted(budgets.items())])


@command("\\ledger", "\\ledger [TABLE]", "every release charged to the database")
def _ledger(ex, arg):
    rows = ex.state.session.ledger(_table(ex, arg) if arg.strip() else None)
    if not rows:
        ex.say("(the ledger is empty: nothing has been charged)")
        return
    cols = ("release_id", "created_at", "table_name", "epsilon", "delta", "mechanism",
            "strategy", "n_queries", "result_tables", "status")
    if any(r.get("metric_epsilon") is not None for r in rows):
        cols = cols[:5] + ("metric_epsilon",) + cols[5:]
    ex.table(cols, [tuple(str(r[c]) if c in ("created_at", "result_tables") else r.get(c)
                          for c in cols) for r in rows])


@command("\\tables", "\\tables", "protected tables, their columns and remaining budget")
def _tables(ex, arg):
    session = ex.state.session
    policies = session.policies()
    if not policies:
        ex.say("no protected tables; a data owner protects one with "
               "`dpsql protect DB POLICY.toml`")
        return
    budgets = session.budget()
    metric = has_metric(budgets)
    ex.table(("table", "columns", "eps_left", "delta_left")
             + (("metric_eps_left",) if metric else ()),
             [(t, ", ".join(p.column_names), show_exact(budgets[t]["epsilon_remaining"]),
               show_exact(budgets[t]["delta_remaining"]))
              + ((show_exact(budgets[t]["metric_epsilon_remaining"])
                  if "metric_epsilon_remaining" in budgets[t] else "-",) if metric else ())
              for t, p in sorted(policies.items())])


def describe_domain(domain) -> str:
    d = domain.describe()
    if d["type"] == "categorical":
        return ", ".join(repr(v) for v in d["values"]) + " (others pooled in one cell)"
    if d["type"] == "integer":
        step = f" step {d['step']}" if d["step"] != 1 else ""
        return f"{d['min']} .. {d['max']}{step} (clamped)"
    return (f"[{d['min']}, {d['max']}] in bins at " + ", ".join(str(e) for e in d["edges"])
            + " (clamped)")


@command("\\domain", "\\domain [TABLE]", "the declared public domain of each column")
def _domain(ex, arg):
    name = _table(ex, arg)
    policy = ex.state.session.policies()[name]
    ex.table(("column", "type", "nullable", "domain"),
             [(c, d.describe()["type"], "yes" if d.nullable else "no", describe_domain(d))
              for c, d in policy.columns], title=f"{name}: declared domains")


@command("\\d", "\\d [TABLE]", "psql's \\d: \\tables, or \\domain TABLE with a table")
def _d(ex, arg):
    return _domain(ex, arg) if arg.strip() else _tables(ex, arg)


@command("\\dt", "\\dt", "psql's \\dt: the same as \\tables")
def _dt(ex, arg):
    return _tables(ex, arg)


@command("\\begin", "\\begin", "BEGIN WORKLOAD;: collect the next statements into one workload")
def _begin(ex, arg):
    batch.run_sql(ex, "BEGIN WORKLOAD;")


@command("\\end", "\\end", "COMMIT;: release the collected statements as ONE workload")
def _end(ex, arg):
    batch.run_sql(ex, "COMMIT;")


@command("\\x", "\\x [on|off|auto]", "expanded display: one line per column (auto: when too wide)")
def _x(ex, arg):
    ex.note(display.set_expanded(ex.display, arg))


@command("\\timing", "\\timing [on|off]", "show how long each command took")
def _timing(ex, arg):
    ex.note(display.set_timing(ex.display, arg))


@command("\\o", "\\o [FILE]", "send results to FILE; \\o alone: back to the terminal")
def _o(ex, arg):
    ex.note(display.redirect(ex.display, arg))


@command("\\pset", "\\pset pager [on|off|always]",
         "the pager ($PAGER, else less) for results taller than the screen")
def _pset(ex, arg):
    ex.note(display.set_pager(ex.display, arg))
