"""Finding the controlplane: the levers9 CLI's contexts file and LEVERS9_* env.

The rules are the Go CLI's (internal/clientconfig):

* ``$LEVERS9_HOME/config.toml`` (default ``~/.levers9/config.toml``) holds
  named contexts and the ``current`` one::

      current = "local"
      [contexts.local]
      controlplane = "127.0.0.1:1993"   # gRPC address
      rest = "127.0.0.1:1994"           # REST address (default: same host, port 1994)
      token = "..."
      tls = true
      ca_file = "/path/ca.pem"

* ``LEVERS9_CONTROLPLANE`` (with ``LEVERS9_CONTROLPLANE_CA``) skips the file;
  otherwise the context named by the caller, else ``LEVERS9_CONTEXT``, else
  the file's current one. ``LEVERS9_TOKEN`` overrides the token and
  ``LEVERS9_REST`` the REST address either way; ``LEVERS9_CONTROLPLANE_CA``
  overrides ``ca_file``.
* TLS: port 443 always; other ports only when the context says ``tls = true``
  or ``LEVERS9_CONTROLPLANE_TLS`` is true. The REST gateway serves TLS
  exactly when the gRPC port does, so the decision is made on the
  controlplane address and applies to both (as the Go CLI's
  clientconfig.RESTAddress says). A ``ca_file`` replaces the system's
  trusted roots.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from typing import Mapping

from .errors import ConfigError

DEFAULT_REST_PORT = 1994
ENVIRONMENT_CONTEXT = "(environment)"

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


@dataclasses.dataclass(frozen=True)
class Config:
    """Where and how to reach a controlplane. ``token`` is never shown in
    ``repr``."""

    controlplane: str
    rest: str
    token: str = dataclasses.field(default="", repr=False)
    tls: bool = False
    ca_file: str = ""
    context: str = ""

    @property
    def rest_host(self) -> str:
        """The REST address's host (brackets removed from IPv6)."""
        return split_host_port(self.rest)[0]

    @property
    def rest_port(self) -> int:
        """The REST address's port."""
        return int(split_host_port(self.rest)[1])


def split_host_port(addr: str) -> tuple[str, str]:
    """Split ``HOST:PORT`` (``[v6]:PORT`` for IPv6) like Go's net.SplitHostPort."""
    if addr.startswith("["):
        end = addr.find("]")
        if end < 0 or not addr[end + 1:].startswith(":"):
            raise ConfigError(f"address {addr!r} is not HOST:PORT")
        host, port = addr[1:end], addr[end + 2:]
    else:
        host, sep, port = addr.rpartition(":")
        if not sep or ":" in host:
            raise ConfigError(f"address {addr!r} is not HOST:PORT")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"address {addr!r} is not HOST:PORT (bad port {port!r})")
    return host, port


def join_host_port(host: str, port: int | str) -> str:
    """The inverse of split_host_port."""
    if ":" in host:
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def default_rest(controlplane: str) -> str:
    """The REST address when none is given: the controlplane's host, port 1994."""
    host, _ = split_host_port(controlplane)
    return join_host_port(host, DEFAULT_REST_PORT)


def parse_bool(name: str, value: str) -> bool:
    """Parse a boolean as Go's strconv.ParseBool does, naming the variable."""
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={value!r} is not true or false")


def use_tls(controlplane: str, ctx_tls: bool, environ: Mapping[str, str]) -> bool:
    """The CLI's TLS rule for an address: port 443 always; other ports only
    when the context says tls = true or LEVERS9_CONTROLPLANE_TLS=true."""
    _, port = split_host_port(controlplane)
    if port == "443" or ctx_tls:
        return True
    v = environ.get("LEVERS9_CONTROLPLANE_TLS", "")
    if v:
        return parse_bool("LEVERS9_CONTROLPLANE_TLS", v)
    return False


def home_dir(environ: Mapping[str, str]) -> str:
    """The client's state directory: $LEVERS9_HOME, else ~/.levers9."""
    d = environ.get("LEVERS9_HOME", "")
    if d:
        return d
    return os.path.join(os.path.expanduser("~"), ".levers9")


def _context_from(table: object, name: str, path: str) -> dict:
    """Check one [contexts.NAME] table's keys and types."""
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: contexts.{name} is not a table")
    kinds = {"controlplane": str, "rest": str, "token": str, "tls": bool, "ca_file": str}
    problems = []
    for key, value in table.items():
        want = kinds.get(key)
        if want is None:
            problems.append(f"contexts.{name}: unknown key {key!r} (known: {', '.join(kinds)})")
        elif not isinstance(value, want):
            problems.append(f"contexts.{name}.{key}: want a {want.__name__}")
    if problems:
        raise ConfigError(f"{path} does not parse (fix or delete it): " + "; ".join(problems))
    return table


def load(context: str | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Resolve the active context into a Config (see the module doc).

    ``context`` names a context of the file (default: LEVERS9_CONTEXT, then
    the file's ``current``); ``environ`` defaults to os.environ.
    """
    env = os.environ if environ is None else environ
    cp = env.get("LEVERS9_CONTROLPLANE", "")
    if cp:
        name = ENVIRONMENT_CONTEXT
        ctx: dict = {"controlplane": cp, "ca_file": env.get("LEVERS9_CONTROLPLANE_CA", "")}
    else:
        path = os.path.join(home_dir(env), "config.toml")
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(
                f"no levers9 CLI config at {path}: create a context with `levers9 config create NAME "
                "--controlplane HOST:PORT [--rest HOST:PORT] [--tls] [--ca FILE]` (make up saves one), "
                "or set LEVERS9_CONTROLPLANE and LEVERS9_TOKEN") from None
        except OSError as e:
            raise ConfigError(f"read {path}: {e.strerror or e}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path} does not parse (fix or delete it): {e}") from None
        contexts = data.get("contexts") or {}
        if not isinstance(contexts, dict):
            raise ConfigError(f"{path}: contexts is not a table")
        name = context or env.get("LEVERS9_CONTEXT", "") or data.get("current", "")
        if not isinstance(name, str):
            raise ConfigError(f"{path}: current is not a string")
        if not name:
            raise ConfigError("no current context: pick one with `levers9 config use NAME` "
                              f"(have: {', '.join(sorted(contexts))})")
        if name not in contexts:
            raise ConfigError(f"no context {name!r} in {path}: see `levers9 config list`")
        ctx = _context_from(contexts[name], name, path)
        if not ctx.get("controlplane"):
            raise ConfigError(f"{path}: contexts.{name} has no controlplane address")
    controlplane = ctx["controlplane"]
    split_host_port(controlplane)  # fail early on a bad address
    rest = env.get("LEVERS9_REST", "") or ctx.get("rest", "") or default_rest(controlplane)
    split_host_port(rest)
    token = env.get("LEVERS9_TOKEN", "") or ctx.get("token", "")
    ca_file = env.get("LEVERS9_CONTROLPLANE_CA", "") or ctx.get("ca_file", "")
    tls = use_tls(controlplane, bool(ctx.get("tls", False)), env)
    return Config(controlplane=controlplane, rest=rest, token=token, tls=tls, ca_file=ca_file, context=name)
