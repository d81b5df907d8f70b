"""PostgreSQL frontend/backend protocol v3: framing and the messages dpsql sends.

Only what the server needs: the startup packet (and SSLRequest, CancelRequest), typed
messages with a length, and builders for the backend messages. Every length is bounded
(:data:`MAX_MESSAGE`): a malformed or hostile message is a :class:`ProtocolViolation`
(SQLSTATE 08P01) and the connection is closed, never a crash of the server.
"""

from __future__ import annotations

import struct

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
PROTOCOL_3 = 196608
#: largest message accepted from a client (a batch of SQL text is far smaller)
MAX_MESSAGE = 16 * 1024 * 1024
#: largest startup packet (user, database, options)
MAX_STARTUP = 10_000


class ProtocolViolation(Exception):
    """The client broke the protocol: answered with 08P01, then the connection closes."""


class Disconnected(Exception):
    """The client went away."""


def read_exact(rfile, n: int) -> bytes:
    data = rfile.read(n) if n else b""
    if len(data) != n:
        raise Disconnected()
    return data


def read_startup(rfile) -> tuple[int, bytes]:
    """(code, body) of an untyped startup-phase packet."""
    (length,) = struct.unpack("!i", read_exact(rfile, 4))
    if not 8 <= length <= MAX_STARTUP:
        raise ProtocolViolation(f"invalid startup packet length {length}")
    body = read_exact(rfile, length - 4)
    return struct.unpack("!i", body[:4])[0], body[4:]


def startup_parameters(body: bytes) -> dict[str, str]:
    parts = body.split(b"\0")
    try:
        words = [p.decode("utf-8") for p in parts]
    except UnicodeDecodeError:
        raise ProtocolViolation("startup parameters are not UTF-8") from None
    if len(words) < 2 or words[-1] != "" or len(words) % 2 != 0:
        raise ProtocolViolation("malformed startup packet")
    words = words[:-2] if words[-2] == "" else words[:-1]
    return dict(zip(words[::2], words[1::2]))


def read_message(rfile) -> tuple[bytes, bytes]:
    """(type byte, payload) of one typed message."""
    kind = rfile.read(1)
    if not kind:
        raise Disconnected()
    (length,) = struct.unpack("!i", read_exact(rfile, 4))
    if not 4 <= length <= MAX_MESSAGE:
        raise ProtocolViolation(f"invalid message length {length}")
    return kind, read_exact(rfile, length - 4)


class Reader:
    """Reads the fields of one message payload; running past its end is a violation."""

    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ProtocolViolation("message shorter than its fields")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def int16(self) -> int:
        return struct.unpack("!h", self._take(2))[0]

    def int32(self) -> int:
        return struct.unpack("!i", self._take(4))[0]

    def bytes(self, n: int) -> bytes:
        return self._take(n)

    def cstring(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise ProtocolViolation("unterminated string in message")
        raw = self.data[self.pos:end]
        self.pos = end + 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolViolation("text in message is not UTF-8") from None


# --------------------------------------------------------------------------- backend messages

def message(kind: bytes, payload: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(payload) + 4) + payload


def cstr(text: str) -> bytes:
    return text.replace("\0", "").encode("utf-8") + b"\0"


def authentication(code: int, extra: bytes = b"") -> bytes:
    return message(b"R", struct.pack("!i", code) + extra)


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", cstr(name) + cstr(value))


def backend_key(pid: int, secret: int) -> bytes:
    return message(b"K", struct.pack("!iI", pid, secret))


def ready(status: str) -> bytes:
    return message(b"Z", status.encode("ascii"))


def error(sqlstate: str, text: str, severity: str = "ERROR", hint: str = "") -> bytes:
    body = (b"S" + cstr(severity) + b"V" + cstr(severity) + b"C" + cstr(sqlstate)
            + b"M" + cstr(text))
    if hint:
        body += b"H" + cstr(hint)
    return message(b"E", body + b"\0")


def notice(text: str) -> bytes:
    return message(b"N", b"S" + cstr("NOTICE") + b"V" + cstr("NOTICE") + b"C"
                   + cstr("00000") + b"M" + cstr(text) + b"\0")


def row_description(columns) -> bytes:
    """``columns``: (name, type oid) pairs; text format, no table link."""
    body = struct.pack("!h", len(columns))
    for name, oid in columns:
        body += cstr(name) + struct.pack("!ihihih", 0, 0, oid, -1, -1, 0)
    return message(b"T", body)


def data_row(values) -> bytes:
    """``values``: already text (str) or None (NULL)."""
    body = struct.pack("!h", len(values))
    for v in values:
        if v is None:
            body += struct.pack("!i", -1)
        else:
            raw = v.encode("utf-8")
            body += struct.pack("!i", len(raw)) + raw
    return message(b"D", body)


def command_complete(tag: str) -> bytes:
    return message(b"C", cstr(tag))


def parameter_description(oids) -> bytes:
    return message(b"t", struct.pack("!h", len(oids)) + b"".join(struct.pack("!i", o)
                                                                   for o in oids))


PARSE_COMPLETE = message(b"1")
BIND_COMPLETE = message(b"2")
CLOSE_COMPLETE = message(b"3")
NO_DATA = message(b"n")
EMPTY_QUERY = message(b"I")
