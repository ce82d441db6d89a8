"""Security tightenings a function asks for in its environment.

A task may ask for security stricter than its pool's through three
variables (``sandbox.Tighten`` on the Go side):

* ``LEVERS9_SECURITY_PROFILE``: ``legacy`` < ``hardened``
* ``LEVERS9_SECCOMP``: ``off`` < ``log`` < ``enforce``
* ``LEVERS9_VOLUME_MOUNT_VALIDATION``: ``log`` < ``enforce``

Asking for the pool's own level or a stricter one is fine. An unknown value
raises as soon as the function is declared; a value looser than the pool's
raises before anything is uploaded, built or submitted (the pool's
effective settings come from ``GET /api/v1/pools``). The controlplane and
the agent check again.
"""

from __future__ import annotations

from typing import Mapping

from .errors import SecurityEnvError

PROFILE = "LEVERS9_SECURITY_PROFILE"
SECCOMP = "LEVERS9_SECCOMP"
MOUNT_VALIDATION = "LEVERS9_VOLUME_MOUNT_VALIDATION"

# Variable -> (ranked values, the pool's field in SecuritySettings, the
# value a pool that does not say has).
RANKS: dict[str, tuple[tuple[str, ...], str, str]] = {
    PROFILE: (("legacy", "hardened"), "profile", "hardened"),
    SECCOMP: (("off", "log", "enforce"), "seccomp", "enforce"),
    MOUNT_VALIDATION: (("log", "enforce"), "volumeMountValidation", "log"),
}

# The variables that pass from this process's environment to its tasks
# (as the Go SDK passes them); a function's own env wins.
INHERITED = (PROFILE, SECCOMP)


def _words(values: tuple[str, ...]) -> str:
    return ", ".join(values[:-1]) + " or " + values[-1]


def check_values(env: Mapping[str, str], where: str = "env") -> None:
    """Raise SecurityEnvError naming every security variable whose value
    levers9 does not know."""
    problems = []
    for key, (values, _, _) in RANKS.items():
        if key in env and env[key] not in values:
            problems.append(f"{where} {key}: {env[key]!r} is not {_words(values)}")
    if problems:
        raise SecurityEnvError("; ".join(problems))


def check_against_pool(env: Mapping[str, str], pool: str, settings: Mapping[str, str] | None,
                       where: str = "env") -> None:
    """Raise SecurityEnvError naming every security variable that asks for
    less than the pool's effective setting (``settings`` is the pool's
    SecuritySettings as the REST API returns it)."""
    check_values(env, where)
    problems = []
    for key, (values, field, default) in RANKS.items():
        if key not in env:
            continue
        have = (settings or {}).get(field) or default
        if have not in values:
            continue  # a level this SDK does not know: the controlplane judges
        if values.index(env[key]) < values.index(have):
            problems.append(f"{where} {key}: {env[key]!r} is looser than pool {pool}'s {have!r} "
                            "(a task may only tighten its pool's security)")
    if problems:
        raise SecurityEnvError("; ".join(problems))
