"""``dpsql --help`` answers at once: the help, the version and argument errors import no
numpy, scipy, DuckDB, sqlglot, prompt_toolkit or pandas (issue 22).

Each case runs the real console command (the ``dpsql`` script pip installed beside this
interpreter, or the same two lines of its entry point where there is none) in a fresh
interpreter, which records at exit the heavy top-level packages it had loaded. Counting
modules, not seconds, keeps the test deterministic on a busy machine;
``benchmarks/startup.py`` measures the seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

HEAVY = ("numpy", "scipy", "duckdb", "sqlglot", "prompt_toolkit", "pandas")
SUBCOMMANDS = ("demo", "protect", "run", "explain", "budget", "ledger", "shell", "serve",
               "user")

#: runs the console script as ``python SCRIPT ARGS`` would and, at exit (after its
#: ``sys.exit``), writes the heavy packages it loaded to the file named first
PROBE = """
import atexit, json, runpy, sys
record, script, *args = sys.argv[1:]
HEAVY = set(%r)
def write():
    with open(record, "w") as f:
        json.dump(sorted({m.split(".")[0] for m in sys.modules} & HEAVY), f)
atexit.register(write)
sys.argv = [script, *args]
runpy.run_path(script, run_name="__main__")
""" % (HEAVY,)

#: what pip writes for the ``dpsql`` entry point, where no console script is installed
SCRIPT = """import sys
from {module} import {name}
if __name__ == "__main__":
    sys.exit({name}())
"""


@pytest.fixture(scope="module")
def console_script(tmp_path_factory):
    """The installed ``dpsql`` console script (or its equivalent from the entry point)."""
    (point,) = entry_points(group="console_scripts", name="dpsql")
    assert point.value == "dpsql.interfaces.cli:main"
    installed = os.path.join(os.path.dirname(sys.executable), "dpsql")
    if os.path.isfile(installed):
        return installed
    path = tmp_path_factory.mktemp("console") / "dpsql"
    module, name = point.value.split(":")
    path.write_text(SCRIPT.format(module=module, name=name))
    return str(path)


def run_all(console_script, tmp_path, cases):
    """Run every ``(argv, status)`` side by side; ``[(argv, status, stdout, stderr, heavy)]``."""
    procs = []
    for i, (argv, _status) in enumerate(cases):
        record = tmp_path / f"heavy{i}.json"
        procs.append((subprocess.Popen(
            [sys.executable, "-c", PROBE, str(record), console_script, *argv], cwd=tmp_path,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True), record))
    done = []
    for (argv, status), (p, record) in zip(cases, procs):
        out, err = p.communicate(timeout=300)
        assert record.exists(), (argv, p.returncode, err)
        done.append((argv, p.returncode, status, out, err, json.loads(record.read_text())))
    return done


HELP = [(["--help"], 0), (["-h"], 0), (["--version"], 0), (["-V"], 0), (["--vers"], 0)] + [
    ([sub, "--help"], 0) for sub in SUBCOMMANDS]
USAGE_ERRORS = [([], 64), (["nosuch"], 64), (["run"], 64), (["explain", "db.duckdb"], 64),
                (["run", "db.duckdb", "s.sql", "--epsilon"], 64), (["budget"], 64),
                (["serve", "db.duckdb", "--port", "x"], 64), (["user", "drop", "u", "n"], 64),
                (["shell"], 64), (["shell", "db.duckdb", "--bogus"], 64)]


def test_help_version_and_usage_errors_load_no_heavy_library(console_script, tmp_path):
    for argv, code, status, out, err, heavy in run_all(console_script, tmp_path,
                                                        HELP + USAGE_ERRORS):
        assert "Traceback" not in out + err, (argv, err)
        assert code == status, (argv, code, err)
        assert heavy == [], (argv, heavy)
        if status == 0:
            assert err == "" and (out.startswith("usage: dpsql") or
                                  out.startswith("dpsql ")), (argv, out)
        else:
            assert out == "" and err.startswith("error: ") and \
                len(err.splitlines()) == 1, (argv, err)


def test_the_probe_sees_what_a_subcommand_imports(console_script, tmp_path):
    """The control: ``run`` imports the release path once its arguments are parsed (here
    to refuse a database that does not exist), so the probe does see heavy imports."""
    ((argv, code, status, out, err, heavy),) = run_all(
        console_script, tmp_path, [(["run", "missing.duckdb", "s.sql"], 66)])
    assert code == status and err.startswith("error: database"), (code, err)
    assert {"numpy", "duckdb", "sqlglot"} <= set(heavy), heavy
