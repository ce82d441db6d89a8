"""A fake controlplane REST gateway for the offline tests.

It speaks the routes the SDK uses, in the gateway's JSON forms, and "runs" a
task by unpacking the code blob of its image's last copy step into a
temporary directory and running ``levers9._container`` there in a
subprocess (the real container entry point, with the input and result files
in a temporary directory instead of /run/levers9/io). Output lines become
log events as they come. ``lose_first_attempt`` makes each task's first
attempt end LOST before a second one runs, as a killed agent would.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.parse

SDK_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKEN = "fake-token-0123456789"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Task:
    def __init__(self, tid: str, spec: dict, key: str) -> None:
        self.id, self.spec, self.key = tid, spec, key
        self.state = "TASK_STATE_PENDING"
        self.exit_code: int | None = None
        self.attempts: list[dict] = []
        self.events: list[dict] = []
        self.result: bytes | None = None
        self.cond = threading.Condition()
        self.created = _now()
        self.cancelled = False
        self.proc: subprocess.Popen | None = None

    def json(self) -> dict:
        d = {"id": self.id, "spec": self.spec, "state": self.state, "attempts": self.attempts,
             "createdAt": self.created, "message": "", "idempotencyKey": self.key}
        if self.exit_code is not None:
            d["exitCode"] = self.exit_code
        return d

    def emit(self, attempt: int, **ev) -> None:
        with self.cond:
            ev["cursor"] = str(len(self.events) + 1)
            ev["attempt"] = attempt
            ev["time"] = _now()
            self.events.append(ev)
            self.cond.notify_all()


class FakeControlplane:
    """Start with start(); stop with stop(). ``requests`` records
    (method, path) of every request."""

    def __init__(self, lose_first_attempt: bool = False, security: dict | None = None) -> None:
        self.lose_first_attempt = lose_first_attempt
        self.security = security or {"profile": "hardened", "seccomp": "enforce", "volumeMountValidation": "log"}
        self.blobs: dict[str, bytes] = {}
        self.images: dict[str, dict] = {}
        self.tasks: dict[str, Task] = {}
        self.by_key: dict[str, Task] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.tmp = tempfile.TemporaryDirectory(prefix="levers9-fakecp-")
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a) -> None:  # quiet
                pass

            def _body(self) -> bytes:
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _send(self, status: int, doc: dict) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, code: int, msg: str) -> None:
                self._send(status, {"code": code, "message": msg, "details": []})

            def _route(self, method: str) -> None:
                u = urllib.parse.urlsplit(self.path)
                q = urllib.parse.parse_qs(u.query)
                with fake.lock:
                    fake.requests.append((method, u.path))
                if self.headers.get("Authorization") != "Bearer " + TOKEN:
                    self._body()
                    return self._error(401, 16, "missing or bad token")
                try:
                    fake.handle(self, method, u.path, q, self._body() if method in ("POST", "PUT") else b"")
                except BrokenPipeError:
                    pass

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

            def do_PUT(self) -> None:
                self._route("PUT")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.addr = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> "FakeControlplane":
        self._thread.start()
        return self

    def stop(self) -> None:
        for t in list(self.tasks.values()):
            if t.proc and t.proc.poll() is None:
                t.proc.kill()
        self.server.shutdown()
        self.server.server_close()
        self.tmp.cleanup()

    def env(self) -> dict[str, str]:
        """The environment a client needs to reach this controlplane."""
        return {"LEVERS9_CONTROLPLANE": "127.0.0.1:1", "LEVERS9_REST": self.addr, "LEVERS9_TOKEN": TOKEN}

    # --- routes ------------------------------------------------------------

    def handle(self, h, method: str, path: str, q: dict, body: bytes) -> None:
        parts = path.strip("/").split("/")
        if parts[:2] != ["api", "v1"]:
            return h._error(404, 5, "no route")
        rest = parts[2:]
        if rest == ["pools"] and method == "GET":
            return h._send(200, {"pools": [{"name": "default", "security": self.security}]})
        if rest[:1] == ["blobs"] and len(rest) == 2:
            d = rest[1]
            if method == "GET":
                return h._send(200, {"exists": d in self.blobs, "size": str(len(self.blobs.get(d, b"")))})
            if method == "PUT":
                if "sha256:" + hashlib.sha256(body).hexdigest() != d:
                    return h._error(400, 3, f"blob {d}: its bytes hash to something else")
                self.blobs[d] = body
                return h._send(200, {"digest": d, "size": str(len(body))})
        if rest == ["images"] and method == "POST":
            return self.build_image(h, json.loads(body))
        if rest[:1] == ["images"] and len(rest) == 2 and method == "GET":
            img = self.images.get(rest[1])
            return h._send(200, {"image": img}) if img else h._error(404, 5, "no such image")
        if rest == ["tasks"] and method == "POST":
            return self.submit(h, json.loads(body))
        if rest == ["tasks"] and method == "GET":
            ts = sorted(self.tasks.values(), key=lambda t: int(t.id[2:]), reverse=True)
            return h._send(200, {"tasks": [t.json() for t in ts], "nextPageToken": ""})
        if rest[:1] == ["tasks"] and len(rest) >= 2:
            t = self.tasks.get(rest[1])
            if t is None:
                return h._error(404, 5, f"task {rest[1]} not found")
            tail = rest[2:]
            if not tail and method == "GET":
                return h._send(200, {"task": t.json()})
            if tail == ["cancel"] and method == "POST":
                self.cancel(t)
                return h._send(200, {"task": t.json()})
            if tail == ["result"] and method == "GET":
                if t.state not in ("TASK_STATE_SUCCEEDED", "TASK_STATE_FAILED", "TASK_STATE_CANCELLED",
                                   "TASK_STATE_TIMED_OUT"):
                    return h._error(404, 5, "the task has not ended")
                return h._send(200, {"attempt": len(t.attempts), "present": t.result is not None,
                                     "result": base64.b64encode(t.result or b"").decode(), "error": ""})
            if tail == ["events"] and method == "GET":
                return self.stream(h, t, (q.get("cursor") or [""])[0], (q.get("noWait") or [""])[0] == "true")
        return h._error(404, 5, f"no route {method} {path}")

    def build_image(self, h, req: dict) -> None:
        recipe = json.loads(base64.b64decode(req["recipe"]))
        for i, s in enumerate(recipe.get("steps") or []):
            c = s.get("copy")
            if c and c.get("blob") not in self.blobs:
                return h._error(400, 9, f"steps[{i}]: blob {c.get('blob')} was not uploaded")
        key = "sha256:" + hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()
        if key in self.images and not req.get("force"):
            return h._send(200, {"image": self.images[key], "cached": True, "joined": False})
        t = self.new_task({"image": recipe["base"], "command": ["build"]}, "")
        img = {"hash": key, "state": "IMAGE_STATE_BUILDING", "ref": "", "taskId": t.id, "steps": len(recipe.get("steps") or []),
               "cachedSteps": 0, "recipe": req["recipe"]}
        self.images[key] = img

        def run() -> None:
            t.state = "TASK_STATE_RUNNING"
            t.attempts.append({"number": 1, "state": "ATTEMPT_STATE_RUNNING", "machineId": "m_fake1"})
            t.emit(1, state={"taskState": "TASK_STATE_RUNNING", "attemptState": "ATTEMPT_STATE_RUNNING"})
            for i, s in enumerate(recipe.get("steps") or []):
                t.emit(1, log={"stream": "LOG_STREAM_STDOUT", "text": f"step {i + 1}: {next(iter(s))}"})
            img["ref"] = "fake.registry/levers9/images@" + key
            img["state"] = "IMAGE_STATE_READY"
            self.finish(t, 1, 0)

        threading.Thread(target=run, daemon=True).start()
        h._send(200, {"image": img, "cached": False, "joined": False})

    def new_task(self, spec: dict, key: str) -> Task:
        with self.lock:
            t = Task(f"t_{len(self.tasks) + 1}", spec, key)
            self.tasks[t.id] = t
            if key:
                self.by_key[key] = t
        return t

    def submit(self, h, req: dict) -> None:
        key = req.get("idempotencyKey", "")
        with self.lock:
            if key in self.by_key:
                return h._send(200, {"task": self.by_key[key].json(), "existing": True})
        t = self.new_task(req["spec"], key)
        threading.Thread(target=self.run_task, args=(t,), daemon=True).start()
        h._send(200, {"task": t.json(), "existing": False})

    def finish(self, t: Task, attempt: int, code: int) -> None:
        ok = code == 0
        t.attempts[-1]["state"] = "ATTEMPT_STATE_SUCCEEDED" if ok else "ATTEMPT_STATE_FAILED"
        t.attempts[-1]["exitCode"] = code
        t.exit_code = code
        t.state = "TASK_STATE_SUCCEEDED" if ok else "TASK_STATE_FAILED"
        if t.cancelled:
            t.state = "TASK_STATE_CANCELLED"
        t.emit(attempt, state={"taskState": t.state, "attemptState": t.attempts[-1]["state"], "exitCode": code})

    def cancel(self, t: Task) -> None:
        t.cancelled = True
        if t.proc and t.proc.poll() is None:
            t.proc.kill()

    def run_task(self, t: Task) -> None:
        ref = t.spec["image"]
        img = next((i for i in self.images.values() if i.get("ref") == ref), None)
        recipe = json.loads(base64.b64decode(img["recipe"]))
        blob = recipe["steps"][-1]["copy"]["blob"]
        work = tempfile.mkdtemp(dir=self.tmp.name)
        code_dir = os.path.join(work, "code")
        with tarfile.open(fileobj=io.BytesIO(self.blobs[blob])) as tf:
            if hasattr(tarfile, "data_filter"):  # 3.11.4 and later
                tf.extractall(code_dir, filter="data")
            else:
                tf.extractall(code_dir)
        attempt = 1
        if self.lose_first_attempt:
            t.attempts.append({"number": 1, "state": "ATTEMPT_STATE_RUNNING", "machineId": "m_fake1"})
            t.state = "TASK_STATE_RUNNING"
            t.emit(1, state={"taskState": "TASK_STATE_RUNNING", "attemptState": "ATTEMPT_STATE_RUNNING",
                             "machineId": "m_fake1"})
            t.emit(1, log={"stream": "LOG_STREAM_STDOUT", "text": "begin"})
            t.attempts[-1]["state"] = "ATTEMPT_STATE_LOST"
            t.emit(1, state={"taskState": "TASK_STATE_PENDING", "attemptState": "ATTEMPT_STATE_LOST",
                             "message": "attempt 1 lost: machine m_fake1 went away; retrying"})
            attempt = 2
        t.attempts.append({"number": attempt, "state": "ATTEMPT_STATE_RUNNING", "machineId": f"m_fake{attempt}"})
        t.state = "TASK_STATE_RUNNING"
        t.emit(attempt, state={"taskState": "TASK_STATE_RUNNING", "attemptState": "ATTEMPT_STATE_RUNNING",
                               "machineId": f"m_fake{attempt}", "newAttempt": attempt > 1})
        inp, res = os.path.join(work, "input"), os.path.join(work, "result")
        with open(inp, "wb") as f:
            f.write(base64.b64decode(t.spec.get("input", "")))
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"}
        env.update(t.spec.get("env") or {})
        env["PYTHONPATH"] = env["PYTHONPATH"].replace("/opt/levers9/code", code_dir)
        cmd = [sys.executable, "-c",
               f"import sys, levers9._container as c; sys.exit(c.run({inp!r}, {res!r}))"]
        t.proc = subprocess.Popen(cmd, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

        def pump(stream, name: str) -> None:
            with stream:
                for line in stream:
                    t.emit(attempt, log={"stream": name, "text": line.decode(errors="replace").rstrip("\n")})

        pumps = [threading.Thread(target=pump, args=(t.proc.stdout, "LOG_STREAM_STDOUT")),
                 threading.Thread(target=pump, args=(t.proc.stderr, "LOG_STREAM_STDERR"))]
        for p in pumps:
            p.start()
        code = t.proc.wait()
        for p in pumps:
            p.join()
        if os.path.exists(res):
            with open(res, "rb") as f:
                t.result = f.read()
        self.finish(t, attempt, code if code >= 0 else 137)

    def stream(self, h, t: Task, cursor: str, no_wait: bool) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Connection", "close")
        h.end_headers()
        i = int(cursor or 0)
        while True:
            with t.cond:
                while i >= len(t.events) and not no_wait:
                    if t.events and "state" in t.events[-1] and t.events[-1]["state"]["taskState"] in (
                            "TASK_STATE_SUCCEEDED", "TASK_STATE_FAILED", "TASK_STATE_CANCELLED"):
                        break
                    t.cond.wait(1)
                batch = t.events[i:]
            for ev in batch:
                h.wfile.write(json.dumps({"result": ev}).encode() + b"\n")
                h.wfile.flush()
            i += len(batch)
            last = t.events[i - 1] if i else None
            if no_wait or (last and "state" in last and last["state"]["taskState"] in (
                    "TASK_STATE_SUCCEEDED", "TASK_STATE_FAILED", "TASK_STATE_CANCELLED")):
                h.close_connection = True
                return
