"""The value rules of the settings: each checks one parsed value and returns it normalised.

Each rule takes the parsed value and the setting's name as the interface spells it (so a
bad value is refused with the name the analyst typed), and raises
:class:`~dpsql.errors.PrivacyParameterError` (:class:`~dpsql.errors.StrategyError` for a
strategy). :mod:`dpsql.request.declared` names one rule per setting; the rules between
fields are :class:`dpsql.request.value.Request`'s.
"""

from __future__ import annotations

import math
from fractions import Fraction

from dpsql.errors import PrivacyParameterError, show_exact
from dpsql.noise.accounting import CALIBRATIONS, to_exact, validate_delta, validate_epsilon

__all__ = ["MAX_RELEASE_NAME", "MODELS", "check_calibration", "check_delta", "check_epsilon",
           "check_flag", "check_memory", "check_model", "check_release_name", "check_seconds",
           "check_share", "check_spark_master", "check_spark_remote", "check_strategy",
           "check_target", "check_time_limit"]

MODELS = ("dp", "metric")
MAX_RELEASE_NAME = 200


def _shown(value: Fraction) -> str:
    """An exact value for a message, even one too large for a float."""
    if abs(value) > 10**300:
        return f"{'-' if value < 0 else ''}about 10^{int(math.log10(abs(int(value))))}"
    return show_exact(value)


def check_epsilon(value, name: str) -> Fraction:
    return validate_epsilon(value, name)


def check_delta(value, name: str) -> Fraction:
    """delta = 0 asks for pure epsilon-DP (Laplace noise, or mwem); delta > 0 Gaussian."""
    return validate_delta(value, name)


def check_target(value, name: str) -> float:
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


def check_model(value, name: str) -> str:
    """``dp`` (differential privacy) or ``metric`` (d_X privacy under the table's declared
    metric; epsilon per unit distance, charged to its metric budget; delta must be 0)."""
    model = value.strip().lower() if isinstance(value, str) else None
    if model not in MODELS:
        raise PrivacyParameterError(
            f"{name} must be 'dp' (differential privacy) or 'metric' (d_X privacy under the "
            f"table's declared metric), got {value!r}")
    return model


def check_calibration(value, name: str) -> str:
    calibration = value.strip().lower() if isinstance(value, str) else None
    if calibration not in CALIBRATIONS:
        raise PrivacyParameterError(f"{name} must be one of {CALIBRATIONS}, got {value!r}")
    return calibration


def check_release_name(value, name: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_RELEASE_NAME \
            or any(c in value for c in "\n\r\t") or value != value.strip():
        raise PrivacyParameterError(
            f"a release name must be a non-empty string of at most {MAX_RELEASE_NAME} "
            "characters, without tabs, line breaks or surrounding spaces")
    return value


def _url(value, name: str, example: str) -> str:
    if not isinstance(value, str) or not value.strip() or not value.isascii() \
            or any(c.isspace() for c in value):
        raise PrivacyParameterError(f"{name} must be a URL without spaces, such as {example}, "
                                    f"got {value!r}")
    return value


def check_spark_master(value, name: str) -> str:
    """A Spark master URL: local[N], local-cluster[…], spark://host:port, yarn, k8s://…"""
    return _url(value, name, "local[2] or spark://host:7077")


def check_spark_remote(value, name: str) -> str:
    """A Spark Connect URL: sc://host:port."""
    url = _url(value, name, "sc://localhost:15002")
    if not url.startswith("sc://"):
        raise PrivacyParameterError(f"{name} must be a Spark Connect URL starting with "
                                    f"sc://, such as sc://localhost:15002, got {value!r}")
    return url


def check_share(value, name: str) -> Fraction:
    share = to_exact(value, name)
    if not 0 <= share <= 1:
        raise PrivacyParameterError(
            f"{name} must be between 0 and 1 (or 0% and 100%), got {_shown(share)}; "
            "0 asks before every release, 1 never asks")
    return share


def check_flag(value: bool, name: str) -> bool:
    """A flag: the parser has checked it all (a bool, or its text spelling)."""
    return value


def check_seconds(value, name: str) -> float:
    seconds = to_exact(value, name)
    if not 0 <= seconds <= 86400:
        raise PrivacyParameterError(f"{name} must be a number of seconds from 0 to 86400, "
                                    f"got {_shown(seconds)}")
    return float(seconds)


def check_memory(value, name: str) -> int:
    """A memory limit in bytes: a whole number from 1 MiB to 1 PiB."""
    size = to_exact(value, name)
    if size.denominator != 1 or not 2 ** 20 <= size <= 2 ** 50:
        raise PrivacyParameterError(
            f"{name} must be a whole number of bytes from 1048576 (1 MiB) to 2^50 (1 PiB), "
            f"got {_shown(size)}")
    return int(size)


def check_time_limit(value, name: str) -> float:
    """A planning time limit in seconds: more than 0, at most a day."""
    seconds = to_exact(value, name)
    if not 0 < seconds <= 86400:
        raise PrivacyParameterError(f"{name} must be a number of seconds above 0 and at most "
                                    f"86400, got {_shown(seconds)}")
    return float(seconds)
