"""A fork server for tests that run many short ``dpsql`` commands (the docs' snippets).

Each ``python -m dpsql ...`` spends seconds of CPU importing dpsql (numpy, scipy, DuckDB,
sqlglot) before doing a fraction of a second of work. The server imports those once;
every command is then a fresh process forked from it, with the command's own argv, working
directory, environment, stdin/stdout/stderr and exit status, so a shell snippet sees a
``dpsql`` command that behaves like the installed one. What is shared is only the
already-imported, untouched modules (no command runs in the server itself).

Usage, server (started by :class:`Zygote`)::

    python zygote.py SOCKET

Client (the ``dpsql`` wrapper on the snippet's PATH; stdlib only, started with ``-S``)::

    python -S zygote.py --client SOCKET module|code|path ARG [ARGS...]

``module dpsql ARGS`` is ``python -m dpsql ARGS``; ``code TEXT`` is ``python -c TEXT``;
``path FILE ARGS`` is ``python FILE ARGS``.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys

_HEADER = struct.Struct("!I")


# --------------------------------------------------------------------------- client
def client(sock_path: str, mode: str, args: list[str]) -> int:
    request = json.dumps({"mode": mode, "args": args, "cwd": os.getcwd(),
                          "env": dict(os.environ)}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(sock_path)
        # the command's stdin/stdout/stderr travel with the request: the forked process
        # reads and writes this process's own streams (pipes, files, the terminal)
        socket.send_fds(s, [_HEADER.pack(len(request)) + request], [0, 1, 2])
        reply = b""
        while chunk := s.recv(64):
            reply += chunk
    # no reply: the command died without reporting (a signal); like a shell, say so
    return int(reply) if reply else 1


# --------------------------------------------------------------------------- server
def _receive(conn):
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while len(data) < _HEADER.size or len(data) < _HEADER.size + _HEADER.unpack_from(data)[0]:
        more = conn.recv(1 << 20)
        if not more:
            raise EOFError("truncated request")
        data += more
    (n,) = _HEADER.unpack_from(data)
    return json.loads(data[_HEADER.size:_HEADER.size + n]), fds


def _run(request) -> int:
    """In the forked child: become the command, run it, return its exit status."""
    import runpy
    import traceback

    mode, args = request["mode"], request["args"]
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    try:
        if mode == "module":
            sys.argv = [args[0], *args[1:]]
            sys.path[0] = os.getcwd()  # as ``python -m`` sets it
            runpy.run_module(args[0], run_name="__main__", alter_sys=True)
        elif mode == "path":
            sys.argv = list(args)
            sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
            runpy.run_path(args[0], run_name="__main__")
        else:
            sys.argv = ["-c", *args[1:]]
            sys.path[0] = ""
            exec(compile(args[0], "<string>", "exec"), {"__name__": "__main__",
                                                        "__builtins__": __builtins__})
        return 0
    except SystemExit as e:  # as the interpreter maps sys.exit's argument to a status
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code & 0xFF
        print(e.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - an uncaught exception: traceback, status 1
        traceback.print_exc()
        return 1


def serve(sock_path: str) -> None:
    import signal

    # what a dpsql command and the snippets' Python import; imported once, here
    import dpsql  # noqa: F401
    import dpsql.dbapi  # noqa: F401
    import dpsql.interfaces.cli  # noqa: F401
    import dpsql.scripts  # noqa: F401
    import pandas  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reap themselves
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(8)
    listener.settimeout(5)
    parent = os.getppid()
    print("ready", flush=True)
    sys.stderr.flush()
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if os.getppid() != parent:  # the test run is gone (killed): do not linger
                return
            continue
        conn.settimeout(None)
        try:
            request, fds = _receive(conn)
        except (OSError, EOFError, ValueError):
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:  # the command
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for target, fd in zip((0, 1, 2), fds):
                os.dup2(fd, target)
                os.close(fd)
            code = 1
            try:
                code = _run(request)
            finally:
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except Exception:  # noqa: BLE001 - a closed pipe: nothing to report
                        pass
                try:
                    conn.sendall(str(code).encode())
                finally:
                    os._exit(code)
        for fd in fds:
            os.close(fd)
        conn.close()


class Zygote:
    """A running server and a ``bin`` directory whose ``dpsql`` (and ``dpsql-python``)
    commands go through it. Use as a context manager."""

    def __init__(self, workdir) -> None:
        import pathlib

        self.dir = pathlib.Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sock = str(self.dir / "zygote.sock")
        self.bindir = self.dir / "bin"
        self.proc = None

    def __enter__(self) -> "Zygote":
        import stat
        import subprocess

        self.proc = subprocess.Popen([sys.executable, __file__, self.sock],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.strip() == "ready", f"fork server did not start: {line!r}"
        self.bindir.mkdir(exist_ok=True)
        wrapper = self.bindir / "dpsql"
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "{__file__}" --client '
                           f'"{self.sock}" module dpsql "$@"\n')
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
        return self

    def argv(self, mode: str, *args) -> list[str]:
        """The client command line that runs ``args`` in a forked process."""
        return [sys.executable, "-S", __file__, "--client", self.sock, mode,
                *[str(a) for a in args]]

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.proc.stdout.close()


if __name__ == "__main__":
    if sys.argv[1] == "--client":
        sys.exit(client(sys.argv[2], sys.argv[3], sys.argv[4:]))
    serve(sys.argv[1])
