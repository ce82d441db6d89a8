"""The container side of a call: ``python3 -m levers9._container``.

It reads the call from /run/levers9/io/input (see :mod:`levers9.wire`),
imports the function's module by its shipped name (a script is imported, so
its ``if __name__ == "__main__":`` block does not run), finds the function
by its qualified name, calls it, and writes the pickled outcome to
/run/levers9/io/result. It exits 0 when the function returned and 1 when it
raised (or the call could not be made). Apart from one line on stderr
naming an exception the function raised, the task's output is the
function's.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Any

from levers9 import wire
from levers9.errors import ResultError


def _type_name(exc: BaseException, module: str, main: bool) -> str:
    cls = type(exc)
    mod = cls.__module__
    if main and mod == module:
        mod = "__main__"
    return cls.__qualname__ if mod == "builtins" else f"{mod}.{cls.__qualname__}"


def _format_tb(exc: BaseException) -> str:
    """The exception's traceback without this module's own frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _failure(exc: BaseException, module: str, main: bool) -> dict:
    out: dict[str, Any] = {"levers9": wire.VERSION, "ok": False, "exc": None,
                           "type": _type_name(exc, module, main), "message": str(exc),
                           "traceback": _format_tb(exc)}
    try:
        data = wire.dumps(exc)
        wire.loads(data)  # some exceptions pickle but cannot be rebuilt
        out["exc"] = data
    except Exception:
        pass
    return out


def _resolve(module: str, qualname: str) -> Any:
    if "<locals>" in qualname.split("."):
        raise TypeError(f"{module}.{qualname} is defined inside a function: levers9 runs module-level functions")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return getattr(obj, "local_function", obj)


def run(input_path: str = wire.INPUT_PATH, result_path: str = wire.RESULT_PATH) -> int:
    """Make the call in input_path and write its outcome to result_path;
    return the process's exit code."""
    module, main, qualname = "", False, "?"
    code = 1
    try:
        with open(input_path, "rb") as f:
            call = wire.loads(f.read())
        module, qualname, main = call["module"], call["qualname"], bool(call.get("main"))
        fn = _resolve(module, qualname)
        modmap = {"__main__": module} if main else None
        args, kwargs = wire.loads(call["call"], modmap)
    except BaseException as e:  # noqa: BLE001 - every failure becomes a result
        outcome = _failure(e, module, main)
    else:
        try:
            value = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - SystemExit too: it is the function's outcome
            outcome = _failure(e, module, main)
        else:
            try:
                outcome = {"levers9": wire.VERSION, "ok": True, "value": wire.dumps(value)}
                code = 0
            except Exception as e:  # noqa: BLE001
                err = ResultError(f"the return value of {module}.{qualname} (a {type(value).__qualname__}) "
                                  f"cannot be pickled: {e}")
                outcome = _failure(err, module, main)
    data = wire.dumps(outcome)
    if len(data) > wire.MAX_RESULT_BYTES:
        what = "return value" if outcome.get("ok") else "exception"
        err = ResultError(f"the {what} of {module}.{qualname} is {wire.size_text(len(data))} pickled, more than the "
                          f"{wire.size_text(wire.MAX_RESULT_BYTES)} a task may return (write large outputs to a "
                          "volume and return their path)")
        outcome, code = _failure(err, module, main), 1
        data = wire.dumps(outcome)
    if not outcome.get("ok"):
        # One line for whoever reads the task's log; the traceback goes back
        # to the caller with the result.
        first = (outcome.get("message") or "").splitlines()[:1]
        what = f"{module}.{qualname} raised" if module else f"the call in {input_path} could not be read:"
        print(f"levers9: {what} {outcome['type']}" + (f": {first[0]}" if first else ""), file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        _write(result_path, data)
    except OSError as e:
        print(f"levers9: cannot write the result to {result_path}: {e.strerror or e} (the task's machine must "
              "support the result channel)", file=sys.stderr)
        return 1
    return code


def _write(path: str, data: bytes) -> None:
    """Write the result whole: through a temporary file and a rename where
    the directory allows, else directly."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        with open(path, "wb") as f:
            f.write(data)


if __name__ == "__main__":
    sys.exit(run())
