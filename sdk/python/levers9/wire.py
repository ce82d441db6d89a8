"""The call and result formats between the caller and its task's container.

Both travel as two pickle layers, so that the outer one (plain types only)
always loads, and a part that cannot be unpickled is reported by name:

* the call, in ``TaskSpec.input`` (at most :data:`MAX_INPUT_BYTES`), read by
  the container from ``/run/levers9/io/input``::

      {"levers9": 1, "module": "train", "qualname": "fit", "main": True,
       "call": pickle((args, kwargs))}

* the result, written by the container to ``/run/levers9/io/result`` (at
  most :data:`MAX_RESULT_BYTES`) and returned by ``GET /api/v1/tasks/{id}/result``::

      {"levers9": 1, "ok": True, "value": pickle(value)}
      {"levers9": 1, "ok": False, "exc": pickle(exception) or None,
       "type": "pkg.Error", "message": "...", "traceback": "..."}

``main`` marks a function defined in ``__main__``: its module's classes
pickle as ``__main__.X`` in the caller and as ``<module>.X`` in the
container, and :func:`loads` maps one name to the other.

Pickles run code when they load: the caller trusts the image its functions
run in, as it trusts the code it imports.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, Mapping

VERSION = 1
MAX_INPUT_BYTES = 1 << 20
MAX_RESULT_BYTES = 8 << 20
PROTOCOL = 5

INPUT_PATH = "/run/levers9/io/input"
RESULT_PATH = "/run/levers9/io/result"


class _Unpickler(pickle.Unpickler):
    def __init__(self, f: io.BytesIO, modmap: Mapping[str, str]) -> None:
        super().__init__(f)
        self._modmap = modmap

    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(self._modmap.get(module, module), name)


def dumps(obj: Any) -> bytes:
    """Pickle with the protocol both sides read."""
    return pickle.dumps(obj, protocol=PROTOCOL)


def loads(data: bytes, modmap: Mapping[str, str] | None = None) -> Any:
    """Unpickle, reading classes of module ``k`` from ``modmap[k]``."""
    if not modmap:
        return pickle.loads(data)
    return _Unpickler(io.BytesIO(data), modmap).load()


def size_text(n: int) -> str:
    """A byte count for people: "1.5 MiB"."""
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} bytes"
