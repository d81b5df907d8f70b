"""One client connection: startup, TLS, SCRAM-SHA-256, then simple and extended query.

The protocol subset (PostgreSQL frontend/backend protocol 3.0): SSLRequest (TLS when the
server has a certificate), GSSENCRequest (refused), CancelRequest, StartupMessage,
SASL SCRAM-SHA-256, Query, Parse/Bind/Describe/Execute/Sync/Flush/Close, Terminate.
Results are sent in text format. After an error in an extended-query sequence the
messages up to Sync are skipped, as PostgreSQL does.
"""

from __future__ import annotations

import secrets
import socketserver
import struct
import traceback

from dpsql import errors as dp
from dpsql.interfaces.server import scram, wire
from dpsql.interfaces.server.analyst import AnalystConnection, _Many
from dpsql.interfaces.server.params import bind, decode
from dpsql.interfaces.server.results import Failure, Notice, Result

SASL, SASL_CONTINUE, SASL_FINAL, AUTH_OK = 10, 11, 12, 0
#: how long a new connection may take to start up and authenticate
STARTUP_SECONDS = 60


class Handler(socketserver.StreamRequestHandler):
    """The server side of one TCP connection (a thread of the server)."""

    def handle(self) -> None:
        self.analyst = None
        self.pid = secrets.randbits(31)
        self.secret = secrets.randbits(32)
        slot = False
        self.request.settimeout(STARTUP_SECONDS)    # a silent client cannot hold a slot
        try:
            params = self._startup()
            if params is None:
                return
            slot = self.server.enter()
            if not slot:
                return self._fatal(dp.TooManyConnections(
                    f"the server serves at most {self.server.max_connections} connections "
                    "at once; try again later"))
            account = self._authenticate(params.get("user", ""))
            if account is None:
                return
            self.analyst = AnalystConnection(self.server, account,
                                             _options(params.get("options", "")))
            self.request.settimeout(None)
            self.server.register(self.pid, self.secret, self)
            self._greet(params, account.user)
            self._loop()
        except (wire.Disconnected, ConnectionError, OSError):
            pass
        except wire.ProtocolViolation as exc:
            self._fatal(dp.UsageError(f"protocol violation: {exc}"))
        except dp.DpsqlError as exc:
            self._fatal(exc)
        except Exception as exc:               # a bug: the client gets XX000, text withheld
            traceback.print_exc()
            self._fatal(dp.InternalFailure(dp.one_line(exc)))
        finally:
            self.server.unregister(self.pid)
            if self.analyst is not None:
                self.analyst.close()
            if slot:
                self.server.leave()

    # ---------------------------------------------------------------- startup
    def _startup(self) -> dict | None:
        while True:
            code, body = wire.read_startup(self.rfile)
            if code == wire.SSL_REQUEST and self.server.ssl_context is not None:
                self.wfile.write(b"S")
                self.wfile.flush()
                self.request = self.server.ssl_context.wrap_socket(self.request,
                                                                   server_side=True)
                self.setup()                 # new rfile/wfile over the TLS socket
                continue
            if code in (wire.SSL_REQUEST, wire.GSSENC_REQUEST):
                self.wfile.write(b"N")
                self.wfile.flush()
                continue
            if code == wire.CANCEL_REQUEST and len(body) == 8:
                pid, secret = struct.unpack("!iI", body)
                self.server.cancel(pid, secret)
                return None
            if code != wire.PROTOCOL_3:
                raise wire.ProtocolViolation(f"unsupported protocol version {code >> 16}."
                                             f"{code & 0xFFFF}; use protocol 3.0")
            params = wire.startup_parameters(body)
            if self.server.require_tls and self.server.ssl_context is not None \
                    and not hasattr(self.request, "cipher"):
                raise dp.AuthenticationFailed("this server accepts TLS connections only; "
                                              "connect with sslmode=require")
            return params

    def _authenticate(self, user: str):
        account = self.server.accounts().get(user)
        exchange = scram.ServerExchange(account.verifier if account else None)
        self._send(wire.authentication(SASL, wire.cstr(scram.MECHANISM) + b"\0"))
        try:
            r = wire.Reader(self._expect_password())
            if r.cstring() != scram.MECHANISM:
                raise scram.ScramError("unsupported SASL mechanism")
            first = r.bytes(r.int32()).decode("utf-8")
            self._send(wire.authentication(SASL_CONTINUE, exchange.first(first).encode()))
            final = exchange.final(self._expect_password().decode("utf-8"))
        except (scram.ScramError, UnicodeDecodeError, ValueError):
            self.server.audit(user, "login", "", Failure("28P01", "login refused"))
            self._fatal(dp.AuthenticationFailed(
                f"password authentication failed for user {user!r}; check the user name "
                "and password (the data owner manages them with `dpsql user`)"))
            return None
        self._send(wire.authentication(SASL_FINAL, final.encode()))
        self._send(wire.authentication(AUTH_OK))
        return account

    def _expect_password(self) -> bytes:
        kind, payload = wire.read_message(self.rfile)
        if kind != b"p":
            raise wire.ProtocolViolation("expected a password message")
        return payload

    def _greet(self, params: dict, user: str) -> None:
        status = {"server_version": "15.0", "server_encoding": "UTF8",
                  "client_encoding": "UTF8", "DateStyle": "ISO, MDY", "TimeZone": "UTC",
                  "integer_datetimes": "on", "standard_conforming_strings": "on",
                  "IntervalStyle": "postgres", "is_superuser": "off",
                  "session_authorization": user,
                  "application_name": params.get("application_name", "")}
        out = b"".join(wire.parameter_status(k, v) for k, v in status.items())
        self._send(out + wire.backend_key(self.pid, self.secret) + self._ready())

    # ---------------------------------------------------------------- messages
    def _loop(self) -> None:
        self.statements: dict = {}
        self.portals: dict = {}
        self.skipping = False
        self.notices = b""
        while True:
            kind, payload = wire.read_message(self.rfile)
            if kind == b"X":
                return
            if kind == b"Q":
                self._simple(wire.Reader(payload).cstring())
            elif kind == b"S":
                self.skipping = False
                self._send(self._ready())
            elif kind == b"H":
                self.wfile.flush()
            elif kind in b"PBDEC" and len(kind) == 1:
                if not self.skipping:
                    self._extended(kind, payload)
            else:
                raise wire.ProtocolViolation(f"unexpected message type {kind!r}")

    def _simple(self, sql: str) -> None:
        outcomes = self.analyst.run(sql)
        out = b""
        for o in _flat(outcomes):
            out += _encode(o, describe=True)
        self._send(out + self._ready())

    def _extended(self, kind: bytes, payload: bytes) -> None:
        self.notices = b""              # NoticeResponses of the statement run, sent first
        try:
            out = getattr(self, "_msg_" + kind.decode())(wire.Reader(payload))
            self._send(self.notices + out)
        except _Refused as exc:
            self._error(exc.failure)
        except dp.DpsqlError as exc:
            self._error(Failure.of(exc))

    def _error(self, failure: Failure) -> None:
        self.skipping = True
        self._send(self.notices + wire.error(failure.sqlstate, failure.message))

    def _msg_P(self, r: wire.Reader) -> bytes:
        name, sql = r.cstring(), r.cstring()
        self.statements[name] = (sql, [r.int32() for _ in range(r.int16())])
        return wire.PARSE_COMPLETE

    def _msg_B(self, r: wire.Reader) -> bytes:
        portal, name = r.cstring(), r.cstring()
        if name not in self.statements:
            raise dp.ParseError(f"prepared statement {name!r} does not exist")
        sql, oids = self.statements[name]
        formats = [r.int16() for _ in range(r.int16())]
        values = []
        for i in range(r.int16()):
            n = r.int32()
            raw = None if n < 0 else r.bytes(n)
            binary = (formats[i] if len(formats) > 1 else formats[0] if formats else 0) == 1
            values.append(decode(raw, oids[i] if i < len(oids) else 0, binary))
        if any(f == 1 for f in [r.int16() for _ in range(r.int16())]):
            raise dp.UnsupportedQueryError("binary result format is not supported; ask for "
                                           "text results")
        self.portals[portal] = [bind(sql, values), None]
        return wire.BIND_COMPLETE

    def _msg_D(self, r: wire.Reader) -> bytes:
        what, name = r.bytes(1), r.cstring()
        if what == b"S":
            sql, oids = self.statements.get(name, ("", []))
            return wire.parameter_description([o or 25 for o in oids]) + wire.NO_DATA
        portal = self.portals.get(name)
        if portal is None:
            raise dp.ParseError(f"portal {name!r} does not exist")
        portal[1] = self._outcome(portal[0])      # run now; Execute sends the rows
        o = portal[1]
        if isinstance(o, Failure):
            raise _Refused(o)
        return wire.row_description(o.columns) if o.columns is not None else wire.NO_DATA

    def _msg_E(self, r: wire.Reader) -> bytes:
        name = r.cstring()
        portal = self.portals.get(name)
        if portal is None:
            raise dp.ParseError(f"portal {name!r} does not exist")
        o = portal[1] if portal[1] is not None else self._outcome(portal[0])
        portal[1] = None
        if isinstance(o, Failure):
            raise _Refused(o)
        return _encode(o, describe=False)

    def _msg_C(self, r: wire.Reader) -> bytes:
        what, name = r.bytes(1), r.cstring()
        (self.statements if what == b"S" else self.portals).pop(name, None)
        return wire.CLOSE_COMPLETE

    def _outcome(self, sql: str):
        outcomes = list(_flat(self.analyst.run(sql)))
        self.notices += b"".join(_encode(o, False) for o in outcomes if isinstance(o, Notice))
        outcomes = [o for o in outcomes if not isinstance(o, Notice)]
        failures = [o for o in outcomes if isinstance(o, Failure)]
        return failures[0] if failures else outcomes[-1] if outcomes else Result("EMPTY")

    # ---------------------------------------------------------------- output
    def _ready(self) -> bytes:
        a = self.analyst
        return wire.ready("T" if a is not None and a.in_transaction else "I")

    def _send(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    def _fatal(self, error: dp.DpsqlError) -> None:
        f = Failure.of(error)
        try:
            self._send(wire.error(f.sqlstate, f.message, severity="FATAL"))
        except OSError:
            pass


class _Refused(Exception):
    """A statement's refusal carried out of the extended-protocol handlers to
    :meth:`_extended`, which sends it (control flow, not an error class of its own: the
    Failure already holds the error table's SQLSTATE)."""

    def __init__(self, failure: Failure):
        super().__init__(failure.message)
        self.failure = failure


def _flat(outcomes):
    for o in outcomes:
        if isinstance(o, _Many):
            yield from o
        else:
            yield o


def _encode(o, describe: bool) -> bytes:
    if isinstance(o, Failure):
        return wire.error(o.sqlstate, o.message)
    if isinstance(o, Notice):
        return wire.notice(o.message)
    if o.tag == "EMPTY":
        return wire.EMPTY_QUERY
    out = b""
    if o.columns is not None:
        if describe:
            out += wire.row_description(o.columns)
        out += b"".join(wire.data_row(row) for row in o.rows)
    return out + wire.command_complete(o.tag)


def _options(text: str) -> dict:
    """``-c dpsql.epsilon=0.1 -c dpsql.delta=1e-6`` (libpq's ``options``) as settings."""
    out, words = {}, text.replace("--", "-c ").split()
    for i, w in enumerate(words):
        item = words[i + 1] if w == "-c" and i + 1 < len(words) else w[2:] if \
            w.startswith("-c") else ""
        if "=" in item and item.lower().startswith("dpsql."):
            k, v = item.split("=", 1)
            out[k[len("dpsql."):].lower()] = v
    return out
