"""The one :class:`Request` value: everything an analyst can ask, frozen and validated.

:class:`Request` holds the batch, epsilon and delta or an accuracy target, strategy,
calibration, model, the consistency and reuse flags, confirm, the release name. Its
``__post_init__`` checks every field with the declared parser
(:data:`dpsql.request.declared.SETTINGS`) and the rules between fields (epsilon or a
target, not both; the classic calibration only for epsilon < 1; a metric request is pure,
...).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from fractions import Fraction

from dpsql.errors import PrivacyParameterError, StrategyError
from dpsql.request.declared import SETTINGS, TARGETS, check_asks

__all__ = ["Request", "yield_to_options"]


def yield_to_options(settings: dict, sql) -> dict:
    """An interface's own settings (a DB-API connection's, the shell's ``\\set``) are
    defaults: the ones the SQL's ``WITH DIFFERENTIAL_PRIVACY OPTIONS`` give are dropped, so
    the statement's take effect (a caller's explicit keywords and a script's ``SET`` are not
    defaults: a different value there is refused by :class:`Request`)."""
    from dpsql.sql import bigquery

    given = {SETTINGS[name].keyword for _, name, *_ in bigquery.options(sql)
             if name in SETTINGS}
    return {k: v for k, v in settings.items() if k not in given}


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
        given = self._options()
        for f in fields(self):
            setting = by_field.get(f.name)
            if setting is not None:
                value = getattr(self, f.name)
                if value is None and f.name in given:      # from the SQL's OPTIONS
                    value = given[f.name][0]
                object.__setattr__(self, f.name, setting.parse(value))
        self._check_options(given)
        if not isinstance(self.replace, bool):
            raise PrivacyParameterError(f"replace must be true or false, got {self.replace!r}")
        if isinstance(self.sql, list):
            object.__setattr__(self, "sql", tuple(self.sql))
        self._check_asks()
        self._check_calibration()
        self._check_model()

    def _options(self) -> dict:
        """Settings given in the SQL by BigQuery's ``SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS
        (epsilon = 1, delta = 1e-6, …)``: field -> (value, statement, text), each parsed by
        its declared setting as a script's ``SET dpsql.<name>`` is (:mod:`dpsql.sql.bigquery`).
        Two statements of the batch giving one setting different values are refused: a batch
        is one release with one value of each setting."""
        from dpsql.sql import bigquery

        if self.sql is None:
            return {}
        by_name = {s.name: s for s in SETTINGS.values() if s.request and "script" in
                   s.interfaces}
        given: dict = {}
        for statement, name, raw, line, col in bigquery.options(self.sql):
            if name in bigquery.POLICY_OPTIONS:
                continue                  # checked against the policy while planning
            setting = by_name.get(name)
            if setting is None:
                known = ", ".join([*by_name, *bigquery.POLICY_OPTIONS])
                raise PrivacyParameterError(
                    f"WITH DIFFERENTIAL_PRIVACY: unknown option {name!r} (line {line}, column "
                    f"{col}); the options are {known}")
            value = setting.parse(raw, "shell")      # as typed; spelled by its plain name
            key = setting.keyword
            if key in given and given[key][0] != value:
                raise PrivacyParameterError(
                    f"conflicting settings in one batch: statement {given[key][1] + 1} gives "
                    f"{name} = {given[key][2]}, statement {statement + 1} {name} = {raw}; a "
                    "batch is one release with one value of each setting: give it once")
            given.setdefault(key, (value, statement, raw))
        return given

    def _check_options(self, given: dict) -> None:
        """A setting the SQL's OPTIONS give must agree with the one the caller set (a
        connection's, the command line's, a script's SET); an unset one takes the
        option's value."""
        by_field = {s.keyword: s for s in SETTINGS.values() if s.request}
        for key, (value, statement, raw) in given.items():
            current = getattr(self, key)
            if current == value:
                continue
            if current != by_field[key].default:
                raise PrivacyParameterError(
                    f"conflicting settings: statement {statement + 1} gives {by_field[key].name} "
                    f"= {raw} in WITH DIFFERENTIAL_PRIVACY, but the request already sets it to "
                    f"{current}; give it in one place")
            object.__setattr__(self, key, value)

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
