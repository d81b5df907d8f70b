"""What the shell remembers between statements, and the validation of every ``\\set``.

ε and δ have no safe universal default, so they start unset and the first query is refused
until the analyst chooses them. Values are held exactly (``Fraction``): ``0.1`` is one tenth.
"""

from __future__ import annotations

from fractions import Fraction

from ..errors import show_exact  # noqa: F401  (re-exported for the shell modules)

from ..accounting import validate_delta, validate_epsilon
from ..errors import DpsqlError, PrivacyParameterError
from ..scripts import MODELS, check_model, check_strategy

DEFAULT_CONFIRM_SHARE = Fraction(1, 4)
SETTINGS = ("epsilon", "delta", "strategy", "model", "confirm_share")


def _number(text: str, name: str, example: str) -> Fraction:
    raw = str(text).strip()
    try:
        return Fraction(raw)
    except (ValueError, ZeroDivisionError):
        raise PrivacyParameterError(
            f"{name} must be a number such as {example}, got {raw!r}") from None


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
           "model": parse_model, "confirm_share": parse_share}


class ShellState:
    """The session, the privacy settings, the table in use and its cached budget."""

    def __init__(self, session, *, epsilon=None, delta=None, strategy: str = "auto",
                 model: str = "dp", confirm_share: Fraction = DEFAULT_CONFIRM_SHARE,
                 interactive: bool = True):
        self.session = session
        self.epsilon: Fraction | None = epsilon
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
        setattr(self, key, PARSERS[key](text))
        return self.show(key)

    @staticmethod
    def example(key: str) -> str:
        return {"epsilon": "\\set epsilon 0.1", "delta": "\\set delta 1e-6",
                "strategy": "\\set strategy auto", "model": "\\set model dp",
                "confirm_share": "\\set confirm_share 25%"}[key]

    def show(self, key: str) -> str:
        value = getattr(self, key)
        if value is None:
            return f"{key} is not set"
        if key == "confirm_share":
            return f"{key} = {show_exact(value)} ({float(value) * 100:g}% of the remaining epsilon)"
        if key == "model":
            what = ("d_X privacy: epsilon per unit distance, charged to the table's metric "
                    "budget; delta must be 0" if value == "metric" else
                    "differential privacy")
            return f"{key} = {value} ({what})"
        return f"{key} = {show_exact(value) if isinstance(value, Fraction) else value}"

    def privacy(self) -> tuple[Fraction, Fraction]:
        """(epsilon, delta) to spend, or a refusal that says how to set them."""
        missing = [k for k in ("epsilon", "delta") if getattr(self, k) is None]
        if missing:
            how = ("\\set epsilon 0.1 and \\set delta 1e-6, or start the shell with "
                   "--epsilon 0.1 --delta 1e-6" if self.interactive else
                   "pass --epsilon 0.1 --delta 1e-6 (your own values)")
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
