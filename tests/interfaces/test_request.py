"""One Request value (dpsql.request): every setting declared once, parsed the same way by
the command line, the shell, the DB-API and scripts, and nowhere else."""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path

import pytest

from dpsql import Session
from dpsql.errors import DpsqlError, PrivacyParameterError, StrategyError
from dpsql.interfaces import cli, dbapi, scripts
from dpsql.interfaces.shell import app as shell_app
from dpsql.interfaces.shell.executor import Executor, NoTerminal
from dpsql.interfaces.shell.settings import ShellState
from dpsql.noise.accounting import _ASCII_NUMBER as _NUMBER  # the one grammar of typed numbers
from dpsql.request.declared import CONNECTION_SETTINGS, SETTINGS, TARGETS, settings_for
from dpsql.request.setting import INTERFACES
from dpsql.request.value import Request
from dpsql.sql import script as sql_script

from ..conftest import make_adult_db

ROOT = Path(__file__).resolve().parents[2]
QUERY = "SELECT sex, COUNT(*) FROM adult GROUP BY sex"

#: bad values per setting, as typed (the DB-API gets the number when the text is one)
BAD = {
    "epsilon": ["-1", "0", "1000", "1e-12", "1e9999", "-1e999", "fifty", "١", "１", "0x10", "1_0", "nan", "inf",
                "½", "0.1.2"],
    "target_rmse": ["0", "-3", "fifty", "٥٠", "1e99999", "-1e400"],
    "max_stderr": ["-2", "ten", "1e400"],
    "delta": ["1.5", "1", "-0.1", "lots", "۰.۱"],
    "strategy": ["fancy", "eigen(bogus=1)", "eigen(principal_vectors=0)", "mwem(colour=1)",
                 "eigen(principal_vectors=8"],
    "calibration": ["fast", "textbook"],
    "model": ["fancy", "dx"],
    "nonnegative": ["maybe", "2"],
    "integer": ["maybe"],
    "reuse": ["sometimes"],
    "confirm": ["sure", "١"],
    "confirm_share": ["2", "-1%", "lots", "١%"],
    "release": ["", " padded", "a\tb", "x" * 201],
}


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("request") / "adult.duckdb")
    make_adult_db(path, epsilon=1.0, delta=1e-5).close()
    return path


@pytest.fixture(scope="module")
def conn(db):
    with dbapi.connect(db, epsilon=0.1, delta=1e-6) as c:
        yield c


# --------------------------------------------------------------------------- each interface

def _normal(message: str, setting) -> str:
    """The message with the setting's name spelled plainly (``--epsilon`` -> ``epsilon``)."""
    for interface in INTERFACES:
        message = message.replace(setting.spelled(interface), setting.name)
    return message


def via_cli(setting, text, tmp_path, capsys) -> str:
    script = tmp_path / "report.sql"
    script.write_text(QUERY + ";\n")
    base = {"epsilon": "0.1", "delta": "1e-6"}
    base.pop(setting.name, None)
    if setting.name in TARGETS:
        base.pop("epsilon")
    argv = ["explain", str(tmp_path / "missing-is-not-reached.duckdb"), str(script)]
    (tmp_path / "missing-is-not-reached.duckdb").write_bytes(b"")
    for name, value in [*base.items(), (setting.name, text)]:
        argv += [f"{SETTINGS[name].flag}={value}"]
    assert cli.main(argv) == 65   # bad settings: EX_DATAERR in the error table
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    return err[len("error: "):].strip()


def via_shell_options(setting, text, capsys) -> str:
    assert shell_app.main(["no-such.duckdb", f"{setting.flag}={text}", "-e", QUERY]) == 65   # bad settings: EX_DATAERR
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    return err[len("error: "):].strip()


def via_shell_set(setting, text) -> str:
    state = ShellState(None, interactive=False)
    with pytest.raises(DpsqlError) as info:
        state.set(setting.name, text)
    return str(info.value)


def via_dbapi(setting, text, conn) -> str:
    value: object = text
    if setting.kind in ("number", "share") and _NUMBER.fullmatch(text):
        value = Fraction(text)        # a Python number: the DB-API's own form
    changes = {setting.name: value}
    if setting.name in TARGETS:
        changes["epsilon"] = None
    with pytest.raises(dbapi.ProgrammingError) as info:
        conn.configure(**changes)
    return str(info.value)


def via_script(setting, text) -> str:
    if setting.kind == "number" and _NUMBER.fullmatch(text):
        literal = text                            # SQL's number literal
    else:
        literal = "'" + text.replace("'", "''") + "'"
    with pytest.raises(DpsqlError) as info:
        scripts.parse_script(f"SET dpsql.{setting.name} = {literal};\n{QUERY}",
                             epsilon=0.1, delta=1e-6)
    message = str(info.value)
    if getattr(info.value, "line", None) is not None:
        message = message[:message.rindex(" (line ")]
    return message


CASES = [(name, text) for name, texts in BAD.items() for text in texts]


def test_every_exposed_setting_has_bad_values_here():
    assert set(BAD) == {s.name for s in SETTINGS.values() if s.interfaces}


@pytest.mark.parametrize("name, text", CASES)
def test_a_bad_value_gives_one_message_in_every_interface(name, text, conn, tmp_path,
                                                          capsys):
    setting = SETTINGS[name]
    messages = {}
    if "cli" in setting.interfaces and setting.kind != "flag":   # flags are switches there
        messages["cli"] = via_cli(setting, text, tmp_path, capsys)
    if "shell" in setting.interfaces:
        messages["shell \\set"] = via_shell_set(setting, text)
        if setting.kind != "flag":
            messages["shell options"] = via_shell_options(setting, text, capsys)
    if "dbapi" in setting.interfaces:
        messages["dbapi"] = via_dbapi(setting, text, conn)
    if "script" in setting.interfaces:
        messages["script"] = via_script(setting, text)
    assert len(messages) >= 2 or setting.interfaces == ("shell",)
    normal = {where: _normal(m, setting) for where, m in messages.items()}
    assert len(set(normal.values())) == 1, normal
    # each names the setting as its interface spells it
    if "cli" in messages:
        assert setting.spelled("cli") in messages["cli"] or setting.name == "release" \
            or setting.kind == "text"
    assert "Traceback" not in "".join(messages.values())


def test_numbers_are_ascii_decimals_everywhere(conn, tmp_path, capsys):
    for text in ("١", "٠.١", "１", "½", "1_0", "0x1", "nan", "-inf", "1e5000000"):
        form = ("must be a number such as 0.1, got" if text.isascii() else
                "must be written with ASCII digits 0-9, e.g. 0.1; got")
        assert via_cli(SETTINGS["epsilon"], text, tmp_path, capsys).startswith(
            f"--epsilon {form} {text!r}")
        assert via_shell_set(SETTINGS["epsilon"], text) == f"epsilon {form} {text!r}"
    for text in ("0.1", "1e-1", ".1", "+0.1", "1/10", " 0.1 "):
        assert SETTINGS["epsilon"].parse(text, "shell") == Fraction(1, 10)
    with pytest.raises(PrivacyParameterError, match="got str"):
        SETTINGS["epsilon"].parse("0.1")        # Python interfaces take numbers, not text
    assert conn.epsilon == 0.1


# --------------------------------------------------------------------------- good values

def _recording(monkeypatch):
    """Session.explain / answer record their keyword arguments, then stop (nothing runs)."""
    calls = []

    class Stop(DpsqlError):
        pass

    def record(self, sql, **kwargs):
        calls.append(kwargs)
        raise Stop("recorded")

    monkeypatch.setattr(Session, "explain", record)
    monkeypatch.setattr(Session, "answer", record)
    return calls


def _request(kwargs: dict) -> Request:
    keys = ("epsilon", "delta", "strategy", "calibration", "model", "target_rmse",
            "max_stderr", "reuse")
    return Request(**{k: v for k, v in kwargs.items() if k in keys})


GOOD = [{"epsilon": "0.25", "delta": "1e-6", "strategy": " identity ", "model": "dp",
         "reuse": False},
        {"target_rmse": "50", "delta": "0", "strategy": "Auto", "model": "DP",
         "reuse": True}]


@pytest.mark.parametrize("good", GOOD)
def test_a_good_value_reaches_session_the_same_from_every_interface(good, db, tmp_path,
                                                                    monkeypatch):
    calls = _recording(monkeypatch)
    seen = {}
    # command line: dpsql explain DB SCRIPT --epsilon 0.25 ...
    script = tmp_path / "report.sql"
    script.write_text(QUERY + ";\n")
    argv = ["explain", db, str(script)]
    for k, v in good.items():
        if SETTINGS[k].kind == "flag":
            argv += [SETTINGS[k].flag] if v != SETTINGS[k].default else []
        else:
            argv += [f"{SETTINGS[k].flag}={v}"]
    cli.main(argv)
    seen["cli"] = calls.pop()
    # shell: \set NAME VALUE, then a query
    shown = {True: "on", False: "off"}
    out, err = io.StringIO(), io.StringIO()

    def no_terminal(reason):
        raise NoTerminal(reason)

    with Session(db) as session:
        state = ShellState(session, interactive=False)
        ex = Executor(state, out, err, no_terminal)
        for k, v in good.items():
            ex.submit(f"\\set {k} {shown.get(v, v)}")
        ex.submit(QUERY + ";")
    assert "error: recorded" in err.getvalue(), err.getvalue()
    seen["shell"] = calls.pop(0)
    calls.clear()
    # DB-API: Python values
    values = {k: (Fraction(v) if SETTINGS[k].kind == "number" else v)
              for k, v in good.items()}
    with dbapi.connect(db, **values) as c:
        with pytest.raises(dbapi.DatabaseError, match="recorded"):
            c.cursor().explain(QUERY)
    seen["dbapi"] = calls.pop()
    # script: SET dpsql.NAME = VALUE
    sets = "".join(f"SET dpsql.{k} = "
                   + (str(v).lower() if isinstance(v, bool) else
                      v if SETTINGS[k].kind == "number" else f"'{v}'") + ";\n"
                   for k, v in good.items())
    with Session(db) as session:
        with pytest.raises(DpsqlError, match="recorded"):
            scripts.check_script(session, scripts.parse_script(sets + QUERY))
    seen["script"] = calls.pop()
    requests = {where: _request(kwargs) for where, kwargs in seen.items()}
    assert len(set(requests.values())) == 1, requests
    r = requests["cli"]
    assert r.strategy == good["strategy"].strip().lower() and r.model == "dp"
    assert r.reuse is good["reuse"] and r.delta == Fraction(good["delta"])
    if "epsilon" in good:
        assert r.epsilon == Fraction(1, 4) and r.target is None
    else:
        assert r.epsilon is None and r.target == ("target_rmse", 50.0)


# --------------------------------------------------------------------------- the value

def test_request_is_frozen_and_validated():
    r = Request(QUERY, epsilon=0.1, delta=1e-6, strategy=" Eigen ", model="DP")
    assert (r.epsilon, r.delta, r.strategy, r.model) == (Fraction(1, 10),
                                                         Fraction(1, 10**6), "Eigen", "dp")
    with pytest.raises(Exception):
        r.epsilon = 1                                          # frozen
    for kwargs, error, match in [
            (dict(epsilon=0.1, target_rmse=50), PrivacyParameterError,
             "epsilon and target_rmse are both given"),
            (dict(), PrivacyParameterError, "give epsilon, or an accuracy target"),
            (dict(target_rmse=50, strategy="mwem"), StrategyError, "accuracy targets"),
            (dict(epsilon=2, calibration="classic"), PrivacyParameterError, "epsilon < 1"),
            (dict(epsilon=0.5, delta=0, calibration="classic"), PrivacyParameterError,
             "Gaussian calibration"),
            (dict(epsilon=1, model="metric"), PrivacyParameterError, "delta = 0"),
            (dict(epsilon=1, confirm="yes"), PrivacyParameterError,
             "confirm must be true or false"),
            (dict(epsilon=1, name=" x"), PrivacyParameterError, "release name")]:
        kwargs.setdefault("delta", 1e-6)
        with pytest.raises(error, match=match):
            Request(QUERY, **kwargs)
    with pytest.raises(PrivacyParameterError, match="delta must be given"):
        Request(QUERY, epsilon=1)


def test_session_validates_through_request_before_touching_data(db):
    with Session(db) as s:
        before = s.ledger()
        with pytest.raises(PrivacyParameterError, match="epsilon must be > 0"):
            s.answer(QUERY, epsilon=-1, delta=1e-6)
        with pytest.raises(PrivacyParameterError, match="nonnegative must be true or false"):
            s.answer(QUERY, epsilon=0.1, delta=1e-6, nonnegative="yes")
        assert s.ledger() == before


def test_the_declaration_is_consistent():
    for s in (*SETTINGS.values(), *CONNECTION_SETTINGS.values()):
        assert s.help and set(s.interfaces) <= set(INTERFACES)
        assert s.kind in ("number", "share", "flag", "text")
        if s.default is not None:
            assert s.parse(s.default) == s.default    # the default is a valid value
    assert sql_script.TARGETS == TARGETS
    assert [s.name for s in settings_for("shell")][:4] == ["epsilon", "target_rmse",
                                                          "max_stderr", "delta"]
    with pytest.raises(PrivacyParameterError, match="lock_timeout must be a number"):
        CONNECTION_SETTINGS["lock_timeout"].parse(-1)


def test_connection_settings_reach_the_driver(db, tmp_path):
    with pytest.raises(dbapi.ProgrammingError, match="lock_timeout"):
        dbapi.connect(db, epsilon=0.1, delta=1e-6, lock_timeout=-1)
    with pytest.raises(dbapi.DatabaseError, match="does not exist"):
        dbapi.connect(str(tmp_path / "none.duckdb"), epsilon=0.1, delta=1e-6, create=False)
    with dbapi.connect(db, epsilon=0.1, delta=1e-6, lock_timeout=5) as c:
        assert c.session.db.lock_timeout == 5.0


# --------------------------------------------------------------------------- declared once

INTERFACE_FILES = sorted((ROOT / "dpsql" / "interfaces").rglob("*.py")) + [
    ROOT / "dpsql" / "sql" / "script.py"]


def _per_setting_literals(s) -> list[str]:
    flag = s.flag
    return [f'"{flag}"', f"'{flag}'", f'add_argument("{flag}', f"add_argument('{flag}",
            f'"dpsql.{s.name}"', f"'dpsql.{s.name}'", f'_setting("{s.name}"',
            f'"{s.name}": parse_', f'"{s.name}": "\\\\set {s.name}', f"def parse_{s.name}("]


DECLARED = ROOT / "dpsql" / "request" / "declared.py"


def test_settings_are_declared_only_in_request_declared_py():
    found = []
    for path in INTERFACE_FILES:
        text = path.read_text(encoding="utf-8")
        for s in (*SETTINGS.values(), *CONNECTION_SETTINGS.values()):
            found += [f"{path.relative_to(ROOT)}: {lit}" for lit in _per_setting_literals(s)
                      if lit in text]
    assert found == [], ("per-setting declarations outside dpsql/request/declared.py:\n"
                         + "\n".join(found))
    # the grep does see such literals where they are (so it would see them come back)
    declared = DECLARED.read_text(encoding="utf-8")
    assert 'Setting("epsilon", "number"' in declared
    assert any(lit in 'p.add_argument("--epsilon", type=float)'
               for lit in _per_setting_literals(SETTINGS["epsilon"]))


def test_each_setting_has_one_row_in_declared_py():
    rows = {path: path.read_text(encoding="utf-8") for path in (ROOT / "dpsql").rglob("*.py")}
    for s in (*SETTINGS.values(), *CONNECTION_SETTINGS.values()):
        row = f'Setting("{s.name}", "{s.kind}"'
        where = {path.relative_to(ROOT): text.count(row) for path, text in rows.items()
                 if row in text}
        assert where == {DECLARED.relative_to(ROOT): 1}, (s.name, where)
