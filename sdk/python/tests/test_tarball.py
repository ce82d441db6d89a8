"""Deterministic tars: the bytes Go's recipe.TarSource writes, whatever the
files' times and owners; the code bundle's tar is the same for the same
code."""

from __future__ import annotations

import _sdkpath  # noqa: F401  (first: the checkout's levers9)
import hashlib
import io
import os
import tarfile
import tempfile
import time
import unittest

from levers9 import bundle, tarball

# recipe.TarSource's digest of the tree make_tree() builds, computed with
# the Go code (sandbox/image/recipe) when this test was written: the
# Python tar must stay byte-identical, so a copy step uploaded from Python
# and from the Go CLI is one blob.
GO_DIGEST = "sha256:0c4f79fd9ceb5a8a30a392478272f8983e2515bb5bd49ddd90b14e2f373f8af9"


def make_tree(root: str) -> None:
    """Files, a setuid bit, nested and empty directories, symlinks, a name
    over 100 bytes (USTAR prefix), one over 255 (PAX), a non-ASCII name, a
    long symlink target (PAX linkpath)."""
    def write(rel: str, data: bytes, mode: int = 0o644) -> None:
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
        os.chmod(p, mode)

    write("a/x.txt", b"hi\n")
    write("a.py", b"abc", 0o4755)
    write("a.d/z", b"z\n")
    write("empty", b"")
    write("d" * 60 + "/" + "d" * 60 + "/" + "f" * 90, b"long\n")
    write("a/\u00fcn\u00efcode.txt", b"uni\n")
    write("big.bin", bytes(range(256)) * 5)
    os.makedirs(os.path.join(root, "q" * 120))
    os.makedirs(os.path.join(root, "emptydir"))
    os.symlink("../a.py", os.path.join(root, "a", "link"))
    os.symlink("t" * 120, os.path.join(root, "longlink"))
    for d in ("a", "a.d", "d" * 60, os.path.join("d" * 60, "d" * 60), "q" * 120, "emptydir"):
        os.chmod(os.path.join(root, d), 0o755)
    os.chmod(os.path.join(root, "a.d"), 0o700)


class TarSourceTest(unittest.TestCase):
    def tar(self, src: str) -> tuple[bytes, str]:
        buf = io.BytesIO()
        digest, size = tarball.tar_source(src, buf, 1 << 30)
        self.assertEqual(size, len(buf.getvalue()))
        self.assertEqual(digest, "sha256:" + hashlib.sha256(buf.getvalue()).hexdigest())
        return buf.getvalue(), digest

    def test_same_bytes_as_go(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            make_tree(d)
            _, digest = self.tar(d)
        self.assertEqual(digest, GO_DIGEST)

    def test_times_and_owners_do_not_matter(self) -> None:
        with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
            make_tree(d1)
            time.sleep(0.01)
            make_tree(d2)
            for root, _, files in os.walk(d2):
                for f in files:
                    p = os.path.join(root, f)
                    if os.path.islink(p):
                        continue
                    os.utime(p, (12345, 67890))
                    if os.geteuid() == 0:
                        os.chown(p, 1000, 1000)
            self.assertEqual(self.tar(d1), self.tar(d2))

    def test_readable_by_tarfile(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            make_tree(d)
            data, _ = self.tar(d)
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            names = tf.getnames()
            m = tf.getmember("a.py")
            self.assertEqual(m.mode, 0o755)  # setuid dropped
            self.assertEqual((m.uid, m.gid, m.mtime, m.uname), (0, 0, 0, ""))
            self.assertEqual(tf.getmember("longlink").linkname, "t" * 120)
        self.assertEqual(names[:4], ["a", "a/link", "a/x.txt", "a/\u00fcn\u00efcode.txt"])
        self.assertIn("d" * 60 + "/" + "d" * 60 + "/" + "f" * 90, names)
        self.assertTrue(data.endswith(b"\0" * 1024))
        self.assertEqual(len(data) % 512, 0)

    def test_single_file_and_limits(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "one.txt")
            with open(p, "wb") as f:
                f.write(b"x" * 10)
            data, _ = self.tar(p)
            with tarfile.open(fileobj=io.BytesIO(data)) as tf:
                self.assertEqual(tf.getnames(), ["one.txt"])
            with self.assertRaises(tarball.TarTooLarge):
                tarball.tar_source(p, io.BytesIO(), 1024)
            os.mkfifo(os.path.join(d, "fifo"))
            with self.assertRaisesRegex(ValueError, "a fifo not supported"):
                tarball.tar_source(d, io.BytesIO(), 1 << 20)


class BundleTarTest(unittest.TestCase):
    def test_same_code_same_digest(self) -> None:
        files = {"pkg/mod.py": b"X = 1\n", "main.py": b"import pkg.mod\n", "pkg/__init__.py": b""}
        a = bundle.pack(files)
        b = bundle.pack(dict(reversed(list(files.items()))))
        self.assertEqual(a, b)
        self.assertNotEqual(bundle.pack({**files, "main.py": b"import pkg.mod  \n"})[1], a[1])
        with tarfile.open(fileobj=io.BytesIO(a[0])) as tf:
            self.assertEqual(tf.getnames(), ["main.py", "pkg", "pkg/__init__.py", "pkg/mod.py"])
            self.assertEqual({m.mode for m in tf.getmembers()}, {0o644, 0o755})

    def test_function_bundle_is_deterministic(self) -> None:
        import sdkfuncs
        one = bundle.build(sdkfuncs)
        two = bundle.build("sdkfuncs")
        self.assertEqual((one.digest, one.data), (two.digest, two.data))
        self.assertEqual(one.module, "sdkfuncs")
        self.assertFalse(one.main)
        self.assertIn("sdkfuncs.py", one.files)
        self.assertIn("sdkhelpers/mathutil.py", one.files)
        self.assertIn("sdkhelpers/__init__.py", one.files)
        self.assertIn("levers9/_container.py", one.files)
        self.assertNotIn("test_tarball.py", one.files, "a module the function's module does not import was shipped")
        self.assertFalse(any("unittest" in f or "site-packages" in p for f, p in one.files.items()))


if __name__ == "__main__":
    unittest.main()
