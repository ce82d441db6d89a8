"""Security in a function's env: tightening is allowed, a looser or unknown
value raises before anything is submitted."""

from __future__ import annotations

import _sdkpath  # noqa: F401  (first: the checkout's levers9)
import os
import unittest
from unittest import mock

import levers9
from levers9 import security

HARDENED = {"profile": "hardened", "seccomp": "enforce", "volumeMountValidation": "log"}
LEGACY = {"profile": "legacy", "seccomp": "off", "volumeMountValidation": ""}


class SecurityTest(unittest.TestCase):
    def test_tightening_and_same_level_allowed(self) -> None:
        security.check_against_pool({"LEVERS9_SECURITY_PROFILE": "hardened", "LEVERS9_SECCOMP": "enforce"},
                                    "default", HARDENED)
        security.check_against_pool({"LEVERS9_SECURITY_PROFILE": "legacy", "LEVERS9_SECCOMP": "log",
                                     "LEVERS9_VOLUME_MOUNT_VALIDATION": "enforce"}, "old", LEGACY)
        security.check_against_pool({"OTHER": "x"}, "default", HARDENED)

    def test_looser_raises_naming_each(self) -> None:
        with self.assertRaises(levers9.SecurityEnvError) as cm:
            security.check_against_pool({"LEVERS9_SECURITY_PROFILE": "legacy", "LEVERS9_SECCOMP": "log"},
                                        "default", HARDENED)
        msg = str(cm.exception)
        self.assertIn("LEVERS9_SECURITY_PROFILE: 'legacy' is looser than pool default's 'hardened'", msg)
        self.assertIn("LEVERS9_SECCOMP: 'log' is looser than pool default's 'enforce'", msg)
        self.assertIsInstance(cm.exception, ValueError)

    def test_pool_without_settings_counts_as_strictest_default(self) -> None:
        with self.assertRaises(levers9.SecurityEnvError):
            security.check_against_pool({"LEVERS9_SECCOMP": "off"}, "x", None)

    def test_unknown_value_raises_at_declaration(self) -> None:
        app = levers9.App("sec")
        with self.assertRaisesRegex(levers9.SecurityEnvError,
                                    "LEVERS9_SECURITY_PROFILE: 'paranoid' is not legacy or hardened.*"
                                    "LEVERS9_SECCOMP: 'strict' is not off, log or enforce"):
            app.function(env={"LEVERS9_SECURITY_PROFILE": "paranoid", "LEVERS9_SECCOMP": "strict"})(lambda: 1)

    def test_process_env_is_inherited_and_function_env_wins(self) -> None:
        app = levers9.App("sec")
        with mock.patch.dict(os.environ, {"LEVERS9_SECCOMP": "enforce", "LEVERS9_SECURITY_PROFILE": "hardened"}):
            f = app.function(env={"LEVERS9_SECURITY_PROFILE": "legacy"})(lambda: 1)
        self.assertEqual(f.env, {"LEVERS9_SECURITY_PROFILE": "legacy", "LEVERS9_SECCOMP": "enforce"})
        with mock.patch.dict(os.environ, {"LEVERS9_SECCOMP": "bogus"}):
            with self.assertRaises(levers9.SecurityEnvError):
                app.function(lambda: 1)

    def test_looser_raises_before_any_upload_or_submit(self) -> None:
        class NoSubmit(levers9.Client):
            def __init__(self) -> None:  # no config needed
                self.calls: list[str] = []

            def list_pools(self) -> list[dict]:
                self.calls.append("list_pools")
                return [{"name": "default", "security": HARDENED}]

            def call(self, *a, **kw):  # anything else would be a network call
                raise AssertionError(f"unexpected call {a[:3]}")

        c = NoSubmit()
        app = levers9.App("sec", client=c)
        f = app.function(env={"LEVERS9_SECCOMP": "off"})(_module_level)
        with self.assertRaisesRegex(levers9.SecurityEnvError, "'off' is looser than pool default's 'enforce'"):
            f.remote()
        self.assertEqual(c.calls, ["list_pools"])


def _module_level() -> int:
    return 1


if __name__ == "__main__":
    unittest.main()
