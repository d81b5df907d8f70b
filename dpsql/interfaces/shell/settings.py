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

from dpsql.noise.accounting import number_from_text, validate_delta, validate_epsilon
from dpsql.errors import DpsqlError, PrivacyParameterError
from dpsql.interfaces.scripts import MODELS, check_asks, check_model, check_strategy, check_target
from dpsql.sql.script import ASKS   # how a query asks: by one of them at most

DEFAULT_CONFIRM_SHARE = Fraction(1, 4)
SETTINGS = ("epsilon", "target_rmse", "max_stderr", "delta", "strategy", "model",
            "nonnegative", "integer", "reuse", "confirm", "confirm_share")
TARGETS = ASKS[1:]
FLAGS = ("nonnegative", "integer", "reuse", "confirm")
ON, OFF = ("on", "true", "yes", "1"), ("off", "false", "no", "0")
#: the targets read "off" to unset them (back to asking by epsilon)
UNSET = ("off", "none")


def _number(text: str, name: str, example: str) -> Fraction:
    return number_from_text(text, name, example)   # ASCII digits only, exact


def parse_epsilon(text: str) -> Fraction:
    return validate_epsilon(_number(text, "epsilon", "0.1"))


def parse_delta(text: str) -> Fraction:
    """delta = 0 asks for pure epsilon-DP (Laplace noise, or mwem)."""
    return validate_delta(_number(text, "delta", "1e-6"))


def parse_strategy(text: str) -> str:
    """``auto``, a strategy name, or a spec with options: ``eigen(principal_vectors=8)``."""
    return check_strategy(str(text))


def parse_model(text: str) -> str:
    """``dp`` (differential privacy) or ``metric`` (d_X privacy under the table's metric)."""
    return check_model(str(text))


def show_target(value) -> str:
    """A target (or epsilon) as typed: ``50``, ``0.1``."""
    return f"{float(value):g}"


def parse_target(text: str, name: str = "target_rmse") -> Fraction | None:
    """An accuracy target in counts (a positive number), or ``off`` to unset it."""
    raw = str(text).strip()
    if raw.lower() in UNSET:
        return None
    value = _number(raw, name, "50")
    check_target(value, name)
    return value


def parse_flag(text: str, name: str) -> bool:
    """``on`` or ``off`` (``true``/``false``, ``yes``/``no``, ``1``/``0`` work too)."""
    raw = str(text).strip().lower()
    if raw in ON or raw in OFF:
        return raw in ON
    raise DpsqlError(f"{name} must be on or off (true or false), got {str(text).strip()!r}")


def parse_share(text: str) -> Fraction:
    raw = str(text).strip()
    percent = raw.endswith("%")
    share = _number(raw[:-1] if percent else raw, "confirm_share", "0.25 or 25%")
    if percent:
        share /= 100
    if not 0 <= share <= 1:
        raise DpsqlError(
            f"confirm_share must be between 0 and 1 (or 0% and 100%), got {raw!r}; "
            "0 asks before every release, 1 never asks")
    return share


PARSERS = {"epsilon": parse_epsilon, "delta": parse_delta, "strategy": parse_strategy,
           "model": parse_model, "confirm_share": parse_share,
           **{k: (lambda text, k=k: parse_target(text, k)) for k in TARGETS},
           **{k: (lambda text, k=k: parse_flag(text, k)) for k in FLAGS}}


class ShellState:
    """The session, the privacy settings, the table in use and its cached budget."""

    def __init__(self, session, *, epsilon=None, delta=None, strategy: str = "auto",
                 model: str = "dp", confirm_share: Fraction = DEFAULT_CONFIRM_SHARE,
                 interactive: bool = True, target_rmse=None, max_stderr=None,
                 nonnegative: bool = False, integer: bool = False, confirm: bool = False,
                 reuse: bool = True):
        check_asks(epsilon, target_rmse, max_stderr, flags=True, who="query")
        self.session = session
        self.epsilon: Fraction | None = epsilon
        self.target_rmse: Fraction | None = target_rmse
        self.max_stderr: Fraction | None = max_stderr
        self.nonnegative = nonnegative
        self.integer = integer
        self.reuse = reuse
        self.confirm = confirm
        self.delta: Fraction | None = delta
        self.strategy = strategy
        self.model = model
        self.confirm_share = confirm_share
        self.interactive = interactive
        self.table: str | None = None      # the table in use (last queried)
        self.budget: dict | None = None    # its cached budget (refresh())
        self.policies: dict = {}           # protected tables (refresh())

    def set(self, name: str, text: str) -> str:
        """Validate and store one setting; return how it now reads."""
        key = name.strip().lower()
        if key not in PARSERS:
            raise DpsqlError(f"unknown setting {name.strip()!r}; settings are "
                             f"{', '.join(SETTINGS)}")
        if not str(text).strip():
            raise DpsqlError(f"\\set {key} needs a value, e.g. {self.example(key)}")
        value = PARSERS[key](text)
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
        return {"epsilon": "\\set epsilon 0.1", "delta": "\\set delta 1e-6",
                "strategy": "\\set strategy auto", "model": "\\set model dp",
                "confirm_share": "\\set confirm_share 25%",
                "target_rmse": "\\set target_rmse 50", "max_stderr": "\\set max_stderr 10",
                "nonnegative": "\\set nonnegative on", "integer": "\\set integer on",
                "reuse": "\\set reuse off",
                "confirm": "\\set confirm on"}[key]

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
            what = {"nonnegative": "answers from non-negative least squares; no privacy cost",
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
            values = {"epsilon": "0.1", "delta": "1e-6"}
            how = (" and ".join(f"\\set {k} {values[k]}" for k in missing)
                   + ", or start the shell with "
                   + " ".join(f"--{k} {values[k]}" for k in missing) if self.interactive else
                   "pass " + " ".join(f"--{k} {values[k]}" for k in missing)
                   + " (your own values)")
            if "epsilon" in missing:
                how += ("; or ask by accuracy: " + ("\\set target_rmse 50" if self.interactive
                                                     else "--target-rmse 50"))
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
