"""Shipping a function's code: its module, the local modules it imports, and
levers9 itself, as one deterministic tar.

The project root is the directory on ``sys.path`` that holds the function's
module (for a script run as ``python train.py``, the script's directory).
Starting from the function's module, every ``import`` and ``from ... import``
in its source (found with :mod:`ast`, at any depth, relative ones resolved)
is followed when it names a module whose file lies under the project root,
and not in a site-packages, dist-packages or the standard library; the
packages above each shipped module come with it (their ``__init__.py``).
Only ``.py`` sources are shipped; modules imported dynamically
(``importlib.import_module``) and data files are not.

A function defined in ``__main__`` ships the script under its own name
(``train.py`` as module ``train``), so that in the container it is imported,
not run: its ``if __name__ == "__main__":`` block stays local.

The tar lists files and directories in the order Go's TarSource would for
the same tree, every entry with mode 0644 (files) or 0755 (directories),
owner 0 and time 0: the same code gives the same digest on any machine.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import keyword
import os
import re
import sys
import sysconfig
import types

from .tarball import Entry, write_tar

CODE_DIR = "/opt/levers9/code"
MAX_BUNDLE_BYTES = 512 << 20


@dataclasses.dataclass
class Bundle:
    """A packed code tree: ``files`` maps archive names to local paths;
    ``module`` is the name the container imports the function's module by;
    ``main`` is true when the function was defined in ``__main__`` (a
    script, or ``python -m``), whose classes pickle as ``__main__.X`` here
    and as ``module.X`` there."""

    files: dict[str, str]
    module: str
    main: bool
    root: str
    data: bytes = b""
    digest: str = ""


def _excluded_roots() -> list[str]:
    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            roots.add(os.path.realpath(p))
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix):
        roots.add(os.path.realpath(os.path.join(p, "lib")))
    return sorted(roots)


def _is_local(path: str, root: str, excluded: list[str]) -> bool:
    real = os.path.realpath(path)
    if not real.endswith(".py"):
        return False
    if os.path.commonpath([real, root]) != root:
        return False
    parts = real.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts or "__pycache__" in parts:
        return False
    for ex in excluded:
        if os.path.commonpath([real, ex]) == ex and os.path.commonpath([root, ex]) != ex:
            return False
    return True


def _module_file(name: str, root: str) -> str | None:
    """The source of module ``name``: from sys.modules when imported, else
    found under root by its dotted path."""
    m = sys.modules.get(name)
    f = getattr(m, "__file__", None) if m is not None else None
    if f:
        return f
    if m is not None:
        return None  # a namespace package or a built-in
    base = os.path.join(root, *name.split("."))
    for cand in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(cand):
            return cand
    return None


def _imports(path: str, name: str) -> set[str]:
    """Absolute module names the source at path imports (candidates: a
    ``from p import x`` yields p and p.x)."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return set()
    is_pkg = os.path.basename(path) == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out.add(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                if node.level - 1 > len(parts):
                    continue
                base_parts = parts[: len(parts) - (node.level - 1)]
                if node.module:
                    base_parts += node.module.split(".")
                base = ".".join(base_parts)
            else:
                base = node.module or ""
            if not base:
                continue
            out.add(base)
            for a in node.names:
                if a.name != "*":
                    out.add(base + "." + a.name)
    # Every parent of a dotted name is imported too.
    for n in list(out):
        while "." in n:
            n = n.rpartition(".")[0]
            out.add(n)
    return out


def _root_of(name: str, path: str) -> str:
    """The sys.path directory holding module ``name`` whose file is path."""
    d = os.path.dirname(os.path.realpath(path))
    depth = name.count(".") + (1 if os.path.basename(path) == "__init__.py" else 0)
    for _ in range(depth):
        d = os.path.dirname(d)
    return d


def main_module_name(script: str) -> str:
    """The module name a script is shipped as: its stem, made an identifier."""
    stem = os.path.splitext(os.path.basename(script))[0]
    name = re.sub(r"\W", "_", stem)
    if not name or name[0].isdigit() or keyword.iskeyword(name):
        name = "_" + name
    return name


def collect(module: types.ModuleType | str) -> Bundle:
    """Find the files to ship for a function defined in ``module``."""
    mod = sys.modules[module] if isinstance(module, str) else module
    name = mod.__name__
    path = getattr(mod, "__file__", None)
    if not path:
        raise ValueError(
            f"module {name} has no source file (an interactive session or notebook): levers9 ships a function "
            "by its module's file, so define it in a .py file and import it")
    is_main = name == "__main__"
    script = is_main
    if is_main:
        spec = getattr(mod, "__spec__", None)
        if spec is not None and spec.name and spec.name != "__main__":
            # python -m pkg.mod: the module has a real name to import it by.
            name, script = spec.name, False
    main = script
    root = os.path.realpath(_root_of("x" if script else name, path))
    excluded = _excluded_roots()
    levers9_dir = os.path.dirname(os.path.realpath(__file__))
    files: dict[str, str] = {}
    ship_name = main_module_name(path) if main else name

    def add(modname: str, file: str) -> None:
        real = os.path.realpath(file)
        if os.path.commonpath([real, levers9_dir]) == levers9_dir:
            return
        rel = os.path.relpath(real, root).replace(os.sep, "/")
        files[rel] = real

    if main:
        files[f"{ship_name}.py"] = os.path.realpath(path)
    else:
        add(name, path)
    seen = {name}
    todo = [(name, path)]
    while todo:
        modname, file = todo.pop()
        for dep in sorted(_imports(file, "" if main and modname == name else modname)):
            if dep in seen:
                continue
            seen.add(dep)
            f = _module_file(dep, root)
            if f and _is_local(f, root, excluded):
                add(dep, f)
                todo.append((dep, f))
    # Packages above shipped modules.
    for rel in list(files):
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            init = os.path.join(root, *parts[:i], "__init__.py")
            if os.path.isfile(init):
                files.setdefault("/".join(parts[:i]) + "/__init__.py", os.path.realpath(init))
    for dirpath, dirnames, filenames in os.walk(levers9_dir):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for fn in filenames:
            if fn.endswith(".py"):
                p = os.path.join(dirpath, fn)
                files["levers9/" + os.path.relpath(p, levers9_dir).replace(os.sep, "/")] = p
    return Bundle(files=files, module=ship_name, main=is_main, root=root)


def tree_entries(files: dict[str, str | bytes]) -> list[Entry]:
    """Entries for a virtual tree (archive name -> local path or bytes), in
    the order Go's TarSource lists a directory: depth first, each
    directory's names in byte order; modes 0644 and 0755."""
    tree: dict = {}
    for arc, src in files.items():
        node = tree
        parts = arc.split("/")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"code bundle: {arc} is under a file")
        node[parts[-1]] = src
    out: list[Entry] = []

    def walk(node: dict, prefix: str) -> None:
        for key in sorted(node, key=lambda s: s.encode()):
            v = node[key]
            rel = prefix + key
            if isinstance(v, dict):
                out.append(Entry(name=rel, kind="dir", mode=0o755))
                walk(v, rel + "/")
            elif isinstance(v, bytes):
                out.append(Entry(name=rel, kind="file", mode=0o644, data=v))
            else:
                with open(v, "rb") as f:
                    out.append(Entry(name=rel, kind="file", mode=0o644, data=f.read()))

    walk(tree, "")
    return out


def pack(files: dict[str, str | bytes]) -> tuple[bytes, str]:
    """The deterministic tar of a virtual tree and its digest."""
    buf = io.BytesIO()
    digest, _ = write_tar(tree_entries(files), buf, MAX_BUNDLE_BYTES)
    return buf.getvalue(), digest


def build(module: types.ModuleType | str) -> Bundle:
    """collect() and pack(): the bundle with its bytes and digest."""
    b = collect(module)
    b.data, b.digest = pack(dict(b.files))
    return b

