"""The :class:`Setting` type: one setting's declaration, its spellings and its one parser.

A setting is exposed by some of the :data:`INTERFACES`, each spelling its name its own way
(``--epsilon``, ``epsilon``, ``dpsql.epsilon``). :meth:`Setting.parse` is the one parser of
a setting. Text interfaces (cli, shell, script) hand it the text as typed; value interfaces
(dbapi, and :class:`~dpsql.request.value.Request` itself, which
:meth:`dpsql.Session.explain` and :meth:`~dpsql.Session.answer` build) hand it Python
values. A bad value gives the same message everywhere; only the setting's name is spelled
as the interface spells it. Numbers as text are ASCII decimals (``0.1``, ``1e-6``, ``-3``)
or ASCII fractions (``1/3``), held exactly. The settings themselves are declared in
:mod:`dpsql.request.declared`.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

from dpsql.errors import DpsqlError, PrivacyParameterError
from dpsql.noise.accounting import number_from_text

__all__ = ["INTERFACES", "OFF", "ON", "Setting", "TEXT_INTERFACES"]

#: where a setting can be exposed; the text interfaces hand the parser text as typed
INTERFACES = ("cli", "shell", "dbapi", "script")
TEXT_INTERFACES = ("cli", "shell", "script")
#: a flag as text: on / off (true/false, yes/no, 1/0 work too)
ON, OFF = ("on", "true", "yes", "1"), ("off", "false", "no", "0")


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
