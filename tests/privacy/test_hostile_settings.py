"""Hostile privacy settings through every interface (item 1 of the adversarial suite; the
helpers and the meaning of "refused cleanly" / "nothing charged" are in ``hostile.py``)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dpsql.interfaces import dbapi

from tests.conftest import snapshot
from tests.privacy.hostile import (INF, NAN, QUERY, shell_submit, via_python, via_script,
                                    via_shell)


# =========================================================================== item 1
# Bad privacy parameters. The Python API's answer() is covered for the whole list by
# test_release.py::test_bad_parameters_are_refused_with_nothing_charged (except -inf);
# here: explain(), -inf, the DB-API's connect / attribute / configure, a script's SET, the
# command-line flags of `dpsql run` and `dpsql shell`, and the shell's \set.
# (delta = 0 is the pure-DP path being built elsewhere: not tested as an error.)

BAD_EPSILONS = [0, -1, NAN, INF, -INF, 5e-324, "1", True]
BAD_DELTAS = [-0.1, 1, 1.5, NAN]
BAD_PRIVACY = [("epsilon", v) for v in BAD_EPSILONS] + [("delta", v) for v in BAD_DELTAS]


@pytest.mark.parametrize("key, value", BAD_PRIVACY, ids=[f"{k}={v!r}" for k, v in BAD_PRIVACY])
def test_bad_privacy_parameters_python_and_dbapi(mem, spare_db, key, value):
    """Passing: explain(), answer() (-inf only; the rest is in test_release.py), dbapi.connect,
    configure() and setting the connection's attribute all refuse with a message naming the
    parameter; the connection keeps its previous settings; nothing is charged."""
    privacy = {"epsilon": 0.5, "delta": 1e-6, key: value}
    before = snapshot(mem.session)
    out = via_python(mem.session, QUERY, explain=True, **privacy)
    assert out.refused and key in out.message, out.message
    if value == -INF:
        out = via_python(mem.session, QUERY, **privacy)
        assert out.refused and key in out.message, out.message
    with pytest.raises(dbapi.ProgrammingError, match=key):
        dbapi.connect(spare_db, **privacy)
    with pytest.raises(dbapi.ProgrammingError, match=key):
        mem.configure(**{key: value})
    with pytest.raises(dbapi.ProgrammingError, match=key):
        setattr(mem, key, value)
    assert (mem.epsilon, mem.delta, mem.calibration) == (0.1, 1e-6, "analytic")
    assert snapshot(mem.session) == before


@pytest.mark.parametrize("epsilon", [1, 1.0, 2.5, Fraction(1)])
def test_classic_calibration_needs_epsilon_below_one(mem, spare_db, epsilon):
    """Passing: calibration='classic' with epsilon >= 1 is refused by explain() and by the
    DB-API (connect, configure), naming the rule; nothing is charged. (answer() is covered by
    test_release.py.)"""
    before = snapshot(mem.session)
    out = via_python(mem.session, QUERY, explain=True, epsilon=epsilon, delta=1e-6,
                     calibration="classic")
    assert out.refused and "epsilon < 1" in out.message, out.message
    with pytest.raises(dbapi.ProgrammingError, match="epsilon < 1"):
        dbapi.connect(spare_db, epsilon=epsilon, delta=1e-6, calibration="classic")
    mem.configure(epsilon=0.5, calibration="classic")
    try:
        with pytest.raises(dbapi.ProgrammingError, match="epsilon < 1"):
            mem.epsilon = epsilon
        assert mem.epsilon == 0.5
    finally:
        mem.configure(epsilon=0.1, calibration="analytic")
    assert snapshot(mem.session) == before


SCRIPT_EPSILONS = ["0", "-1", "NaN", "'NaN'", "inf", "-inf", "'Infinity'", "5e-324", "'1'",
                   "TRUE", "1e999"]
SCRIPT_DELTAS = ["-0.1", "1", "1.5", "NaN", "'nan'"]
SCRIPT_CASES = ([(f"SET dpsql.epsilon = {v}; SET dpsql.delta = 1e-6;", "epsilon")
                 for v in SCRIPT_EPSILONS]
                + [(f"SET dpsql.epsilon = 0.1; SET dpsql.delta = {v};", "delta")
                   for v in SCRIPT_DELTAS]
                + [("SET dpsql.calibration = 'classic'; SET dpsql.epsilon = 1; "
                    "SET dpsql.delta = 1e-6;", "epsilon < 1")])


@pytest.mark.parametrize("settings, named", SCRIPT_CASES, ids=[c[0] for c in SCRIPT_CASES])
def test_bad_privacy_parameters_in_a_script(spare_db, no_charge, tmp_path, capsys, settings,
                                            named):
    """Passing: `dpsql run` exits 2 with one line naming the setting, and nothing is
    charged."""
    out = via_script(capsys, tmp_path, spare_db, f"{settings}\n{QUERY};")
    assert out.refused and named in out.message, out.message


FLAG_EPSILONS = ["0", "-1", "nan", "NaN", "inf", "-inf", "5e-324", "True", "1e999", ""]
FLAG_DELTAS = ["-0.1", "1", "1.5", "nan"]
FLAG_CASES = ([(f"--epsilon={v}", "--delta=1e-6") for v in FLAG_EPSILONS]
              + [("--epsilon=0.1", f"--delta={v}") for v in FLAG_DELTAS])


@pytest.mark.parametrize("flags", FLAG_CASES, ids=" ".join)
def test_bad_privacy_flags_on_the_command_line(spare_db, no_charge, tmp_path, capsys, flags):
    """Passing: `dpsql run` and `dpsql shell -e` refuse the flag (exit 65 or 64, an error line that
    names epsilon or delta, no traceback) and nothing is charged."""
    named = "epsilon" if flags[0] != "--epsilon=0.1" else "delta"
    out = via_script(capsys, tmp_path, spare_db, f"{QUERY};", *flags)
    assert out.refused and named in out.message, out.message
    out = via_shell(capsys, spare_db, f"{QUERY};", *flags)
    assert out.refused and named in out.message, out.message


def test_classic_calibration_flag_needs_epsilon_below_one(spare_db, no_charge, tmp_path,
                                                          capsys):
    """Passing: `--calibration classic --epsilon 1` is refused (exit 65, names the rule)."""
    out = via_script(capsys, tmp_path, spare_db, f"{QUERY};", "--calibration", "classic",
                     "--epsilon", "1", "--delta", "1e-6")
    assert out.refused and "epsilon < 1" in out.message and out.status == 65


BACKSLASH_SETS = [f"epsilon {v}" for v in FLAG_EPSILONS if v] + [f"delta {v}"
                                                                  for v in FLAG_DELTAS]


def test_bad_privacy_parameters_with_backslash_set(mem, spare_db, no_charge, capsys):
    """Passing: the shell's \\set refuses every bad value with one line naming the setting,
    the query after it is not answered, nothing is charged (shell executor on the in-memory
    database for all values; `dpsql shell -e` on a file for two)."""
    before = snapshot(mem.session)
    for setting in BACKSLASH_SETS:
        failed, out, err = shell_submit(mem.session, f"\\set {setting}\n{QUERY};")
        assert failed and err.startswith("error: ") and setting.split()[0] in err, (setting, err)
        assert len(err.strip().splitlines()) == 1 and "ci_high" not in out
    assert snapshot(mem.session) == before
    for setting in ("epsilon nan", "delta 1"):
        out = via_shell(capsys, spare_db, f"\\set {setting}\n{QUERY};")
        assert out.refused and setting.split()[0] in out.message, out.message
