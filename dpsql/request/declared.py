"""THE one declaration of the settings: every setting an analyst can ask, declared once.

:data:`SETTINGS` declares each request setting exactly once: its name, kind, default,
valid values (the ``check`` applied after parsing: a rule of :mod:`dpsql.request.rules`),
help text and the interfaces that expose it. Every interface is generated from it and
parses through it (:meth:`dpsql.request.setting.Setting.parse`):

- ``cli``: ``dpsql run`` / ``dpsql explain`` options (``--epsilon``), via
  :meth:`Setting.argparse_options`;
- ``shell``: ``dpsql shell`` options and ``\\set epsilon 0.1`` (and its listing,
  completion and help);
- ``dbapi``: :func:`dpsql.dbapi.connect` keywords, connection attributes and
  ``configure()``;
- ``script``: ``SET dpsql.epsilon = 0.1;`` in a reporting script.

:data:`CONNECTION_SETTINGS` is the second, small table: settings of a connection rather
than of a request (how long to wait for the database file, whether to create it, the
planning limits, how to reach Spark).
"""

from __future__ import annotations

from fractions import Fraction

from dpsql.errors import PrivacyParameterError
from dpsql.noise.accounting import CALIBRATIONS
from dpsql.request.rules import (MODELS, check_calibration, check_delta, check_epsilon,
                                 check_flag, check_memory, check_model, check_release_name,
                                 check_seconds, check_share, check_spark_master,
                                 check_spark_remote, check_strategy, check_target,
                                 check_time_limit)
from dpsql.request.setting import INTERFACES, Setting
from dpsql.workload import limits as planning

__all__ = ["ASKS", "CONNECTION_SETTINGS", "FLAGS", "PLANNING_LIMITS", "SETTINGS",
           "SPARK_SETTINGS", "TARGETS",
           "check_asks", "given", "settings_for"]


def _declare(*settings: Setting) -> dict:
    return {s.name: s for s in settings}


_ALL = INTERFACES
_TARGET_HELP = ("accuracy first, instead of epsilon: spend the smallest epsilon whose {} "
                "is at most this (shown first; spent only once confirmed)")

#: every request setting, in the order interfaces list them
SETTINGS: dict[str, Setting] = _declare(
    Setting("epsilon", "number", None, "epsilon each release spends (no default; or ask by "
            "accuracy with target_rmse or max_stderr)", _ALL, check_epsilon, "0.1", metavar="E",
            ask=True),
    Setting("target_rmse", "number", None, _TARGET_HELP.format("expected RMSE (the batch's)"),
            _ALL, check_target, "50", metavar="R", ask=True),
    Setting("max_stderr", "number", None,
            _TARGET_HELP.format("largest standard error of an answer"), _ALL, check_target, "10",
            metavar="S", ask=True),
    Setting("delta", "number", None, "delta each release spends (no default; 0 asks for "
            "pure epsilon-DP: Laplace noise, or mwem)", _ALL, check_delta, "1e-6", metavar="D",
            required="there is no safe default (0 asks for pure epsilon-DP)"),
    Setting("strategy", "text", "auto", "auto (the lowest expected error), a strategy name, "
            "or a spec with options such as 'eigen(principal_vectors=32)' or "
            "'mwem(rounds=20)' (mwem needs delta 0)", _ALL, check_strategy, "auto",
            metavar="S"),
    Setting("calibration", "text", "analytic", "Gaussian noise calibration: analytic "
            "(default) or classic (only for epsilon < 1)", ("cli", "dbapi", "script"),
            check_calibration, "analytic", choices=CALIBRATIONS, metavar="C"),
    Setting("model", "text", "dp", "privacy model: dp (differential privacy) or metric "
            "(d_X privacy under the table's declared metric: epsilon per unit distance, "
            "delta 0, charged to its metric budget)", _ALL, check_model, "dp", choices=MODELS,
            metavar="M"),
    Setting("nonnegative", "flag", False, "non-negative answers: non-negative least squares, "
            "or on wide batches the closest non-negative consistent marginals "
            "(post-processing, no privacy cost)", _ALL, check_flag, explain=False),
    Setting("integer", "flag", False, "round the answers to integers (post-processing, no "
            "privacy cost)", _ALL, check_flag, explain=False),
    Setting("reuse", "flag", True, "answer from past releases wherever they are at least as "
            "accurate, at no privacy cost; off: measure every request afresh", _ALL, check_flag),
    Setting("confirm", "flag", False, "spend the epsilon an accuracy target needs without "
            "asking (see it first with explain)", _ALL, check_flag, explain=False),
    Setting("confirm_share", "share", Fraction(1, 4), "ask before spending more than this "
            "share of the remaining epsilon (default 0.25; 25% works too; 1 never asks)",
            ("shell",), check_share, "0.25", metavar="SHARE", request=False),
    Setting("release", "text", None, "release name (a script's workload k is released as "
            "NAME/k; the command line's overrides SET dpsql.release)", ("cli", "script"),
            check_release_name, "report-2026", field="name", metavar="NAME", explain=False),
)

#: how a request asks: by epsilon, or by an accuracy target (the smallest epsilon meeting it)
ASKS = tuple(s.name for s in SETTINGS.values() if s.ask)
TARGETS = ASKS[1:]
FLAGS = tuple(s.name for s in SETTINGS.values() if s.kind == "flag")

#: settings of a connection, not of a request
CONNECTION_SETTINGS: dict[str, Setting] = _declare(
    Setting("lock_timeout", "number", 30.0, "seconds to wait while another process holds "
            "the database file", ("cli", "shell", "dbapi"), check_seconds, "30",
            metavar="SECONDS"),
    Setting("create", "flag", False, "create the database file if it does not exist "
            "(default: refuse a path that does not exist)",
            ("dbapi",), check_flag),
    Setting("max_memory", "number", planning.DEFAULT_MAX_MEMORY, "bytes one request's "
            "planning may use (default 4 GiB, or half the machine's memory if less): "
            "strategies predicted to need more are skipped, a batch none fits is refused",
            ("cli", "shell", "dbapi"), check_memory, "4294967296"),
    Setting("time_limit", "number", planning.DEFAULT_TIME_LIMIT, "seconds one request's "
            "planning may take (predicted from the batch's size; default 60)",
            ("cli", "shell", "dbapi"), check_time_limit, "60"),
    Setting("spark_master", "text", None, "Spark master URL (local[2], spark://host:7077) "
            "of the cluster that reads the tables whose policy names a Spark source "
            "(docs/spark.md); started on first use", ("cli", "shell", "dbapi"),
            check_spark_master, "local[2]", metavar="URL"),
    Setting("spark_remote", "text", None, "Spark Connect URL (sc://host:15002) of the "
            "cluster that reads the tables whose policy names a Spark source "
            "(docs/spark.md)", ("cli", "shell", "dbapi"), check_spark_remote,
            "sc://localhost:15002", metavar="URL"),
)

#: the connection settings that say how to reach Spark (every command that opens a session)
SPARK_SETTINGS = ("spark_master", "spark_remote")
#: the connection settings that bound a request's planning (dpsql.workload.limits)
PLANNING_LIMITS = ("max_memory", "time_limit")


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
