"""Against a real levers9 stack: runs only with LEVERS9_TEST_STACK=1 and a
CLI context (LEVERS9_HOME) pointing at it, with two machines in the
default pool and the runner image in the base image registry. The Go test
TestPythonSDK (test/e2e/python_test.go) starts such a stack and runs these.

The tests run in order (their names are numbered): the last one SIGKILLs
an agent, which the harness restarts afterwards.
"""

from __future__ import annotations

import _sdkpath  # noqa: F401  (first: the checkout's levers9)
import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
import unittest

import levers9
from levers9.client import is_terminal

import sdkfuncs
from test_fake import max_overlap

STACK = os.environ.get("LEVERS9_TEST_STACK") == "1"


class Tee(io.StringIO):
    """Keeps what is written and passes it on (so the test log shows it)."""

    def __init__(self, through) -> None:
        super().__init__()
        self.through = through

    def write(self, s: str) -> int:
        self.through.write(s)
        return super().write(s)


@contextlib.contextmanager
def captured():
    out, err = Tee(sys.stdout), Tee(sys.stderr)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


@unittest.skipUnless(STACK, "set LEVERS9_TEST_STACK=1 to run against a real stack (TestPythonSDK does)")
class StackTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.client = levers9.Client()
        cls.saved = sdkfuncs.app._client
        sdkfuncs.app.client = cls.client

    @classmethod
    def tearDownClass(cls) -> None:
        sdkfuncs.app.client = cls.saved
        cls.client.close()

    def task_count(self) -> int:
        return len(self.client.list_tasks(page_size=500).get("tasks") or [])

    def test_1_context_file_is_honoured(self) -> None:
        home = os.environ["LEVERS9_HOME"]
        cfg = levers9.load_config()
        self.assertTrue(os.path.exists(os.path.join(home, "config.toml")))
        self.assertNotEqual(cfg.context, "(environment)")
        self.assertTrue(cfg.token, "the context's token was not read")
        self.assertTrue(cfg.tls and cfg.ca_file, "the context's TLS settings were not read")
        self.assertIsInstance(self.client.list_pools(), list)

    def test_2_remote_returns_value_computed_in_container(self) -> None:
        with captured():
            self.assertEqual(sdkfuncs.square.remote(7), 49)
            info = sdkfuncs.whereami.remote()
        self.assertEqual(info["name"], "sdkfuncs")
        self.assertTrue(info["file"].startswith("/opt/levers9/code/"), info)
        self.assertGreaterEqual(tuple(info["python"]), (3, 11))

    def test_3_output_streams(self) -> None:
        with captured() as (out, err):
            self.assertEqual(sdkfuncs.talk.remote(3), 3)
        self.assertIn("out line 0\nout line 1\nout line 2\n", out.getvalue())
        self.assertIn("to stderr\n", err.getvalue())

    def test_4_remote_exception_reraised_with_traceback(self) -> None:
        with captured(), self.assertRaises(sdkfuncs.Boom) as cm:
            sdkfuncs.fail.remote("kaput")
        e = cm.exception
        self.assertEqual(str(e), "kaput")
        self.assertIsInstance(e.__cause__, levers9.RemoteTraceback)
        tb = str(e.__cause__)
        self.assertIn('/opt/levers9/code/sdkfuncs.py", line', tb)
        self.assertIn("in inner", tb)
        self.assertIn("raise Boom(message)", tb)

    def test_5_map_50_in_order_with_bounded_concurrency(self) -> None:
        t0 = time.monotonic()
        with captured():
            results = list(sdkfuncs.span.map(range(50), [0.3] * 50, concurrency=8))
        print(f"map of 50 took {time.monotonic() - t0:.1f}s", file=sys.stderr)
        self.assertEqual([r[0] for r in results], list(range(50)))
        overlap = max_overlap([(s, e) for _, s, e in results])
        self.assertLessEqual(overlap, 8)
        self.assertGreaterEqual(overlap, 2, "the map ran one task at a time")

    def test_6_looser_security_raises_before_submit(self) -> None:
        before = self.task_count()
        with self.assertRaisesRegex(levers9.SecurityEnvError, "'legacy' is looser than pool default's"):
            sdkfuncs.loose.remote()
        self.assertEqual(self.task_count(), before, "a task was created")
        with captured():
            self.assertEqual(sdkfuncs.strict.remote(), "hardened")

    def test_7_command_line(self) -> None:
        call = sdkfuncs.talk.spawn(2)
        env = dict(os.environ, PYTHONPATH=_sdkpath.SDK_DIR)
        p = subprocess.run([sys.executable, "-W", "error", "-m", "levers9", "logs", call.task_id], env=env,
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "out line 0\nout line 1\n")
        p = subprocess.run([sys.executable, "-W", "error", "-m", "levers9", "tasks", "--limit", "3"], env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(call.task_id, p.stdout)

    def test_9_agent_killed_mid_run_completes_elsewhere(self) -> None:
        got: list = []
        with captured() as (out, err):
            caller = threading.Thread(target=lambda: got.append(sdkfuncs.slow_double.remote(21, 4)))
            caller.start()
            task_id = self.wait_for_begin("py-sdk-tests.slow_double-")
            victim = self.client.get_task(task_id)["attempts"][-1]["machineId"]
            pid = agent_pid(victim)
            os.kill(pid, signal.SIGKILL)
            print(f"killed agent {pid} of machine {victim}", file=sys.stderr)
            caller.join(120)
        self.assertFalse(caller.is_alive(), ".remote() did not return")
        self.assertEqual(got, [42], "remote() returned something else, or raised (see the output above)")
        task = self.client.get_task(task_id)
        attempts = task["attempts"]
        self.assertEqual(len(attempts), 2, attempts)
        self.assertEqual(attempts[0]["state"], "ATTEMPT_STATE_LOST")
        self.assertNotEqual(attempts[1]["machineId"], victim)
        self.assertEqual(task["state"], "TASK_STATE_SUCCEEDED")
        self.assertRegex(err.getvalue(), r"--- attempt 2 on machine \S+ \(attempt 1 lost")
        self.assertEqual(out.getvalue().count("end\n"), 1, out.getvalue())

    def wait_for_begin(self, key_prefix: str) -> str:
        """The ID of the newest task whose idempotency key starts with
        key_prefix, once it printed "begin"."""
        deadline = time.monotonic() + 120
        while True:
            self.assertLess(time.monotonic(), deadline, "the task did not begin")
            tasks = [t for t in self.client.list_tasks(page_size=20).get("tasks") or []
                     if (t.get("idempotencyKey") or "").startswith(key_prefix)]
            if tasks:
                seen: list[dict] = []
                self.client.follow(tasks[0]["id"], seen.append, no_wait=True)
                if any(is_terminal((ev.get("state") or {}).get("taskState", "")) for ev in seen):
                    self.fail(f"the task ended before it began: {self.client.get_task(tasks[0]['id'])}")
                if any("begin" in (ev.get("log") or {}).get("text", "") for ev in seen):
                    return tasks[0]["id"]
            time.sleep(0.2)


def agent_pid(machine_id: str) -> int:
    """The process running `levers9-agent run` whose --state-dir holds
    machine_id's machine-id file."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"levers9-agent\0run\0" not in cmd:
            continue
        args = cmd.decode(errors="replace").split("\0")
        for i, a in enumerate(args[:-1]):
            if a != "--state-dir":
                continue
            try:
                with open(os.path.join(args[i + 1], "machine-id")) as f:
                    if f.read().strip() == machine_id:
                        return int(name)
            except OSError:
                pass
    raise AssertionError(f"no agent process for machine {machine_id}")


if __name__ == "__main__":
    unittest.main()
