"""The whole call path against a fake controlplane (fakecp): code bundle,
upload, image build, submit, output, the container entry point, results
and remote exceptions. Offline; always runs."""

from __future__ import annotations

import _sdkpath  # noqa: F401  (first: the checkout's levers9)
import contextlib
import io
import os
import subprocess
import sys
import traceback
import unittest

import levers9
from levers9 import config

import fakecp
import sdkfuncs

SDK_DIR = fakecp.SDK_DIR
HERE = os.path.dirname(os.path.abspath(__file__))


def fake_client(cp: fakecp.FakeControlplane) -> levers9.Client:
    return levers9.Client(config.load(environ=cp.env()), retry_window=5)


class FakeStackTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.cp = fakecp.FakeControlplane().start()
        cls.saved = sdkfuncs.app._client
        sdkfuncs.app.client = fake_client(cls.cp)

    @classmethod
    def tearDownClass(cls) -> None:
        sdkfuncs.app.client.close()
        sdkfuncs.app.client = cls.saved
        cls.cp.stop()

    def call(self, fn, *args, **kwargs):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            v = fn(*args, **kwargs)
        return v, out.getvalue(), err.getvalue()

    def test_remote_returns_value_from_shipped_modules(self) -> None:
        v, _, _ = self.call(sdkfuncs.square.remote, 12)
        self.assertEqual(v, 144)
        info, _, _ = self.call(sdkfuncs.whereami.remote)
        self.assertEqual(info["name"], "sdkfuncs")
        self.assertNotEqual(info["pid"], os.getpid())
        self.assertNotIn(HERE, info["file"], "the container imported the test's own file, not the shipped one")

    def test_output_streams_to_callers_stdout_and_stderr(self) -> None:
        v, out, err = self.call(sdkfuncs.talk.remote, 3)
        self.assertEqual(v, 3)
        self.assertEqual(out, "out line 0\nout line 1\nout line 2\n")
        self.assertIn("to stderr\n", err)

    def test_remote_exception_reraised_with_remote_traceback(self) -> None:
        with self.assertRaises(sdkfuncs.Boom) as cm:
            self.call(sdkfuncs.fail.remote, "kaput")
        e = cm.exception
        self.assertEqual(str(e), "kaput")
        self.assertIsInstance(e.__cause__, levers9.RemoteTraceback)
        self.assertIn("in inner", str(e.__cause__))
        self.assertIn("raise Boom(message)", str(e.__cause__))
        self.assertNotIn("_container.py", str(e.__cause__))
        text = "".join(traceback.format_exception(e))
        self.assertIn("The above exception was the direct cause", text)

    def test_unrebuildable_exception_becomes_remote_error(self) -> None:
        with self.assertRaises(levers9.RemoteError) as cm:
            self.call(sdkfuncs.fail_unrebuildable.remote)
        e = cm.exception
        self.assertEqual(e.type_name, "sdkfuncs.Unrebuildable")
        self.assertEqual(e.message, "1/2")
        self.assertIn("raise Unrebuildable(1, 2)", e.traceback)

    def test_unpicklable_result_is_a_clear_error(self) -> None:
        with self.assertRaises(levers9.ResultError) as cm:
            self.call(sdkfuncs.unpicklable_result.remote)
        self.assertIn("cannot be pickled", str(cm.exception))

    def test_result_over_the_limit_is_a_clear_error(self) -> None:
        with self.assertRaisesRegex(levers9.ResultError, r"is 9.0 MiB pickled, more than the 8.0 MiB a task may return"):
            self.call(sdkfuncs.big.remote, 9 << 20)
        self.assertEqual(len(self.call(sdkfuncs.big.remote, 1 << 20)[0]), 1 << 20)

    def test_map_in_order_with_bounded_concurrency(self) -> None:
        results, _, _ = self.call(lambda: list(sdkfuncs.span.map(range(12), [0.3] * 12, concurrency=3)))
        self.assertEqual([r[0] for r in results], list(range(12)))
        self.assertLessEqual(max_overlap([(s, e) for _, s, e in results]), 3)

    def test_spawn_returns_handle(self) -> None:
        call = sdkfuncs.square.spawn(5)
        self.assertTrue(call.task_id.startswith("t_"))
        v, _, _ = self.call(call.get)
        self.assertEqual(v, 25)
        self.assertEqual(call.get(output=False), 25)

    def test_looser_security_raises_before_anything(self) -> None:
        before = len(self.cp.tasks), len(self.cp.blobs)
        with self.assertRaises(levers9.SecurityEnvError) as cm:
            sdkfuncs.loose.remote()
        self.assertIn("looser than pool default's 'hardened'", str(cm.exception))
        self.assertEqual((len(self.cp.tasks), len(self.cp.blobs)), before)
        self.assertEqual(self.call(sdkfuncs.strict.remote)[0], "hardened")

    def test_input_too_large_raises_before_submit(self) -> None:
        before = len(self.cp.tasks)
        with self.assertRaises(levers9.InputTooLargeError) as cm:
            sdkfuncs.square.remote(b"x" * (1 << 20))
        self.assertIn("more than the 1.0 MiB", str(cm.exception))
        self.assertEqual(len(self.cp.tasks), before)

    def test_image_built_once_per_process(self) -> None:
        self.call(sdkfuncs.square.remote, 2)
        builds = [r for r in self.cp.requests if r == ("POST", "/api/v1/images")]
        self.call(sdkfuncs.square.remote, 3)
        self.assertEqual(len([r for r in self.cp.requests if r == ("POST", "/api/v1/images")]), len(builds))

    def test_script_main_block_stays_local(self) -> None:
        env = dict(os.environ, PYTHONPATH=SDK_DIR, PYTHONDONTWRITEBYTECODE="1", **self.cp.env())
        p = subprocess.run([sys.executable, "-W", "error", os.path.join(HERE, "mainscript.py")], env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("shifting in mainscript\n", p.stdout)
        self.assertIn("result __main__.Point 11 2\n", p.stdout)
        self.assertEqual(p.stderr.count("main block ran"), 1, p.stderr)


    def test_cli_tasks_and_logs(self) -> None:
        env = dict(os.environ, PYTHONPATH=SDK_DIR, PYTHONDONTWRITEBYTECODE="1", **self.cp.env())
        with contextlib.redirect_stderr(io.StringIO()):
            call = sdkfuncs.talk.spawn(2)
            failed = sdkfuncs.fail.spawn("x")

        def cli(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-W", "error", "-m", "levers9", *args], env=env,
                                  capture_output=True, text=True, timeout=60)

        p = cli("logs", call.task_id)
        self.assertEqual((p.returncode, p.stdout), (0, "out line 0\nout line 1\n"), p.stderr)
        self.assertIn("to stderr", p.stderr)
        p = cli("logs", failed.task_id)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("levers9: sdkfuncs.fail raised sdkfuncs.Boom: x", p.stderr)
        p = cli("tasks", "--limit", "5")
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.splitlines()
        self.assertTrue(lines[0].startswith("ID"), p.stdout)
        self.assertRegex(p.stdout, failed.task_id + r" +failed +- +fake.registry/levers9/images@sha256:\w+ +1 +1 ")
        self.assertIn("python3 -m levers9._container", p.stdout)
        p = cli("tasks", "-o", "json")
        self.assertIn(f'"id": "{call.task_id}"', p.stdout)
        p = cli("logs", "t_nope")
        self.assertEqual(p.returncode, 1)
        self.assertIn("task t_nope not found", p.stderr)
        self.assertNotIn(fakecp.TOKEN, p.stderr)


class RetryMarkerTest(unittest.TestCase):
    def test_new_attempt_marked_and_last_result_returned(self) -> None:
        cp = fakecp.FakeControlplane(lose_first_attempt=True).start()
        saved = sdkfuncs.app._client
        sdkfuncs.app.client = fake_client(cp)
        try:
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                v = sdkfuncs.slow_double.remote(21, 0.1)
            self.assertEqual(v, 42)
            self.assertIn("--- attempt 2 on machine m_fake2 (attempt 1 lost: machine m_fake1 went away)",
                          err.getvalue())
            self.assertEqual(out.getvalue(), "begin\nbegin\nend\n")
        finally:
            sdkfuncs.app.client.close()
            sdkfuncs.app.client = saved
            cp.stop()


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one instant."""
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda p: (p[0], p[1]))
    cur = best = 0
    for _, d in points:
        cur += d
        best = max(best, cur)
    return best


if __name__ == "__main__":
    unittest.main()
