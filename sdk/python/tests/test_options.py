"""@app.function options become the task spec; every problem is reported at
once, before anything runs."""

from __future__ import annotations

import _sdkpath  # noqa: F401  (first: the checkout's levers9)
import unittest

import levers9
from levers9.function import idempotency_key, parse_memory


def work(x: int) -> int:
    """A module-level function to wrap."""
    return x + 1


class OptionsTest(unittest.TestCase):
    def test_spec(self) -> None:
        app = levers9.App("opts")
        f = app.function(gpu=1, gpu_type="l40s", cpu=2, memory="4Gi", pool="l40s", timeout=600, retries=3,
                         env={"A": "1"}, secrets=["db", "db", "api"], volumes={"/data": "train-data"})(work)
        self.assertEqual(f._spec, {"gpus": 1, "gpuType": "l40s", "cpuMillis": "2000", "memoryBytes": str(4 << 30),
                                   "pool": "l40s", "timeout": "600s", "retries": 3, "secrets": ["db", "api"],
                                   "volumes": [{"name": "train-data", "path": "/data", "readOnly": False}]})
        self.assertEqual(f.env["A"], "1")
        self.assertEqual(f(1), 2, "calling the function runs it here")
        self.assertEqual(f.local(2), 3)
        self.assertEqual(f.__name__, "work")
        self.assertIs(app.functions["work"], f)
        self.assertEqual(app.function(work)._spec, {"retries": 2}, "defaults: retries 2, the rest the pool's")
        self.assertEqual(app.function(timeout=1.5)(work)._spec["timeout"], "1.5s")

    def test_all_problems_at_once(self) -> None:
        app = levers9.App("opts")
        with self.assertRaises(ValueError) as cm:
            app.function(gpu=-1, gpu_type="x", cpu=0, memory="lots", timeout=-1, retries=-2, env={"1X": "y"},
                         secrets=["bad name"], volumes={"data": "v"}, image=3)(work)
        msg = str(cm.exception)
        for want in ("image: 3", "gpu: -1", "cpu: 0 cores", "memory: 'lots'",
                     "timeout: -1", "retries: -2", "env: '1X'", "secrets: 'bad name'", "volumes: 'data'"):
            self.assertIn(want, msg)

        with self.assertRaisesRegex(ValueError, "gpu_type: 'x' without a GPU count"):
            app.function(gpu_type="x")(work)

    def test_memory(self) -> None:
        self.assertEqual(parse_memory("512Mi"), 512 << 20)
        self.assertEqual(parse_memory("1.5G"), 1_500_000_000)
        self.assertEqual(parse_memory("2gib"), 2 << 30)
        self.assertEqual(parse_memory("4GB"), 4_000_000_000)
        self.assertEqual(parse_memory(1 << 30), 1 << 30)
        for bad in ("1Ki", "x", "1Qi", True):
            with self.assertRaises(ValueError):
                parse_memory(bad)

    def test_idempotency_keys(self) -> None:
        a, b = idempotency_key("app.f<x>"), idempotency_key("app.f<x>")
        self.assertNotEqual(a, b)
        self.assertTrue(a.startswith("py-app.f-x--"))
        self.assertLessEqual(len(idempotency_key("n" * 500)), 128)

    def test_function_pickles_by_reference(self) -> None:
        import pickle

        import sdkfuncs
        self.assertIs(pickle.loads(pickle.dumps(sdkfuncs.square)), sdkfuncs.square)


if __name__ == "__main__":
    unittest.main()
