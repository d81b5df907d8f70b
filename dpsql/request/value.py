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

__all__ = ["Request"]


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
