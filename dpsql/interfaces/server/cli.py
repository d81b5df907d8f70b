"""The command-line entries of the server: ``dpsql serve`` and ``dpsql user``.

    dpsql serve DB [--host 127.0.0.1] [--port 5433] [--users USERS.toml]
                   [--certificate CERT --key KEY [--require-tls]] [--max-connections N]
                   [--lock-timeout SECONDS] [--max-memory BYTES] [--time-limit SECONDS]
                   [--spark-master URL | --spark-remote sc://HOST:PORT]
    dpsql user add USERS.toml NAME [--role analyst|admin] [--allow TABLE=EPS,DELTA ...]
                   [--allow-metric TABLE=EPS ...]
    dpsql user passwd USERS.toml NAME
    dpsql user remove USERS.toml NAME

The connection settings (``--lock-timeout`` ...) are generated from their one declaration
(:data:`dpsql.request.declared.CONNECTION_SETTINGS`) and apply to every analyst's
connection. Passwords are read from the terminal (twice), or from the first line of standard input
when it is not a terminal; they are stored only as SCRAM-SHA-256 verifiers.
"""

from __future__ import annotations

import os
import sys

from dpsql.errors import UsageError
from dpsql.interfaces.server.defaults import DEFAULT_HOST, DEFAULT_MAX_CONNECTIONS, DEFAULT_PORT
from dpsql.request.declared import CONNECTION_SETTINGS, SPARK_SETTINGS, given, settings_for

COMMANDS = ("serve", "user")


def add_subcommands(sub) -> None:
    """Add ``serve`` and ``user`` to ``dpsql``'s argparse sub-parsers."""
    s = sub.add_parser("serve", help="PostgreSQL-wire server with per-analyst accounts "
                                     "(docs/server.md)")
    s.add_argument("db")
    s.add_argument("--host", default=DEFAULT_HOST)
    s.add_argument("--port", type=int, default=DEFAULT_PORT)
    s.add_argument("--users", help="users file (default: DB.users.toml)")
    s.add_argument("--certificate", help="TLS certificate chain (PEM)")
    s.add_argument("--key", help="TLS private key (PEM)")
    s.add_argument("--require-tls", action="store_true", help="refuse connections without TLS")
    s.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS)
    for setting in settings_for("cli", CONNECTION_SETTINGS):
        s.add_argument(setting.flag, **setting.argparse_options())
    u = sub.add_parser("user", help="add, remove or change analysts of a server's users file")
    u.add_argument("action", choices=("add", "passwd", "remove"))
    u.add_argument("users")
    u.add_argument("name")
    u.add_argument("--role", default="analyst", choices=("analyst", "admin"))
    u.add_argument("--allow", action="append", default=[], metavar="TABLE=EPS,DELTA",
                   help="the analyst's allowance of TABLE's budget (repeat per table)")
    u.add_argument("--allow-metric", action="append", default=[], metavar="TABLE=EPS",
                   help="the analyst's allowance of TABLE's metric (d_X) budget: epsilon "
                        "per unit distance (repeat per table)")


def run(args) -> int:
    from dpsql.interfaces.server import accounts, app

    if args.command == "serve":
        from dpsql.session import spark_link

        settings = given(args, "cli", CONNECTION_SETTINGS)   # one Spark for all analysts
        spark = {k: settings.pop(k) for k in SPARK_SETTINGS if k in settings}
        app.serve(args.db, args.users or args.db + ".users.toml", host=args.host,
                  port=args.port, certificate=args.certificate, key=args.key,
                  require_tls=args.require_tls, max_connections=args.max_connections,
                  spark=spark_link(spark.get("spark_master"), spark.get("spark_remote")),
                  **settings)
        return 0
    if args.action == "remove":
        accounts.remove_user(args.users, args.name)
    elif args.action == "passwd":
        accounts.set_password(args.users, args.name, _password())
    else:
        accounts.add_user(args.users, args.name, _password(), role=args.role,
                          allowances=_allowances(args.allow, args.allow_metric))
    print(f"{args.action}: {args.name} in {args.users}")
    return 0


def _allowances(allow: list, metric: list) -> dict:
    """table -> (ε, δ, metric ε) from ``--allow TABLE=EPS,DELTA`` and ``--allow-metric
    TABLE=EPS`` (a table given only one of them has 0 of the other)."""
    out: dict = {}
    for text in allow:
        table, _, amounts = text.partition("=")
        eps, _, delta = amounts.partition(",")
        if not table or not eps.strip():
            raise UsageError(f"--allow {text!r}: write TABLE=EPSILON,DELTA, e.g. "
                             "adult=0.5,1e-6")
        out[table.lower()] = [eps.strip(), (delta or "0").strip(), None]
    for text in metric:
        table, _, eps = text.partition("=")
        if not table or not eps.strip() or "," in eps:
            raise UsageError(f"--allow-metric {text!r}: write TABLE=EPSILON (per unit "
                             "distance), e.g. adult=0.5")
        out.setdefault(table.lower(), ["0", "0", None])[2] = eps.strip()
    return {t: tuple(a) for t, a in out.items()}


def _password() -> str:
    import getpass      # termios and friends: only when a password is read

    if not os.isatty(sys.stdin.fileno()):
        word = sys.stdin.readline().rstrip("\n")
    else:
        word = getpass.getpass("password: ")
        if getpass.getpass("again: ") != word:
            raise UsageError("the two passwords differ; nothing was changed")
    if not word:
        raise UsageError("the password is empty; nothing was changed")
    return word
