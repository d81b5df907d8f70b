"""What the shell remembers between statements, and the validation of every ``\\set``.

ε and δ have no safe universal default, so they start unset and the first query is refused
until the analyst chooses them. Values are held exactly (``Fraction``): ``0.1`` is one tenth.

A query asks either by ε or by an accuracy target (``target_rmse`` or ``max_stderr``: the
smallest ε meeting it, shown and confirmed before it is spent): setting one of the three
unsets the others. ``confirm on`` spends what a target needs without asking; ``nonnegative``
and ``integer`` are the consistency flags of :meth:`dpsql.Session.answer`; ``reuse`` (on
unless ``\\set reuse off`` or ``--no-reuse``) answers from past releases wherever they are at
least as accurate, at no privacy cost.
"""

from __future__ import annotations

from fractions import Fraction

from dpsql.errors import show_exact  # noqa: F401  (re-exported for the shell modules)

from dpsql.errors import DpsqlError, PrivacyParameterError
from dpsql.request.declared import ASKS, check_asks, settings_for

#: the settings the shell exposes (``\set NAME VALUE`` and ``dpsql shell --NAME VALUE``),
#: in the order ``\set`` lists them: all declared in :data:`dpsql.request.declared.SETTINGS`
DECLARED = {s.name: s for s in settings_for("shell")}
SETTINGS = tuple(DECLARED)
TARGETS = tuple(k for k in ASKS[1:] if k in DECLARED)
FLAGS = tuple(k for k, s in DECLARED.items() if s.kind == "flag")
DEFAULT_CONFIRM_SHARE = DECLARED["confirm_share"].default
#: the targets read "off" to unset them (back to asking by epsilon)
UNSET = ("off", "none")


def parse(key: str, text: str):
    """A ``\\set`` value, with the setting's declared parser (the same messages as every
    other interface); an accuracy target also reads ``off`` (unset it)."""
    if key in TARGETS and str(text).strip().lower() in UNSET:
        return None
    return DECLARED[key].parse(str(text), "shell")


def show_target(value) -> str:
    """A target (or epsilon) as typed: ``50``, ``0.1``."""
    return f"{float(value):g}"


class ShellState:
    """The session, the privacy settings, the table in use and its cached budget."""

    def __init__(self, session, *, interactive: bool = True, **settings):
        """``settings``: any declared shell setting (parsed values: ``Fraction``, ``bool``,
        text); the others take their declared defaults."""
        unknown = set(settings) - set(DECLARED)
        if unknown:
            raise TypeError(f"unknown shell setting(s) {sorted(unknown)}")
        values = {k: settings.get(k, s.default) for k, s in DECLARED.items()}
        values = {k: v if v is None else DECLARED[k].parse(v)   # None: not set yet
                  for k, v in values.items()}
        check_asks(*(values[k] for k in ASKS), interface="cli", who="query")
        for key, value in values.items():
            setattr(self, key, value)
        self.session = session
        self.interactive = interactive
        self.table: str | None = None      # the table in use (last queried)
        self.budget: dict | None = None    # its cached budget (refresh())
        self.policies: dict = {}           # protected tables (refresh())

    def set(self, name: str, text: str) -> str:
        """Validate and store one setting; return how it now reads."""
        key = name.strip().lower()
        if key not in DECLARED:
            raise DpsqlError(f"unknown setting {name.strip()!r}; settings are "
                             f"{', '.join(SETTINGS)}")
        if not str(text).strip():
            raise DpsqlError(f"\\set {key} needs a value, e.g. {self.example(key)}")
        value = parse(key, text)
        dropped = []
        if key in ASKS and value is not None:   # a query asks by one of them: unset the others
            dropped = [f"{k} {show_target(getattr(self, k))}" for k in ASKS
                       if k != key and getattr(self, k) is not None]
            for k in ASKS:
                setattr(self, k, None)
        setattr(self, key, value)
        if dropped:
            return (f"{self.show(key)}; {' and '.join(dropped)} no longer applies (a query asks "
                    "either by epsilon or by an accuracy target)")
        return self.show(key)

    @staticmethod
    def example(key: str) -> str:
        return f"\\set {key} {DECLARED[key].example_text('shell')}"

    def show(self, key: str) -> str:
        value = getattr(self, key)
        if value is None:
            return f"{key} is not set"
        if key in TARGETS:
            what = ("expected RMSE of the batch" if key == "target_rmse"
                    else "standard error of every answer")
            return (f"{key} = {show_target(value)} (each query spends the smallest epsilon "
                    f"whose {what} is at most {show_target(value)}, after you confirm it)")
        if key in FLAGS:
            what = {"nonnegative": "non-negative answers (non-negative least squares, or on wide "
                                   "batches the closest non-negative consistent "
                                   "marginals); no privacy cost",
                    "integer": "answers rounded to integers; no privacy cost",
                    "reuse": "answers from past releases wherever they are at least as "
                             "accurate, at no privacy cost" if value else
                             "every query is measured afresh and charged",
                    "confirm": "spend the epsilon an accuracy target needs without asking"
                    if value else "ask before spending the epsilon an accuracy target needs"}
            return f"{key} = {'on' if value else 'off'} ({what[key]})"
        if key == "confirm_share":
            return f"{key} = {show_exact(value)} ({float(value) * 100:g}% of the remaining epsilon)"
        if key == "model":
            what = ("d_X privacy: epsilon per unit distance, charged to the table's metric "
                    "budget; delta must be 0" if value == "metric" else
                    "differential privacy")
            return f"{key} = {value} ({what})"
        return f"{key} = {show_exact(value) if isinstance(value, Fraction) else value}"

    def target(self) -> tuple[str, Fraction] | None:
        """``(setting, value)`` when queries ask by an accuracy target, else None."""
        return next(((k, getattr(self, k)) for k in TARGETS if getattr(self, k) is not None),
                    None)

    def request(self) -> dict:
        """What :meth:`Session.explain` is asked: epsilon or the target, delta, strategy,
        model, reuse; refused (with how to set them) while epsilon or delta is missing."""
        target = self.target()
        if target is None:
            epsilon, delta = self.privacy()
            ask = {"epsilon": epsilon}
        else:
            delta = self.privacy(need_epsilon=False)[1]
            ask = {target[0]: float(target[1])}
        return dict(ask, delta=delta, strategy=self.strategy, model=self.model,
                    reuse=self.reuse)

    def flags(self) -> dict:
        return {"nonnegative": self.nonnegative, "integer": self.integer}

    def privacy(self, need_epsilon: bool = True) -> tuple[Fraction, Fraction]:
        """(epsilon, delta) to spend, or a refusal that says how to set them."""
        missing = [k for k in ("epsilon", "delta") if getattr(self, k) is None
                   and (need_epsilon or k == "delta")]
        if missing:
            option = {k: f"{DECLARED[k].spelled('cli')} {DECLARED[k].example}"
                      for k in (*missing, TARGETS[0])}
            how = (" and ".join(self.example(k) for k in missing)
                   + ", or start the shell with "
                   + " ".join(option[k] for k in missing) if self.interactive else
                   "pass " + " ".join(option[k] for k in missing) + " (your own values)")
            if "epsilon" in missing:
                how += ("; or ask by accuracy: " + (self.example(TARGETS[0])
                                                     if self.interactive
                                                     else option[TARGETS[0]]))
            raise PrivacyParameterError(
                f"{' and '.join(missing)} not set: there is no safe default for what a "
                f"query may spend; choose it first, e.g. {how}")
        return self.epsilon, self.delta

    def refresh(self) -> None:
        """Reload the protected tables and the budget of the table in use."""
        self.policies = self.session.policies()
        if self.table not in self.policies:
            self.table = next(iter(self.policies)) if len(self.policies) == 1 else None
        self.budget = self.session.budget(self.table) if self.table else None

    def metric_budget(self) -> tuple | None:
        """(remaining, limit) of the metric budget of the table in use, or None."""
        b = self.budget
        if b is None or "metric_epsilon_limit" not in b:
            return None
        return b["metric_epsilon_remaining"], b["metric_epsilon_limit"]

    def use(self, table: str | None) -> None:
        if table:
            self.table = table.lower()
        self.refresh()
