"""Image recipes from Python: ``levers9.Image("base").run(...).pip([...])``.

An :class:`Image` is an immutable builder: every method returns a new Image
with one more step, so a base image can be shared and extended. It renders
to the recipe format of ``sandbox/image/recipe`` (base, steps of run, env,
workdir, copy, apt or pip, then user, entrypoint and cmd) as the canonical
JSON the Go side's ``recipe.Marshal`` writes. A copy step's local source is
packed by :mod:`levers9.tarball` into the same bytes the Go CLI uploads.

Checks made here (all problems reported at once, each naming its step) are
a subset of the controlplane's; it checks the recipe again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import re
from typing import Iterable, Mapping

DEFAULT_BASE = "levers9-runner:latest"

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_APT = re.compile(r"^[a-z0-9][a-z0-9+.-]+(:[a-z0-9-]+)?(=[A-Za-z0-9.+~:_-]+)?$")
_PIP = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?((==|~=)[A-Za-z0-9.+_-]+)?$")
_USER = re.compile(r"^[a-z_][a-z0-9_-]*$")
_FORBIDDEN = ("/proc", "/sys", "/dev")


@dataclasses.dataclass(frozen=True)
class Step:
    """One recipe step; exactly one field is set."""

    run: str = ""
    env: tuple[tuple[str, str], ...] = ()
    workdir: str = ""
    copy_src: str = ""
    copy_dst: str = ""
    copy_blob: str = ""
    apt: tuple[str, ...] = ()
    pip: tuple[str, ...] = ()

    def to_json(self) -> dict:
        """The step in recipe.Marshal's field order, empty fields left out."""
        if self.copy_dst:
            c = {"src": self.copy_src, "dst": self.copy_dst}
            if self.copy_blob:
                c["blob"] = self.copy_blob
            return {"copy": c}
        if self.run:
            return {"run": self.run}
        if self.env:
            return {"env": dict(sorted(self.env))}
        if self.workdir:
            return {"workdir": self.workdir}
        if self.apt:
            return {"apt": list(self.apt)}
        return {"pip": list(self.pip)}


class Image:
    """A recipe under construction. ``Image()`` starts from the default
    runner image (Debian with Python 3.11); ``Image("debian:bookworm")``
    from any image reference (one without a registry resolves against the
    controlplane's imageService.runner.baseImageRegistry). The image needs
    ``python3`` for functions to run in it."""

    def __init__(self, base: str = DEFAULT_BASE) -> None:
        if not isinstance(base, str) or not base:
            raise ValueError("levers9.Image: base must be an image reference")
        self.base = base
        self.steps: tuple[Step, ...] = ()
        self._user = ""
        self._entrypoint: tuple[str, ...] = ()
        self._cmd: tuple[str, ...] = ()

    def _with(self, **changes) -> "Image":
        img = Image.__new__(Image)
        img.__dict__.update(self.__dict__)
        img.__dict__.update(changes)
        return img

    def _add(self, step: Step) -> "Image":
        return self._with(steps=self.steps + (step,))

    def __repr__(self) -> str:
        return f"levers9.Image({self.base!r}, steps={len(self.steps)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Image) and self.recipe() == other.recipe()

    def __hash__(self) -> int:
        return hash(json.dumps(self.recipe(), sort_keys=True))

    # --- steps -----------------------------------------------------------

    def run(self, *commands: str) -> "Image":
        """One run step per command (each run with /bin/sh -c)."""
        img = self
        for c in commands:
            img = img._add(Step(run=c))
        return img

    def env(self, variables: Mapping[str, str] | None = None, **kw: str) -> "Image":
        """Set environment variables for later steps and the image."""
        merged = dict(variables or {})
        merged.update(kw)
        return self._add(Step(env=tuple(sorted((str(k), str(v)) for k, v in merged.items()))))

    def workdir(self, path: str) -> "Image":
        """Set the working directory of later steps and the image."""
        return self._add(Step(workdir=path))

    def copy(self, src: str, dst: str) -> "Image":
        """Copy a local file or directory (relative to the current
        directory) into the image: a directory's entries land under dst, a
        file becomes dst/<its name>. It is packed and uploaded when the image
        is built."""
        return self._add(Step(copy_src=os.path.abspath(os.fspath(src)), copy_dst=dst))

    def apt(self, packages: Iterable[str] | str, *more: str) -> "Image":
        """Install Debian packages (the build needs a package mirror)."""
        return self._add(Step(apt=_names(packages, more)))

    def pip(self, packages: Iterable[str] | str, *more: str) -> "Image":
        """Install Python packages with pip (the build needs an index)."""
        return self._add(Step(pip=_names(packages, more)))

    def user(self, user: str) -> "Image":
        """The image's default user: a name or uid[:gid]."""
        return self._with(_user=user)

    def entrypoint(self, argv: Iterable[str]) -> "Image":
        """Replace the base's entrypoint."""
        return self._with(_entrypoint=tuple(argv))

    def cmd(self, argv: Iterable[str]) -> "Image":
        """Replace the base's command."""
        return self._with(_cmd=tuple(argv))

    # --- rendering -------------------------------------------------------

    def recipe(self, blobs: Mapping[int, str] | None = None) -> dict:
        """The recipe as a dict in canonical field order. ``blobs`` maps a
        copy step's index to its uploaded blob digest."""
        steps = []
        for i, s in enumerate(self.steps):
            if s.copy_dst and blobs and i in blobs:
                s = dataclasses.replace(s, copy_blob=blobs[i])
            steps.append(s.to_json())
        r: dict = {"base": self.base}
        if steps:
            r["steps"] = steps
        if self._user:
            r["user"] = self._user
        if self._entrypoint:
            r["entrypoint"] = list(self._entrypoint)
        if self._cmd:
            r["cmd"] = list(self._cmd)
        return r

    def problems(self) -> list[str]:
        """Every problem this side can see, each naming its field."""
        out = []
        for i, s in enumerate(self.steps):
            at = f"steps[{i}]"
            for k, v in s.env:
                if not _ENV_KEY.match(k):
                    out.append(f"{at}.env[{k!r}]: not a POSIX variable name ([A-Za-z_][A-Za-z0-9_]*)")
                elif k.upper().startswith("LEVERS9_"):
                    out.append(f"{at}.env[{k}]: LEVERS9_* variables are reserved for levers9")
                if "\0" in v:
                    out.append(f"{at}.env[{k!r}]: value contains a NUL byte")
            if s.run and "\0" in s.run:
                out.append(f"{at}.run: contains a NUL byte")
            for field, p in (("workdir", s.workdir), ("copy.dst", s.copy_dst)):
                if p:
                    why = _bad_image_path(p)
                    if why:
                        out.append(f"{at}.{field}: {why}")
            for j, p in enumerate(s.apt):
                if len(p) > 200 or not _APT.match(p):
                    out.append(f"{at}.apt[{j}]: {p!r} is not a Debian package name (name[:arch][=version])")
            for j, p in enumerate(s.pip):
                if len(p) > 200 or not _PIP.match(p):
                    out.append(f"{at}.pip[{j}]: {p!r} is not a Python package name (name[==version] or "
                               "name[~=version]; use a run step for more)")
        if self._user and not _valid_user(self._user):
            out.append(f"user: {self._user!r} is neither a user name nor uid[:gid]")
        return out


def marshal(recipe: dict) -> bytes:
    """recipe.Marshal's canonical JSON: no spaces, no HTML escaping, and the
    runes YAML cannot carry literally written as \\u escapes."""
    s = json.dumps(recipe, ensure_ascii=False, separators=(",", ":"))
    return "".join(f"\\u{ord(c):04x}" if _yaml_unsafe(c) else c for c in s).encode()


def _yaml_unsafe(c: str) -> bool:
    o = ord(c)
    return 0x7F <= o <= 0x9F or o in (0xFEFF, 0xFFFE, 0xFFFF, 0x2028, 0x2029)


def _names(packages: Iterable[str] | str, more: tuple[str, ...]) -> tuple[str, ...]:
    if isinstance(packages, str):
        return (packages,) + tuple(more)
    return tuple(packages) + tuple(more)


def _bad_image_path(p: str) -> str:
    if "\0" in p:
        return "contains a NUL byte"
    if not p.startswith("/"):
        return f"{p!r} is not absolute"
    if ".." in p.split("/"):
        return f"{p!r} has a .. component"
    clean = posixpath.normpath(p)
    if clean.startswith("//"):
        clean = "/" + clean.lstrip("/")
    if clean != p:
        return f"{p!r} is not clean (want {clean!r})"
    for d in _FORBIDDEN:
        if p == d or p.startswith(d + "/"):
            return f"{p!r} is under {d}"
    return ""


def _valid_user(u: str) -> bool:
    if _USER.match(u):
        return len(u) <= 32
    uid, _, gid = u.partition(":")

    def ok(s: str) -> bool:
        return s.isdigit() and s.isascii() and (s == "0" or not s.startswith("0")) and int(s) < (1 << 32) - 1

    return ok(uid) and (":" not in u or ok(gid))
