"""The package needs nothing outside Python's standard library: it imports
in an isolated interpreter (-I -S: no site-packages, no user site, no
PYTHONPATH) whose sys.path holds only the standard library and the
checkout."""

from __future__ import annotations

import _sdkpath  # noqa: F401  (first: the checkout's levers9)
import subprocess
import sys
import unittest

from _sdkpath import SDK_DIR

PROBE = r"""
import sys, sysconfig
stdlib = {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
sys.path[:] = [p for p in sys.path if p in stdlib or p.startswith(tuple(stdlib)) or p.endswith(".zip")]
sys.path.append(SDK)
before = set(sys.modules)
import levers9, levers9.__main__, levers9._container
from levers9 import bundle, client, config, function, image, output, security, tarball, wire
outside = []
for name, mod in sorted(sys.modules.items()):
    f = getattr(mod, "__file__", None) or ""
    if not f or f.startswith(SDK + "/levers9/"):
        continue
    if not any(f.startswith(p) for p in stdlib):
        outside.append((name, f))
print("OUTSIDE", outside)
print("PATH", sys.path)
"""


class StdlibOnlyTest(unittest.TestCase):
    def test_imports_with_a_stripped_sys_path(self) -> None:
        p = subprocess.run([sys.executable, "-I", "-S", "-W", "error", "-c", f"SDK = {SDK_DIR!r}\n" + PROBE],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("OUTSIDE []", p.stdout, p.stdout)
        self.assertNotIn("site-packages", p.stdout.split("PATH", 1)[1])


if __name__ == "__main__":
    unittest.main()
