"""A real ``dpsql serve`` for the server tests: a protected Adult copy, a users file and the
server as a child process on 127.0.0.1 (port 0: the OS picks a free one, the server prints
it). Used by tests/interfaces/test_server*.py and benchmarks/server_load.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw", "carol": "carol-pw", "owner": "owner-pw"}
#: each analyst's allowance of adult's budget (epsilon 1.0, delta 1e-5)
ALLOWANCES = {"alice": ("0.5", "1e-6"), "bob": ("0.3", "1e-6"), "carol": ("0.02", "1e-7")}


def make_database(directory: Path, *, epsilon=1.0, delta=1e-5, allowances=ALLOWANCES,
                  metric=None):
    """(database path, users path) of a fresh protected Adult copy and its analysts
    (``allowances``: user -> (ε, δ) or (ε, δ, metric ε); ``metric``: the table's record
    metric, with its own budget, when given)."""
    sys.path.insert(0, str(ROOT))
    from dpsql.interfaces.server import accounts
    from tests.conftest import ADULT_POLICY, make_adult_db

    db_path = str(directory / "adult.duckdb")
    db = make_adult_db(db_path, epsilon=epsilon, delta=delta, protect=metric is None)
    if metric is not None:
        db.protect("adult", dict(ADULT_POLICY, epsilon=epsilon, delta=delta, metric=metric))
    db.close()
    users = str(directory / "users.toml")
    for user, amounts in allowances.items():
        accounts.add_user(users, user, PASSWORDS.get(user, user + "-pw"),
                          allowances={"adult": amounts})
    accounts.add_user(users, "owner", PASSWORDS["owner"], role="admin")
    return db_path, users


class ServerProcess:
    """``python -m dpsql serve DB --port 0`` until :meth:`stop`."""

    def __init__(self, db_path: str, users: str, *extra: str):
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dpsql", "serve", db_path, "--users", users, "--port", "0",
             *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        line = self.proc.stdout.readline()
        match = re.search(r"on 127\.0\.0\.1:(\d+)", line)
        if not match:
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r} {self.proc.stderr.read()!r}")
        self.port = int(match.group(1))
        self.db_path, self.users = db_path, users

    def dsn(self, user: str, password: str | None = None, **options) -> str:
        words = " ".join(f"-c dpsql.{k}={v}" for k, v in options.items())
        pw = PASSWORDS.get(user, "") if password is None else password
        opt = f" options='{words}'" if words else ""
        return (f"host=127.0.0.1 port={self.port} user={user} password={pw} dbname=adult"
                f"{opt}")

    def url(self, user: str) -> str:
        return f"postgresql+psycopg://{user}:{PASSWORDS[user]}@127.0.0.1:{self.port}/adult"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> str:
        """Stop it (SIGTERM, as systemd does); its standard error."""
        self.proc.terminate()
        return self.proc.communicate()[1]


def refused(conn, sql):
    """The error a statement over the wire is refused with (psycopg raises it)."""
    import psycopg
    import pytest

    with pytest.raises(psycopg.Error) as info:
        conn.execute(sql)
    return info.value
