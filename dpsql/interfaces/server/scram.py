"""SCRAM-SHA-256 (RFC 5802 / RFC 7677) as PostgreSQL speaks it, server side.

Passwords are never stored: the users file holds PostgreSQL's verifier format
``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`` (base64), the same text
``pg_authid.rolpassword`` holds, so a verifier made by PostgreSQL works here too.
No channel binding (``SCRAM-SHA-256-PLUS`` is not offered); the client nonce, the proof and
the server signature are checked as in the RFC, comparisons in constant time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import unicodedata
from dataclasses import dataclass

MECHANISM = "SCRAM-SHA-256"
ITERATIONS = 4096


class ScramError(Exception):
    """The exchange failed (malformed message or wrong proof). Never says which."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def _normalise(password: str) -> bytes:
    """SASLprep, approximately (NFKC), as PostgreSQL falls back to the raw bytes."""
    return unicodedata.normalize("NFKC", password).encode("utf-8")


def make_verifier(password: str, *, iterations: int = ITERATIONS,
                  salt: bytes | None = None) -> str:
    """The stored verifier of ``password`` (a fresh random salt unless given)."""
    if not password:
        raise ValueError("the password is empty; choose one")
    salt = secrets.token_bytes(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", _normalise(password), salt, iterations)
    client_key = _hmac(salted, b"Client Key")
    stored = hashlib.sha256(client_key).digest()
    server = _hmac(salted, b"Server Key")
    return f"{MECHANISM}${iterations}:{_b64(salt)}${_b64(stored)}:{_b64(server)}"


@dataclass(frozen=True)
class Verifier:
    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    @classmethod
    def parse(cls, text: str) -> "Verifier":
        try:
            mech, rest = text.split("$", 1)
            head, keys = rest.split("$", 1)
            iterations, salt = head.split(":", 1)
            stored, server = keys.split(":", 1)
            if mech != MECHANISM or int(iterations) < 1:
                raise ValueError
            return cls(int(iterations), base64.b64decode(salt, validate=True),
                       base64.b64decode(stored, validate=True),
                       base64.b64decode(server, validate=True))
        except (ValueError, TypeError):
            raise ValueError("not a SCRAM-SHA-256 verifier; make one with `dpsql user "
                             "passwd`") from None


def _attributes(message: str) -> dict:
    out = {}
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise ScramError("malformed SCRAM message")
        out[part[0]] = part[2:]
    return out


class ServerExchange:
    """One authentication: ``first(client_first) -> server_first``, then
    ``final(client_final) -> server_final`` (raises :class:`ScramError` on a bad proof).
    A user that does not exist gets a made-up verifier, so the exchange looks the same."""

    def __init__(self, verifier: Verifier | None):
        self.known = verifier is not None
        self.verifier = verifier or Verifier(ITERATIONS, secrets.token_bytes(16),
                                             secrets.token_bytes(32), secrets.token_bytes(32))
        self.nonce = ""
        self.messages = ""

    def first(self, client_first: str) -> str:
        if not client_first.startswith(("n,", "y,")):
            raise ScramError("channel binding is not supported; connect without it")
        gs2_end = client_first.index(",", 2) + 1
        bare = client_first[gs2_end:]
        client_nonce = _attributes(bare).get("r", "")
        if not client_nonce:
            raise ScramError("malformed SCRAM message")
        self.gs2 = client_first[:gs2_end]
        self.nonce = client_nonce + _b64(secrets.token_bytes(18))
        server_first = (f"r={self.nonce},s={_b64(self.verifier.salt)},"
                        f"i={self.verifier.iterations}")
        self.messages = bare + "," + server_first
        return server_first

    def final(self, client_final: str) -> str:
        attrs = _attributes(client_final)
        without_proof = client_final.rsplit(",p=", 1)[0]
        if attrs.get("r") != self.nonce or "p" not in attrs:
            raise ScramError("authentication failed")
        if attrs.get("c") != _b64(self.gs2.encode("ascii")):
            raise ScramError("authentication failed")
        auth = (self.messages + "," + without_proof).encode("utf-8")
        try:
            proof = base64.b64decode(attrs["p"], validate=True)
        except ValueError:
            raise ScramError("authentication failed") from None
        signature = _hmac(self.verifier.stored_key, auth)
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        ok = (len(proof) == len(signature)
              and hmac.compare_digest(hashlib.sha256(client_key).digest(),
                                      self.verifier.stored_key))
        if not (ok and self.known):
            raise ScramError("authentication failed")
        return "v=" + _b64(_hmac(self.verifier.server_key, auth))
