"""The functions the SDK tests run remotely (against the fake controlplane
or the real stack). The app's client is set by each test class."""

from __future__ import annotations

import os
import sys
import time

import levers9
from sdkhelpers import mathutil

app = levers9.App("sdk-tests")

SMALL = dict(cpu=0.25, memory="128Mi")


class Boom(Exception):
    """A picklable exception raised remotely."""


class Unrebuildable(Exception):
    """Pickles, but cannot be rebuilt from its args: becomes a RemoteError."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a}/{b}")


@app.function(**SMALL)
def square(x: int) -> int:
    """x squared, by a local helper module shipped with this one."""
    return mathutil.square(x)


@app.function(**SMALL)
def whereami() -> dict:
    """Facts about the process the function runs in."""
    return {"file": __file__, "name": __name__, "pid": os.getpid(), "python": sys.version_info[:2],
            "cwd": os.getcwd()}


@app.function(**SMALL)
def talk(n: int) -> int:
    """Print n lines to stdout and one to stderr."""
    for i in range(n):
        print(f"out line {i}")
    print("to stderr", file=sys.stderr)
    return n


@app.function(**SMALL)
def fail(message: str) -> None:
    """Raise Boom(message) from a nested call."""
    def inner() -> None:
        raise Boom(message)
    inner()


@app.function(**SMALL)
def fail_unrebuildable() -> None:
    """Raise an exception that cannot be rebuilt here."""
    raise Unrebuildable(1, 2)


@app.function(**SMALL)
def unpicklable_result():
    """Return something pickle cannot carry."""
    return lambda: 1


@app.function(**SMALL)
def span(i: int, seconds: float) -> tuple[int, float, float]:
    """Sleep, returning (i, start, end) on the host clock."""
    start = time.time()
    time.sleep(seconds)
    return i, start, time.time()


@app.function(retries=2, **SMALL)
def slow_double(x: int, seconds: float) -> int:
    """Print begin, sleep, print end, return 2x."""
    print("begin", flush=True)
    time.sleep(seconds)
    print("end", flush=True)
    return 2 * x


@app.function(env={"LEVERS9_SECURITY_PROFILE": "legacy"}, **SMALL)
def loose() -> str:
    """Asks for looser security than the default pool: never runs."""
    return "should not run"


@app.function(env={"LEVERS9_SECURITY_PROFILE": "hardened", "LEVERS9_SECCOMP": "enforce"}, **SMALL)
def strict() -> str:
    """Asks for the strictest security: runs."""
    return os.environ.get("LEVERS9_SECURITY_PROFILE", "")


@app.function(**SMALL)
def big(n: int) -> bytes:
    """Return n bytes (more than a task may return when n > 8 MiB)."""
    return b"x" * n
