"""Finding the controlplane: the CLI's contexts file, the LEVERS9_*
overrides, the REST address default and the TLS rule."""

from __future__ import annotations

import _sdkpath  # noqa: F401  (first: the checkout's levers9)
import os
import tempfile
import unittest

import levers9
from levers9 import config
from levers9.errors import ConfigError

CONFIG = """\
current = "local"

[contexts.local]
controlplane = "10.1.2.3:1993"
token = "tok-local-secret"
tls = true
ca_file = "/etc/levers9/ca.pem"

[contexts.prod]
controlplane = "levers9.example.com:443"
rest = "api.levers9.example.com:8443"
token = "tok-prod-secret"

[contexts.plain]
controlplane = "[::1]:1993"
"""


class ConfigTest(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        with open(os.path.join(self.dir.name, "config.toml"), "w") as f:
            f.write(CONFIG)
        self.env = {"LEVERS9_HOME": self.dir.name}

    def load(self, context: str | None = None, **env: str) -> config.Config:
        return config.load(context, {**self.env, **env})

    def test_current_context_and_rest_default(self) -> None:
        c = self.load()
        self.assertEqual((c.context, c.controlplane, c.rest), ("local", "10.1.2.3:1993", "10.1.2.3:1994"))
        self.assertEqual((c.token, c.tls, c.ca_file), ("tok-local-secret", True, "/etc/levers9/ca.pem"))
        self.assertNotIn("tok-local-secret", repr(c))

    def test_named_context_with_rest_key(self) -> None:
        c = self.load("prod")
        self.assertEqual((c.rest, c.rest_host, c.rest_port), ("api.levers9.example.com:8443",
                                                               "api.levers9.example.com", 8443))
        self.assertTrue(c.tls, "port 443 is always TLS")

    def test_ipv6_rest_default(self) -> None:
        c = self.load("plain")
        self.assertEqual((c.rest, c.rest_host, c.tls), ("[::1]:1994", "::1", False))

    def test_env_overrides(self) -> None:
        c = self.load(LEVERS9_CONTEXT="prod", LEVERS9_TOKEN="tok-env", LEVERS9_REST="127.0.0.1:7000",
                      LEVERS9_CONTROLPLANE_CA="/tmp/ca.pem")
        self.assertEqual((c.context, c.token, c.rest, c.ca_file), ("prod", "tok-env", "127.0.0.1:7000", "/tmp/ca.pem"))
        self.assertEqual(self.load("plain", LEVERS9_CONTEXT="prod").context, "plain", "an explicit name wins")

    def test_controlplane_env_skips_the_file(self) -> None:
        c = config.load(environ={"LEVERS9_HOME": "/nonexistent", "LEVERS9_CONTROLPLANE": "cp.internal:1993",
                                 "LEVERS9_TOKEN": "t", "LEVERS9_CONTROLPLANE_CA": "/ca.pem"})
        self.assertEqual((c.context, c.controlplane, c.rest, c.ca_file, c.tls),
                         (config.ENVIRONMENT_CONTEXT, "cp.internal:1993", "cp.internal:1994", "/ca.pem", False))

    def test_tls_rule(self) -> None:
        env = {}
        self.assertTrue(config.use_tls("h:443", False, env))
        self.assertTrue(config.use_tls("h:1993", True, env))
        self.assertFalse(config.use_tls("h:1993", False, env))
        self.assertTrue(config.use_tls("h:1993", False, {"LEVERS9_CONTROLPLANE_TLS": "true"}))
        self.assertTrue(config.use_tls("h:1993", False, {"LEVERS9_CONTROLPLANE_TLS": "1"}))
        self.assertFalse(config.use_tls("h:1993", False, {"LEVERS9_CONTROLPLANE_TLS": "F"}))
        self.assertTrue(config.use_tls("h:1993", True, {"LEVERS9_CONTROLPLANE_TLS": "false"}), "the context wins")
        with self.assertRaisesRegex(ConfigError, "LEVERS9_CONTROLPLANE_TLS='yes' is not true or false"):
            config.use_tls("h:1993", False, {"LEVERS9_CONTROLPLANE_TLS": "yes"})
        self.assertTrue(self.load("plain", LEVERS9_CONTROLPLANE_TLS="true").tls)
        self.assertFalse(self.load("plain", LEVERS9_REST="h:8080").tls)
        self.assertFalse(self.load("plain", LEVERS9_REST="h:443").tls, "the controlplane's rule decides")

    def test_client_trusts_ca_file(self) -> None:
        # A CA file that does not exist fails when the client is made, naming the file only.
        with self.assertRaisesRegex(levers9.TransportError, "read CA file /etc/levers9/ca.pem") as cm:
            levers9.Client(self.load())
        self.assertNotIn("tok-local-secret", str(cm.exception))
        plain = levers9.Client(self.load("plain"))
        self.assertIn("http://[::1]:1994", repr(plain))

    def test_errors(self) -> None:
        with self.assertRaisesRegex(ConfigError, "no levers9 CLI config at /nonexistent/config.toml"):
            config.load(environ={"LEVERS9_HOME": "/nonexistent"})
        with self.assertRaisesRegex(ConfigError, "no context 'nope'"):
            self.load("nope")
        with open(os.path.join(self.dir.name, "config.toml"), "a") as f:
            f.write('[contexts.bad]\ncontrolplane = "h:1"\ntls = "yes"\ncolour = 1\n')
        with self.assertRaisesRegex(ConfigError, r"contexts.bad.tls: want a bool; contexts.bad: unknown key 'colour'"):
            self.load("bad")
        with self.assertRaisesRegex(ConfigError, "is not HOST:PORT"):
            self.load(LEVERS9_REST="no-port")

    def test_default_home(self) -> None:
        self.assertEqual(config.home_dir({}), os.path.join(os.path.expanduser("~"), ".levers9"))


if __name__ == "__main__":
    unittest.main()
