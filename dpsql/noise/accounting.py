"""Privacy costs and their composition, in exact arithmetic.

Every budget quantity dpsql stores, adds or compares is a :class:`fractions.Fraction`; float
addition never touches a budget (DESIGN.md, "Exact budget arithmetic"). Composition is basic
(sequential) composition of (epsilon, delta)-DP: costs add coordinate-wise (Dwork & Roth,
"The Algorithmic Foundations of Differential Privacy", 2014, Theorem 3.16).

Floats are converted through their shortest round-trip ``repr``: ``0.1`` becomes exactly
``1/10``, not the binary value ``3602879701896397/36028797018963968``. This is deliberate: an
analyst who types ``0.1`` means one tenth, and ten charges of 0.1 must exhaust a budget of 1
exactly. Comparisons are exact; a request that lands exactly on the limit is allowed.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from dpsql.errors import BudgetExceededError, PrivacyParameterError

__all__ = [
    "CALIBRATIONS",
    "MIN_EPSILON",
    "MAX_EPSILON",
    "PrivacyCost",
    "check_budget",
    "float_down",
    "float_up",
    "fraction_from_text",
    "fraction_to_text",
    "number_from_text",
    "to_exact",
    "validate_delta",
    "validate_epsilon",
]

#: Smallest epsilon accepted for one release. Below this the Gaussian noise scale
#: (roughly sensitivity * sqrt(2 ln(1.25/delta)) / epsilon) exceeds 1e10 per unit of
#: sensitivity: the answers are useless and the calibration arithmetic starts to overflow.
MIN_EPSILON = Fraction(1, 10**9)

#: Largest epsilon accepted for one release. A bound of e^100 on the likelihood ratio is no
#: meaningful privacy guarantee, and exp(epsilon) overflows double precision soon after.
MAX_EPSILON = Fraction(100)

#: The Gaussian noise calibrations a request may name (:mod:`dpsql.noise.gaussian` applies
#: them). Declared here, beside the other limits of a request's privacy parameters, so that
#: the settings' declaration and the command line's help read it without numpy and scipy.
CALIBRATIONS = ("analytic", "classic")

_TEXT_FORMAT = re.compile(r"(-?[0-9]+)/([0-9]+)")


def to_exact(value: object, name: str) -> Fraction:
    """Convert a privacy parameter to an exact :class:`Fraction`.

    Accepts ``int`` (any :class:`numbers.Integral` except ``bool``), ``float`` (through its
    shortest ``repr``, so ``0.1 == Fraction(1, 10)``), :class:`Fraction` and
    :class:`decimal.Decimal`. Refuses ``bool``, ``str``, ``None``, anything else and every
    non-finite value (NaN, +-inf) with :class:`PrivacyParameterError` naming ``name``.
    """
    if isinstance(value, bool):
        raise PrivacyParameterError(
            f"{name} must be a number (int, float, Fraction or Decimal), got a bool; "
            f"pass a numeric value such as 0.5"
        )
    if isinstance(value, Fraction):
        return value
    if isinstance(value, numbers.Integral):
        return Fraction(int(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PrivacyParameterError(f"{name} must be finite, got {value!r}")
        # float(value) strips float subclasses (numpy.float64) whose repr is not a number.
        return Fraction(repr(float(value)))
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise PrivacyParameterError(f"{name} must be finite, got Decimal({str(value)!r})")
        return Fraction(value)
    raise PrivacyParameterError(
        f"{name} must be a number (int, float, Fraction or Decimal), got "
        f"{type(value).__name__}; convert it first (e.g. Fraction('1/10') or 0.1)"
    )


def validate_epsilon(value: object, name: str = "epsilon") -> Fraction:
    """Check one release's epsilon: finite, in ``[MIN_EPSILON, MAX_EPSILON]``; return it exactly."""
    epsilon = to_exact(value, name)
    allowed = f"allowed range is {_show(MIN_EPSILON)} <= {name} <= {_show(MAX_EPSILON)}"
    if epsilon <= 0:
        raise PrivacyParameterError(
            f"{name} must be > 0, got {_show(epsilon)}; {allowed}"
        )
    if epsilon < MIN_EPSILON:
        raise PrivacyParameterError(
            f"{name} = {_show(epsilon)} is too small: the noise scale would be unusable and "
            f"overflow the calibration; {allowed}"
        )
    if epsilon > MAX_EPSILON:
        raise PrivacyParameterError(
            f"{name} = {_show(epsilon)} is too large: a likelihood-ratio bound of "
            f"e^{name} gives no meaningful privacy and overflows the calibration; {allowed}"
        )
    return epsilon


def validate_delta(value: object, name: str = "delta") -> Fraction:
    """Check a delta: finite and ``0 <= delta < 1``; return it exactly.

    ``delta = 0`` is valid here (pure DP); mechanisms that need ``delta > 0`` (Gaussian)
    refuse it themselves.
    """
    delta = to_exact(value, name)
    if delta < 0 or delta >= 1:
        raise PrivacyParameterError(
            f"{name} must satisfy 0 <= {name} < 1, got {_show(delta)}; typical values are "
            f"well below 1/n for n rows, e.g. 1e-6"
        )
    return delta


@dataclass(frozen=True)
class PrivacyCost:
    """An (epsilon, delta) privacy cost or budget, held exactly.

    Fields accept anything :func:`to_exact` accepts and are stored as ``Fraction``. Both
    coordinates must be ``>= 0``. ``+`` is basic composition (Dwork & Roth 2014, Thm 3.16).
    """

    epsilon: Fraction
    delta: Fraction

    def __post_init__(self) -> None:
        epsilon = to_exact(self.epsilon, "epsilon")
        delta = to_exact(self.delta, "delta")
        if epsilon < 0:
            raise PrivacyParameterError(
                f"epsilon of a privacy cost must be >= 0, got {_show(epsilon)}"
            )
        if delta < 0:
            raise PrivacyParameterError(f"delta of a privacy cost must be >= 0, got {_show(delta)}")
        object.__setattr__(self, "epsilon", epsilon)
        object.__setattr__(self, "delta", delta)

    @classmethod
    def zero(cls) -> PrivacyCost:
        """The cost of releasing nothing."""
        return cls(Fraction(0), Fraction(0))

    def __add__(self, other: object) -> PrivacyCost:
        if not isinstance(other, PrivacyCost):
            return NotImplemented
        return PrivacyCost(self.epsilon + other.epsilon, self.delta + other.delta)

    def fits_within(self, limit: PrivacyCost) -> bool:
        """True when both coordinates are ``<=`` the limit's (exact; equality fits)."""
        if not isinstance(limit, PrivacyCost):
            raise TypeError(f"limit must be a PrivacyCost, got {type(limit).__name__}")
        return self.epsilon <= limit.epsilon and self.delta <= limit.delta

    def __str__(self) -> str:
        return f"(epsilon={_show(self.epsilon)}, delta={_show(self.delta)})"


def check_budget(table: str, spent: PrivacyCost, requested: PrivacyCost,
                 limit: PrivacyCost) -> None:
    """Refuse a request that would take ``spent + requested`` past ``limit``.

    Raises :class:`BudgetExceededError` carrying the offending coordinate (``"epsilon"`` is
    checked first, then ``"delta"``) and its spent, requested and limit values. Exact
    comparison: landing exactly on the limit is allowed. Charges nothing itself; the ledger
    calls this inside its atomic check-and-charge.
    """
    for argument, label in ((spent, "spent"), (requested, "requested"), (limit, "limit")):
        if not isinstance(argument, PrivacyCost):
            raise TypeError(f"{label} must be a PrivacyCost, got {type(argument).__name__}")
    total = spent + requested
    if total.epsilon > limit.epsilon:
        raise BudgetExceededError(table, "epsilon", spent.epsilon, requested.epsilon,
                                  limit.epsilon)
    if total.delta > limit.delta:
        raise BudgetExceededError(table, "delta", spent.delta, requested.delta, limit.delta)


def float_up(value: Fraction) -> float:
    """The smallest double >= ``value`` (int / int division in Python is correctly rounded)."""
    value = Fraction(value)
    result = value.numerator / value.denominator
    if Fraction(result) < value:
        result = math.nextafter(result, math.inf)
    return result


def float_down(value: Fraction) -> float:
    """The largest double <= ``value``: how an exact ε or δ enters float arithmetic when the
    rounding must go against the spender (a guarantee at the smaller value implies it at the
    exact one)."""
    value = Fraction(value)
    result = value.numerator / value.denominator
    if Fraction(result) > value:
        result = math.nextafter(result, -math.inf)
    return result


def fraction_to_text(value: object) -> str:
    """Store an exact value as ``"numerator/denominator"`` (lowest terms, e.g. ``"3/10"``)."""
    f = to_exact(value, "value")
    return f"{f.numerator}/{f.denominator}"


#: a number typed by a user: ASCII digits only (Python's float(), int(), Fraction and Decimal
#: also read other scripts' digits, so "١" would be 1), an optional "/denominator", and an
#: exponent of at most 4 digits (Fraction("1e999999999") would build a 10**999999999)
_ASCII_NUMBER = re.compile(
    r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,4})?(?:/\d+)?", re.ASCII)


def number_from_text(text, name: str, example: str = "0.5",
                     error: type = PrivacyParameterError) -> Fraction:
    """A number a user typed (a CLI flag, a shell ``\\set``, a script ``SET``, a strategy
    option such as ``rounds=``), exactly: plain ASCII decimal text, else ``error`` with a
    clear message. Every interface reads users' numbers through this one function."""
    raw = str(text).strip()
    if not raw.isascii():
        raise error(f"{name} must be written with ASCII digits 0-9, e.g. {example}; got "
                    f"{raw!r}")
    if not _ASCII_NUMBER.fullmatch(raw):
        raise error(f"{name} must be a number such as {example}, got {raw!r}")
    try:
        return Fraction(raw)
    except (ValueError, ZeroDivisionError):
        raise error(f"{name} must be a number such as {example}, got {raw!r}") from None


def fraction_from_text(text: str) -> Fraction:
    """Read back a value written by :func:`fraction_to_text`.

    Only the ``"numerator/denominator"`` form with a positive denominator is accepted, so a
    corrupted ledger cell is refused rather than silently misread.
    """
    if not isinstance(text, str):
        raise PrivacyParameterError(
            f"stored privacy value must be text 'numerator/denominator', got {type(text).__name__}"
        )
    match = _TEXT_FORMAT.fullmatch(text.strip())
    if match is None or int(match.group(2)) == 0:
        raise PrivacyParameterError(
            f"stored privacy value {text!r} is not of the form 'numerator/denominator' "
            f"with a positive denominator"
        )
    return Fraction(int(match.group(1)), int(match.group(2)))


def _show(value: Fraction) -> str:
    """An integer, a short decimal when that is exact, else ``approx (exactly num/den)``."""
    if value.denominator == 1:
        return str(value.numerator) if abs(value.numerator) < 10**30 else _huge(value)
    if abs(value) > 10**300:         # float() would overflow
        return _huge(value)
    for digits in range(1, 18):
        text = f"{float(value):.{digits}g}"
        if Fraction(text) == value:
            return text
    return f"{float(value):.6g} (exactly {value.numerator}/{value.denominator})"


def _huge(value: Fraction) -> str:
    """A value too large to print in full (or as a float): its order of magnitude."""
    return f"{'-' if value < 0 else ''}about 10^{int(math.log10(abs(int(value))))}"
