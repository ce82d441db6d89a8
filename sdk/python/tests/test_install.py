"""`pip install --no-build-isolation ./sdk/python` works offline with the
setuptools already installed (skipped where pip, or setuptools' wheel
building, is missing: setuptools before 70.1 needs the wheel package)."""

from __future__ import annotations

import _sdkpath  # noqa: F401  (first: the checkout's levers9)
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

from _sdkpath import SDK_DIR


def _can_build() -> str:
    """Why a wheel cannot be built here, or ""."""
    if importlib.util.find_spec("pip") is None:
        return "pip is not installed"
    if importlib.util.find_spec("setuptools") is None:
        return "setuptools is not installed"
    version = importlib.metadata.version("setuptools")
    major, minor = (int(x) for x in version.split(".")[:2])
    if (major, minor) < (70, 1) and importlib.util.find_spec("wheel") is None:
        return f"setuptools {version} builds wheels only with the wheel package, which is missing"
    return ""


@unittest.skipIf(_can_build(), _can_build())
class InstallTest(unittest.TestCase):
    def test_pip_install_offline(self) -> None:
        with tempfile.TemporaryDirectory() as target, tempfile.TemporaryDirectory() as build:
            env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", TMPDIR=build,
                       PYTHONDONTWRITEBYTECODE="1")
            p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                                "--target", target, SDK_DIR], env=env, capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            for f in ("__init__.py", "_container.py", "__main__.py", "tarball.py"):
                self.assertTrue(os.path.exists(os.path.join(target, "levers9", f)), f)
            p = subprocess.run([sys.executable, "-I", "-S", "-c",
                                f"import sys; sys.path.append({target!r}); import levers9; print(levers9.__file__)"],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertTrue(p.stdout.startswith(target), p.stdout)


if __name__ == "__main__":
    unittest.main()
