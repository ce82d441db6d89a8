"""levers9.Image renders the recipe format of sandbox/image/recipe, in the
canonical JSON the Go side writes."""

from __future__ import annotations

import _sdkpath  # noqa: F401  (first: the checkout's levers9)
import json
import os
import unittest

import levers9
from levers9.image import marshal


class ImageTest(unittest.TestCase):
    def test_recipe_rendering(self) -> None:
        img = (levers9.Image("debian:bookworm-slim")
               .apt(["python3", "python3-numpy=1:1.24.2-1"])
               .env({"B": "2", "A": "1"}, C="3")
               .workdir("/app")
               .copy("src", "/app")
               .run("python3 -m compileall /app", "echo done")
               .pip("requests==2.31.0", "tqdm")
               .user("1000:1000")
               .entrypoint(["python3", "-m", "app"])
               .cmd(["--help"]))
        r = img.recipe({3: "sha256:" + "a" * 64})
        self.assertEqual(list(r), ["base", "steps", "user", "entrypoint", "cmd"])
        self.assertEqual(r["steps"], [
            {"apt": ["python3", "python3-numpy=1:1.24.2-1"]},
            {"env": {"A": "1", "B": "2", "C": "3"}},
            {"workdir": "/app"},
            {"copy": {"src": os.path.abspath("src"), "dst": "/app", "blob": "sha256:" + "a" * 64}},
            {"run": "python3 -m compileall /app"},
            {"run": "echo done"},
            {"pip": ["requests==2.31.0", "tqdm"]},
        ])
        self.assertEqual(img.problems(), [])
        self.assertEqual(json.loads(marshal(r)), r)

    def test_canonical_json(self) -> None:
        r = levers9.Image("b").env(X="<&> \u00e9 \x7f \u2028").run("a\tb").recipe()
        self.assertEqual(marshal(r), '{"base":"b","steps":[{"env":{"X":"<&> \u00e9 \\u007f \\u2028"}},'
                                     '{"run":"a\\tb"}]}'.encode())
        self.assertEqual(marshal(levers9.Image().recipe()), b'{"base":"levers9-runner:latest"}')

    def test_immutable_builder(self) -> None:
        base = levers9.Image().pip("tqdm")
        a, b = base.run("echo a"), base.run("echo b")
        self.assertEqual(len(base.steps), 1)
        self.assertNotEqual(a, b)
        self.assertEqual(a, levers9.Image().pip("tqdm").run("echo a"))

    def test_problems_all_at_once(self) -> None:
        img = (levers9.Image().env({"1BAD": "x", "LEVERS9_X": "y"}).workdir("relative").copy(".", "/proc/x")
               .apt("Bad Name").pip("pkg>=1").user("Root"))
        p = img.problems()
        self.assertEqual(len(p), 7, p)
        for want in ("steps[0].env['1BAD']", "steps[0].env[LEVERS9_X]", "steps[1].workdir", "steps[2].copy.dst",
                     "steps[3].apt[0]", "steps[4].pip[0]", "user:"):
            self.assertTrue(any(x.startswith(want) for x in p), (want, p))

    def test_function_reports_image_problems(self) -> None:
        app = levers9.App("t")

        def f() -> int:
            return 1

        with self.assertRaisesRegex(ValueError, r"function t\..*f: image: steps\[0\]\.workdir: 'x' is not absolute"):
            app.function(image=levers9.Image().workdir("x"))(f)


if __name__ == "__main__":
    unittest.main()
