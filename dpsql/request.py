"""The one Request value: every setting an analyst can ask, declared once.

:data:`SETTINGS` declares each request setting exactly once: its name, kind, default,
valid values (the ``check`` applied after parsing), help text and the interfaces that
expose it. Every interface is generated from it and parses through it:

- ``cli``: ``dpsql run`` / ``dpsql explain`` options (``--epsilon``), via
  :meth:`Setting.argparse_options`;
- ``shell``: ``dpsql shell`` options and ``\\set epsilon 0.1`` (and its listing,
  completion and help);
- ``dbapi``: :func:`dpsql.dbapi.connect` keywords, connection attributes and
  ``configure()``;
- ``script``: ``SET dpsql.epsilon = 0.1;`` in a reporting script.

:meth:`Setting.parse` is the one parser of a setting. Text interfaces (cli, shell, script)
hand it the text as typed; value interfaces (dbapi, and :class:`Request` itself, which
:meth:`dpsql.Session.explain` and :meth:`~dpsql.Session.answer` build) hand it Python
values. A bad value gives the same message everywhere; only the setting's name is spelled
as the interface spells it (``--epsilon``, ``epsilon``, ``dpsql.epsilon``). Numbers as text
are ASCII decimals (``0.1``, ``1e-6``, ``-3``) or ASCII fractions (``1/3``), held exactly.

:data:`CONNECTION_SETTINGS` is the second, small table: settings of a connection rather
than of a request (how long to wait for the database file, whether to create it).

:class:`Request` is the frozen, validated value of everything an analyst can ask: the
batch, epsilon and delta or an accuracy target, strategy, calibration, model, the
consistency and reuse flags, confirm, the release name. Its ``__post_init__`` checks every
field with the declared parser and the rules between fields (epsilon or a target, not
both; the classic calibration only for epsilon < 1; a metric request is pure, ...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from fractions import Fraction
from typing import Callable

from dpsql.errors import DpsqlError, PrivacyParameterError, StrategyError, show_exact
from dpsql.noise.accounting import number_from_text, to_exact, validate_delta, validate_epsilon
from dpsql.noise.gaussian import CALIBRATIONS
from dpsql.workload import limits as planning

__all__ = ["ASKS", "CONNECTION_SETTINGS", "FLAGS", "TARGETS", "INTERFACES", "MODELS", "Request", "SETTINGS", "Setting",
           "check_asks", "check_strategy", "given", "settings_for"]

#: where a setting can be exposed; the text interfaces hand the parser text as typed
INTERFACES = ("cli", "shell", "dbapi", "script")
TEXT_INTERFACES = ("cli", "shell", "script")
MODELS = ("dp", "metric")
MAX_RELEASE_NAME = 200
#: a flag as text: on / off (true/false, yes/no, 1/0 work too)
ON, OFF = ("on", "true", "yes", "1"), ("off", "false", "no", "0")


# --------------------------------------------------------------------------- value rules
# Each rule takes the parsed value and the setting's name as the interface spells it.

def _shown(value: Fraction) -> str:
    """An exact value for a message, even one too large for a float."""
    if abs(value) > 10**300:
        return f"{'-' if value < 0 else ''}about 10^{int(math.log10(abs(int(value))))}"
    return show_exact(value)


def _epsilon(value, name: str) -> Fraction:
    return validate_epsilon(value, name)


def _delta(value, name: str) -> Fraction:
    """delta = 0 asks for pure epsilon-DP (Laplace noise, or mwem); delta > 0 Gaussian."""
    return validate_delta(value, name)


def _target(value, name: str) -> float:
    """An accuracy target (``target_rmse``: the batch's expected RMSE; ``max_stderr``:
    every answer's standard error), in counts: a positive finite number, as a float."""
    exact = to_exact(value, name)
    if exact <= 0:
        raise PrivacyParameterError(
            f"{name} must be a positive number (an expected error, in counts), got "
            f"{_shown(exact)}")
    try:
        number = float(exact)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise PrivacyParameterError(f"{name} is too large to be an expected error: "
                                    f"{_shown(exact)}")
    return number


def check_strategy(value, name: str = "strategy") -> str:
    """A strategy: ``auto``, a strategy spec with options (``eigen(principal_vectors=32)``,
    ``mwem(rounds=20)``; :func:`dpsql.mechanisms.matrix.check_spec`) or a metric model's
    mechanism (``dx_laplace``, ``dx_mwem(...)``, ``dx_smalldb(size=m)``;
    :func:`dpsql.mechanisms.catalog.check_dx_spec`). Which noise family applies is decided
    by delta and the model when the request runs. Raises :class:`StrategyError`."""
    from dpsql.mechanisms.catalog import check_dx_spec
    from dpsql.mechanisms.matrix import check_spec

    if isinstance(value, str) and value.strip().lower() == "dx_laplace":
        return "dx_laplace"
    if isinstance(value, str) and value.strip().lower().startswith("dx_"):
        return check_dx_spec(value)          # dx_mwem(...), dx_smalldb(size=m)
    return check_spec(value)


def _model(value, name: str) -> str:
    """``dp`` (differential privacy) or ``metric`` (d_X privacy under the table's declared
    metric; epsilon per unit distance, charged to its metric budget; delta must be 0)."""
    model = value.strip().lower() if isinstance(value, str) else None
    if model not in MODELS:
        raise PrivacyParameterError(
            f"{name} must be 'dp' (differential privacy) or 'metric' (d_X privacy under the "
            f"table's declared metric), got {value!r}")
    return model


def _calibration(value, name: str) -> str:
    calibration = value.strip().lower() if isinstance(value, str) else None
    if calibration not in CALIBRATIONS:
        raise PrivacyParameterError(f"{name} must be one of {CALIBRATIONS}, got {value!r}")
    return calibration


def _release_name(value, name: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_RELEASE_NAME \
            or any(c in value for c in "\n\r\t") or value != value.strip():
        raise PrivacyParameterError(
            f"a release name must be a non-empty string of at most {MAX_RELEASE_NAME} "
            "characters, without tabs, line breaks or surrounding spaces")
    return value


def _share(value, name: str) -> Fraction:
    share = to_exact(value, name)
    if not 0 <= share <= 1:
        raise PrivacyParameterError(
            f"{name} must be between 0 and 1 (or 0% and 100%), got {_shown(share)}; "
            "0 asks before every release, 1 never asks")
    return share


def _flag(value: bool, name: str) -> bool:
    """A flag: the parser has checked it all (a bool, or its text spelling)."""
    return value


def _seconds(value, name: str) -> float:
    seconds = to_exact(value, name)
    if not 0 <= seconds <= 86400:
        raise PrivacyParameterError(f"{name} must be a number of seconds from 0 to 86400, "
                                    f"got {_shown(seconds)}")
    return float(seconds)


def _memory(value, name: str) -> int:
    """A memory limit in bytes: a whole number from 1 MiB to 1 PiB."""
    size = to_exact(value, name)
    if size.denominator != 1 or not 2 ** 20 <= size <= 2 ** 50:
        raise PrivacyParameterError(
            f"{name} must be a whole number of bytes from 1048576 (1 MiB) to 2^50 (1 PiB), "
            f"got {_shown(size)}")
    return int(size)


def _time_limit(value, name: str) -> float:
    """A planning time limit in seconds: more than 0, at most a day."""
    seconds = to_exact(value, name)
    if not 0 < seconds <= 86400:
        raise PrivacyParameterError(f"{name} must be a number of seconds above 0 and at most "
                                    f"86400, got {_shown(seconds)}")
    return float(seconds)


# --------------------------------------------------------------------------- declaration

@dataclass(frozen=True)
class Setting:
    """One setting, declared once. ``kind``: ``number`` (``share``: a number or a
    percentage), ``flag`` (true/false), ``text`` (a string: a strategy spec, a choice, a
    name). ``check(value, name)`` validates the parsed value and returns it normalised."""

    name: str
    kind: str
    default: object
    help: str
    interfaces: tuple
    check: Callable
    example: str = ""            # a valid value, as typed
    choices: tuple = ()          # offered by completion (the check decides validity)
    field: str = ""              # the Request field / Session keyword (default: name)
    metavar: str | None = None
    required: str = ""           # why there is no default (a value interface must give it)
    ask: bool = False            # epsilon and the accuracy targets: a request asks by one
    request: bool = True         # a field of Request (else an interface's own setting)
    explain: bool = True         # taken by Session.explain (else only when spending)

    # ---------------------------------------------------------------- spelling
    @property
    def keyword(self) -> str:
        return self.field or self.name

    @property
    def flag(self) -> str:
        """The command-line option: ``--target-rmse``; ``--no-reuse`` for a flag that is on
        by default."""
        word = self.name.replace("_", "-")
        return f"--no-{word}" if self.kind == "flag" and self.default is True else f"--{word}"

    def spelled(self, interface: str) -> str:
        """The setting's name as ``interface`` spells it (in messages too)."""
        if interface == "cli":
            return f"--{self.name.replace('_', '-')}"
        if interface == "script":
            return f"dpsql.{self.name}"
        return self.name

    def example_text(self, interface: str) -> str:
        """A valid value as typed in ``interface``: a flag's non-default value."""
        if self.kind != "flag":
            return f"'{self.example}'" if interface == "script" and self.kind == "text" \
                else self.example
        on = not self.default
        if interface == "script":
            return "true" if on else "false"
        if interface == "dbapi":
            return repr(on)
        return "on" if on else "off"

    def argparse_options(self) -> dict:
        """``add_argument`` keywords for the command line (``dest`` is the name; unset
        options are None, so the declared default or a script's SET applies)."""
        if self.kind == "flag" and self.default is True:
            return dict(dest=self.name, default=None, action="store_false",
                        help=f"turn {self.name} off (on by default: {self.help})")
        if self.kind == "flag":
            return dict(dest=self.name, default=None, help=self.help, action="store_true")
        return dict(dest=self.name, default=None, help=self.help.replace("%", "%%"),
                    metavar=self.metavar or self.name.upper())

    # ---------------------------------------------------------------- parsing
    def refusal(self, name: str, got: str) -> DpsqlError:
        """The error for a value of the wrong form (``got``: how it was given)."""
        if self.kind == "flag":
            return PrivacyParameterError(f"{name} must be true or false, got {got}")
        if self.kind in ("number", "share") and not got.isascii():
            return PrivacyParameterError(
                f"{name} must be written with ASCII digits 0-9, e.g. {self.example}; got {got}")
        if self.kind in ("number", "share"):
            return PrivacyParameterError(
                f"{name} must be a number such as {self.example}, got {got}")
        return PrivacyParameterError(f"{name} must be text, got {got}")

    def parse(self, raw, interface: str = "dbapi"):
        """The setting's value from ``raw``: text as typed in a text interface (cli,
        shell, script) or a Python value (dbapi, Request); refused with the same message
        in every interface (the name spelled as ``interface`` spells it)."""
        name = self.spelled(interface)
        if interface in TEXT_INTERFACES and not (self.kind == "flag" and
                                                 isinstance(raw, bool)):
            if not isinstance(raw, str):
                raise self.refusal(name, repr(raw))
            return self.check(self._from_text(raw, name), name)
        return self._from_value(raw, name)

    def _number(self, text: str, name: str, got: str) -> Fraction:
        """``text`` read by the one reader of typed numbers (ASCII decimals or fractions,
        exactly: :func:`dpsql.noise.accounting.number_from_text`), refused with this
        setting's message (``got``: the value as the user gave it)."""
        try:
            return number_from_text(text, name, self.example)
        except PrivacyParameterError:
            raise self.refusal(name, got) from None

    def _from_text(self, raw: str, name: str):
        text = raw.strip()
        if self.kind == "flag":
            if text.lower() in ON or text.lower() in OFF:
                return text.lower() in ON
            raise self.refusal(name, repr(text))
        if self.kind in ("number", "share"):
            percent = self.kind == "share" and text.endswith("%")
            digits = text[:-1].strip() if percent else text
            return self._number(digits, name, repr(text)) / (100 if percent else 1)
        return raw                   # text: the check strips what it may (not a name)

    def _from_value(self, value, name: str):
        if value is None and self.default is None and not self.required:
            return None
        if self.kind == "flag":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in ON + OFF:
                raise PrivacyParameterError(
                    f"{name} must be true or false, got str {value!r}; pass True or False "
                    "itself, not text")
            raise self.refusal(name, repr(value))
        if self.kind in ("number", "share") and isinstance(value, str):
            self._number(value, name, repr(value.strip()))     # refused unless a number
            raise PrivacyParameterError(
                f"{name} must be a number such as {self.example}, got str {value!r}; pass "
                "the number itself, not text")
        if value is None:
            raise PrivacyParameterError(
                f"{name} must be given: {self.required}, e.g. {name}={self.example}")
        return self.check(value, name)


def _declare(*settings: Setting) -> dict:
    return {s.name: s for s in settings}


_ALL = INTERFACES
_TARGET_HELP = ("accuracy first, instead of epsilon: spend the smallest epsilon whose {} "
                "is at most this (shown first; spent only once confirmed)")

#: every request setting, in the order interfaces list them
SETTINGS: dict[str, Setting] = _declare(
    Setting("epsilon", "number", None, "epsilon each release spends (no default; or ask by "
            "accuracy with target_rmse or max_stderr)", _ALL, _epsilon, "0.1", metavar="E",
            ask=True),
    Setting("target_rmse", "number", None, _TARGET_HELP.format("expected RMSE (the batch's)"),
            _ALL, _target, "50", metavar="R", ask=True),
    Setting("max_stderr", "number", None,
            _TARGET_HELP.format("largest standard error of an answer"), _ALL, _target, "10",
            metavar="S", ask=True),
    Setting("delta", "number", None, "delta each release spends (no default; 0 asks for "
            "pure epsilon-DP: Laplace noise, or mwem)", _ALL, _delta, "1e-6", metavar="D",
            required="there is no safe default (0 asks for pure epsilon-DP)"),
    Setting("strategy", "text", "auto", "auto (the lowest expected error), a strategy name, "
            "or a spec with options such as 'eigen(principal_vectors=32)' or "
            "'mwem(rounds=20)' (mwem needs delta 0)", _ALL, check_strategy, "auto",
            metavar="S"),
    Setting("calibration", "text", "analytic", "Gaussian noise calibration: analytic "
            "(default) or classic (only for epsilon < 1)", ("cli", "dbapi", "script"),
            _calibration, "analytic", choices=CALIBRATIONS, metavar="C"),
    Setting("model", "text", "dp", "privacy model: dp (differential privacy) or metric "
            "(d_X privacy under the table's declared metric: epsilon per unit distance, "
            "delta 0, charged to its metric budget)", _ALL, _model, "dp", choices=MODELS,
            metavar="M"),
    Setting("nonnegative", "flag", False, "answers from non-negative least squares "
            "(post-processing, no privacy cost)", _ALL, _flag, explain=False),
    Setting("integer", "flag", False, "round the answers to integers (post-processing, no "
            "privacy cost)", _ALL, _flag, explain=False),
    Setting("reuse", "flag", True, "answer from past releases wherever they are at least as "
            "accurate, at no privacy cost; off: measure every request afresh", _ALL, _flag),
    Setting("confirm", "flag", False, "spend the epsilon an accuracy target needs without "
            "asking (see it first with explain)", _ALL, _flag, explain=False),
    Setting("confirm_share", "share", Fraction(1, 4), "ask before spending more than this "
            "share of the remaining epsilon (default 0.25; 25% works too; 1 never asks)",
            ("shell",), _share, "0.25", metavar="SHARE", request=False),
    Setting("release", "text", None, "release name (a script's workload k is released as "
            "NAME/k; the command line's overrides SET dpsql.release)", ("cli", "script"),
            _release_name, "report-2026", field="name", metavar="NAME", explain=False),
)

#: how a request asks: by epsilon, or by an accuracy target (the smallest epsilon meeting it)
ASKS = tuple(s.name for s in SETTINGS.values() if s.ask)
TARGETS = ASKS[1:]
FLAGS = tuple(s.name for s in SETTINGS.values() if s.kind == "flag")

#: settings of a connection, not of a request
CONNECTION_SETTINGS: dict[str, Setting] = _declare(
    Setting("lock_timeout", "number", 30.0, "seconds to wait while another process holds "
            "the database file", ("cli", "shell", "dbapi"), _seconds, "30",
            metavar="SECONDS"),
    Setting("create", "flag", False, "create the database file if it does not exist "
            "(default: refuse a path that does not exist)",
            ("dbapi",), _flag),
    Setting("max_memory", "number", planning.DEFAULT_MAX_MEMORY, "bytes one request's "
            "planning may use (default 4 GiB, or half the machine's memory if less): "
            "strategies predicted to need more are skipped, a batch none fits is refused",
            ("cli", "shell", "dbapi"), _memory, "4294967296"),
    Setting("time_limit", "number", planning.DEFAULT_TIME_LIMIT, "seconds one request's "
            "planning may take (predicted from the batch's size; default 60)",
            ("cli", "shell", "dbapi"), _time_limit, "60"),
)


def settings_for(interface: str, table: dict | None = None) -> list[Setting]:
    """The settings ``interface`` exposes, in declaration order."""
    return [s for s in (SETTINGS if table is None else table).values()
            if interface in s.interfaces]


def given(options, interface: str, table: dict | None = None) -> dict:
    """The settings of ``table`` (default: the request settings) that ``interface`` exposes
    and ``options`` (an argparse namespace of the command line) sets, parsed as text."""
    return {s.name: s.parse(getattr(options, s.name), "cli")
            for s in settings_for(interface, table) if getattr(options, s.name, None) is not None}


def check_asks(epsilon, target_rmse, max_stderr, where: str = "", interface: str = "dbapi",
               who: str = "request") -> None:
    """At most one of epsilon and the accuracy targets: a request asks by one of them."""
    given = [SETTINGS[k].spelled(interface)
             for k, v in zip(ASKS, (epsilon, target_rmse, max_stderr)) if v is not None]
    if len(given) > 1:
        raise PrivacyParameterError(
            f"{' and '.join(given)} are both given{where}; a {who} asks either by epsilon "
            "or by an accuracy target (target_rmse or max_stderr, which spends the smallest "
            "epsilon meeting it), not both; drop one")


# --------------------------------------------------------------------------- the value

@dataclass(frozen=True)
class Request:
    """Everything an analyst can ask, validated: a frozen value.

    ``sql`` is the batch (text or a sequence of statements; None while a connection only
    holds settings). Built with Python values (``Fraction``/``float``/``int`` numbers,
    ``bool`` flags); every field is checked with the declared parser, then the rules
    between fields."""

    sql: object = None
    epsilon: Fraction | None = None
    delta: Fraction | None = None
    strategy: str = "auto"
    calibration: str = "analytic"
    model: str = "dp"
    target_rmse: float | None = None
    max_stderr: float | None = None
    confirm: bool = False
    nonnegative: bool = False
    integer: bool = False
    reuse: bool = True
    name: str | None = None
    replace: bool = False

    def __post_init__(self) -> None:
        by_field = {s.keyword: s for s in SETTINGS.values() if s.request}
        for f in fields(self):
            setting = by_field.get(f.name)
            if setting is not None:
                object.__setattr__(self, f.name, setting.parse(getattr(self, f.name)))
        if not isinstance(self.replace, bool):
            raise PrivacyParameterError(f"replace must be true or false, got {self.replace!r}")
        if isinstance(self.sql, list):
            object.__setattr__(self, "sql", tuple(self.sql))
        self._check_asks()
        self._check_calibration()
        self._check_model()

    def _check_asks(self) -> None:
        check_asks(self.epsilon, self.target_rmse, self.max_stderr)
        if self.objective is None:
            if self.epsilon is None:
                raise PrivacyParameterError("give epsilon, or an accuracy target "
                                            "(target_rmse= or max_stderr=)")
            return
        from dpsql.mechanisms.catalog import is_mwem

        if self.model != "dp" or is_mwem(self.strategy):
            raise StrategyError("accuracy targets apply to the matrix mechanism (model 'dp', "
                                "not mwem): its error is known before the release")

    def _check_calibration(self) -> None:
        if self.calibration != "classic":
            return
        if self.delta == 0:
            raise PrivacyParameterError(
                "calibration='classic' is a Gaussian calibration, and delta = 0 asks for pure "
                "epsilon-DP (Laplace noise); drop the calibration or use delta > 0")
        if self.epsilon is None or self.epsilon >= 1:   # a target may need any epsilon
            raise PrivacyParameterError(
                "the classic Gaussian calibration is only valid for epsilon < 1; "
                "use calibration='analytic'")

    def _check_model(self) -> None:
        if self.model != "metric":
            return
        from dpsql.mechanisms.catalog import check_dx_spec

        if self.delta != 0:
            raise PrivacyParameterError("metric (d_X) releases are pure: ask with delta = 0")
        check_dx_spec(self.strategy)     # a d_X strategy with valid options

    @property
    def objective(self) -> tuple[str, float] | None:
        """``("rmse", target)`` or ``("max_stderr", target)`` when the request asks by
        accuracy, else None."""
        if self.target_rmse is not None:
            return "rmse", self.target_rmse
        if self.max_stderr is not None:
            return "max_stderr", self.max_stderr
        return None

    @property
    def target(self) -> tuple[str, float] | None:
        """``(setting, value)`` of an accuracy-first request, else None."""
        return next(((key, getattr(self, key)) for key in TARGETS
                     if getattr(self, key) is not None), None)
