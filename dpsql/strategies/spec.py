"""Strategy specs: a strategy named with options, e.g. ``"eigen(principal_vectors=32)"``.

The same text works from Python (``strategy=...``), the shell (``\\set strategy ...``) and
SQL scripts (``SET dpsql.strategy = '...'``). Grammar (whitespace allowed between tokens,
names and keywords case-insensitive)::

    spec    := NAME [ "(" [ option { "," option } ] ")" ]
    option  := NAME "=" value
    value   := INTEGER | DECIMAL | "true" | "false" | NAME | 'text' | "text"

Parsing is a small tokenizer and a recursive descent over that grammar: nothing is
evaluated. Each strategy accepts only the options listed in :data:`OPTIONS` (the public
parameters of its constructor, with their types and ranges); anything else is refused with a
:class:`~dpsql.errors.StrategyError` that lists what is allowed.

:func:`resolve` returns the *canonical* spec — lower case, options in the constructor's
order, values normalised, options equal to their defaults dropped — and the strategy object:
the registry's own object for a plain name (or when every option is a default), else a new
instance built with the options. Such an instance carries ``options`` (the canonical option
tuple), which :func:`dpsql.store.strategy_cache.fingerprint` hashes, so two specs that design
different strategies never share a cache entry, and equivalent spellings always do.
``auto`` is not a strategy: callers handle it before calling :func:`resolve`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from dpsql.errors import StrategyError
from dpsql.strategies.gaussian.coa import COA
from dpsql.strategies.gaussian.eigen import EigenDesign
from dpsql.strategies.gaussian.optimal import Optimal

#: longest spec accepted (a spec is a name and a few options)
MAX_SPEC_LENGTH = 200


@dataclass(frozen=True)
class Option:
    """One constructor parameter that a spec may set."""

    kind: str                       # "int", "float", "bool" or "choice"
    default: Any
    low: float | None = None        # inclusive bounds ("int"), exclusive ("float")
    high: float | None = None
    choices: tuple = ()
    help: str = ""

    def describe(self) -> str:
        if self.kind == "bool":
            what = "true|false"
        elif self.kind == "choice":
            what = "|".join(self.choices)
        elif self.kind == "int":
            what = f"integer {_fmt(self.low)}..{_fmt(self.high)}"
        else:
            what = f"number in ({_fmt(self.low)}, {_fmt(self.high)})"
        return f"{what}, default {_fmt(self.default)}"


#: options per strategy class (the public constructor parameters, in constructor order)
OPTIONS: dict[type, dict[str, Option]] = {
    EigenDesign: {
        "principal_vectors": Option("int", None, 1, 1_000_000,
                                    help="weigh the top k eigen-queries individually"),
        "separation": Option("bool", False, help="eigen-separation (groups of ~n^(1/3))"),
        "group_size": Option("int", None, 1, 1_000_000,
                             help="group size for separation"),
        "relative": Option("bool", False, help="scale every query to unit norm first"),
        "solver": Option("choice", "fast", choices=("fast", "cvxpy")),
        "tol": Option("float", 1e-6, 0.0, 1.0, help="certified relative gap of Program 1"),
    },
    Optimal: {
        "tol": Option("float", 1e-6, 0.0, 1.0, help="certified relative duality gap"),
        "max_iterations": Option("int", 100, 1, 10_000),
        "symmetry": Option("bool", True, help="use the reversal symmetry of V when present"),
    },
    COA: {
        "tol": Option("float", 1e-6, 0.0, 1.0, help="certified relative duality gap"),
        "theta_min": Option("float", 1e-10, 0.0, 1.0, help="smallest homotopy regulariser"),
        "cg_steps": Option("int", 5, 1, 1000),
        "max_newton": Option("int", 60, 1, 100_000),
        "warm": Option("choice", "optimal", choices=("optimal", "identity"),
                       help="start from optimal's certified point, or the paper's cold start"),
    },
}

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<string>'[^']*'|"[^"]*")
  | (?P<punct>[(),=])
""", re.VERBOSE | re.ASCII)     # ASCII digits only: "\d" would also read "١" as 1


def _fmt(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def _tokens(spec: str) -> list[tuple[str, str, int]]:
    out, pos = [], 0
    while pos < len(spec):
        m = _TOKEN.match(spec, pos)
        if m is None and not spec[pos].isascii():
            raise StrategyError(f"strategy spec {spec!r}: non-ASCII character {spec[pos]!r} at "
                                f"position {pos + 1}; write names and numbers in ASCII "
                                "(digits 0-9)")
        if m is None:
            raise StrategyError(f"strategy spec {spec!r}: unexpected character {spec[pos]!r} "
                                f"at position {pos + 1}; write name(option=value, ...)")
        if m.lastgroup != "space":
            out.append((m.lastgroup, m.group(), pos + 1))
        pos = m.end()
    return out


def parse(spec: str) -> tuple[str, list[tuple[str, str, str]]]:
    """``(name, [(option, token kind, token text), ...])``: syntax only, nothing checked
    against a registry. Raises :class:`StrategyError` on malformed text."""
    if not isinstance(spec, str):
        raise StrategyError(f"a strategy must be named by a string, got {spec!r}")
    if len(spec) > MAX_SPEC_LENGTH:
        raise StrategyError(f"strategy spec is too long ({len(spec)} characters; at most "
                            f"{MAX_SPEC_LENGTH})")
    toks = _tokens(spec)
    end = ("end", "", len(spec) + 1)
    i = 0

    def peek():
        return toks[i] if i < len(toks) else end

    def take(kind: str, text: str | None = None, what: str = ""):
        nonlocal i
        tok = peek()
        if tok[0] != kind or (text is not None and tok[1] != text):
            found = "the end" if tok[0] == "end" else repr(tok[1])
            raise StrategyError(f"strategy spec {spec!r}: expected {what} at position "
                                f"{tok[2]}, found {found}; write name(option=value, ...)")
        i += 1
        return tok

    if not toks:
        raise StrategyError("the strategy spec is empty; choose 'auto' or a strategy name")
    name = take("name", what="a strategy name")[1].lower()
    options: list[tuple[str, str, str]] = []
    if peek()[0] == "punct" and peek()[1] == "(":
        take("punct", "(")
        if not (peek()[0] == "punct" and peek()[1] == ")"):
            while True:
                key = take("name", what="an option name")[1].lower()
                take("punct", "=", what=f"'=' after {key!r}")
                tok = peek()
                if tok[0] not in ("number", "name", "string"):
                    take("number", what=f"a value for {key!r}")
                i += 1
                text = tok[1][1:-1] if tok[0] == "string" else tok[1]
                options.append((key, tok[0], text))
                if peek()[0] == "punct" and peek()[1] == ",":
                    take("punct", ",")
                    continue
                break
        take("punct", ")", what="',' or ')'")
    take("end", what="the end of the spec")
    return name, options


def _value(spec: str, name: str, key: str, opt: Option, kind: str, text: str):
    def bad(expected: str):
        return StrategyError(f"strategy spec {spec!r}: option {key!r} of {name!r} must be "
                             f"{expected}, got {text!r}")

    if opt.kind == "bool":
        word = text.lower()
        if kind not in ("name", "string") or word not in ("true", "false"):
            raise bad("true or false")
        return word == "true"
    if opt.kind == "choice":
        word = text.lower()
        if kind not in ("name", "string") or word not in opt.choices:
            raise bad("one of " + ", ".join(opt.choices))
        return word
    if kind != "number":
        raise bad("a number" if opt.kind == "float" else "an integer")
    if opt.kind == "int":
        if not re.fullmatch(r"[+-]?\d+", text):
            raise bad("an integer")
        value = int(text)
        if (opt.low is not None and value < opt.low) or (opt.high is not None
                                                         and value > opt.high):
            raise bad(f"an integer from {_fmt(opt.low)} to {_fmt(opt.high)}")
        return value
    value = float(text)
    if not math.isfinite(value) or (opt.low is not None and not value > opt.low) or (
            opt.high is not None and not value < opt.high):
        raise bad(f"a number strictly between {_fmt(opt.low)} and {_fmt(opt.high)}")
    return value


def allowed_options(strategy) -> dict[str, Option]:
    """The options a strategy object's spec may set (empty for option-less strategies)."""
    return OPTIONS.get(type(strategy), {})


def describe_options(name: str, strategy) -> str:
    opts = allowed_options(strategy)
    if not opts:
        return f"{name!r} takes no options"
    return f"{name!r} accepts " + "; ".join(f"{k} ({o.describe()})" for k, o in opts.items())


def _known(name: str, spec: str, registry) -> None:
    if name == "auto":
        raise StrategyError(f"'auto' compares the candidate strategies: it is not one "
                            f"strategy and takes no options (got {spec!r}); to set options "
                            f"name one of {sorted(registry)}")
    if name not in registry:
        raise StrategyError(f"unknown strategy {name!r} in {spec!r}; choose 'auto' or one of "
                            f"{sorted(registry)}")


def resolve(spec: str, registry: Mapping[str, Any] | None = None) -> tuple[str, Any]:
    """``(canonical spec, strategy object)`` for a spec such as ``"eigen(separation=true)"``.

    ``registry`` maps plain names to strategy objects (default: the Gaussian
    :data:`dpsql.strategies.REGISTRY`). A plain name, or options all equal to their
    defaults, returns the registry's object itself. Raises :class:`StrategyError` for
    malformed text, unknown strategies or options, bad values, or options the constructor
    refuses together (e.g. ``principal_vectors`` with ``separation``).
    """
    if registry is None:
        from dpsql.strategies import REGISTRY as registry   # noqa: N811  (lazy: this module is imported there)
    head = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)", spec) if isinstance(spec, str) else None
    if head is not None and len(spec) <= MAX_SPEC_LENGTH:
        _known(head.group(1).lower(), spec, registry)   # an unknown name before any syntax
    name, raw = parse(spec)
    _known(name, spec, registry)
    base = registry[name]
    opts = allowed_options(base)
    chosen: dict[str, Any] = {}
    for key, kind, text in raw:
        if key not in opts:
            raise StrategyError(f"unknown option {key!r} for strategy {name!r} in {spec!r}: "
                                + describe_options(name, base))
        if key in chosen:
            raise StrategyError(f"option {key!r} is given twice in {spec!r}")
        chosen[key] = _value(spec, name, key, opts[key], kind, text)
    if isinstance(base, EigenDesign) and chosen.get("group_size") is not None \
            and not chosen.get("separation"):
        raise StrategyError(f"strategy spec {spec!r}: group_size only applies with "
                            "separation=true")
    kept = tuple((k, chosen[k]) for k in opts if k in chosen and chosen[k] != opts[k].default)
    if not kept:
        return name, base
    canonical = f"{name}(" + ", ".join(f"{k}={_fmt(v)}" for k, v in kept) + ")"
    try:
        obj = type(base)(**dict(kept))
    except (ValueError, TypeError) as exc:
        raise StrategyError(f"strategy spec {spec!r}: {exc}") from None
    obj.options = kept          # distinct strategy-cache fingerprints (strategy_cache.py)
    return canonical, obj


__all__ = ["OPTIONS", "Option", "allowed_options", "describe_options", "parse", "resolve"]
