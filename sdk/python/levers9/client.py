"""The REST client: one controlplane, its token, its TLS settings.

It speaks the grpc-gateway REST API (JSON in protojson form: camelCase
fields, bytes as base64, 64-bit integers as strings) with nothing but
http.client, ssl and json. Calls that are safe to repeat (reads, submits with
an idempotency key, blob uploads, image builds) are retried with backoff
while the controlplane is unreachable or answers UNAVAILABLE, up to
``retry_window`` seconds without progress. A :class:`Client` is safe to use
from several threads (idle keep-alive connections are shared; ``close()``
closes them). It never logs and never puts the token in an error.
"""

from __future__ import annotations

import base64
import http.client
import json
import random
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Any, BinaryIO, Callable, Iterator

from ._version import __version__
from .config import Config, load
from .errors import APIError, TransportError

# HTTP statuses mapped to gRPC codes for replies that carry no JSON error.
_HTTP_TO_GRPC = {400: 3, 401: 16, 403: 7, 404: 5, 409: 6, 412: 9, 413: 8, 429: 8, 499: 1, 500: 13, 501: 12,
                 502: 14, 503: 14, 504: 4}

TERMINAL_STATES = frozenset({"TASK_STATE_SUCCEEDED", "TASK_STATE_FAILED", "TASK_STATE_CANCELLED",
                             "TASK_STATE_TIMED_OUT"})


def is_terminal(state: str) -> bool:
    """True for a task state after which nothing more happens."""
    return state in TERMINAL_STATES


class Backoff:
    """Exponential backoff with full jitter that gives up once no progress
    was made for ``window`` seconds."""

    def __init__(self, window: float, lo: float = 0.2, hi: float = 5.0) -> None:
        self.window, self.lo, self.hi = window, lo, hi
        self.reset()

    def reset(self) -> None:
        """Start over after progress."""
        self.cur = self.lo
        self.deadline = time.monotonic() + self.window

    def wait(self) -> bool:
        """Sleep before the next try; False means give up."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            return False
        d = min(self.cur / 2 + random.uniform(0, self.cur / 2), left)
        self.cur = min(self.cur * 2, self.hi)
        time.sleep(d)
        return True


_MAX_IDLE = 16


class StreamIdle(TransportError):
    """A stream sent nothing for its idle timeout: the controlplane is
    there, the task is quiet. Following resumes at once."""


class Client:
    """A connection to one controlplane's REST gateway.

    ``Client()`` uses the CLI's current context (or the LEVERS9_*
    environment); pass a :class:`~levers9.config.Config` or a context name to
    choose another.
    """

    def __init__(self, config: Config | None = None, *, context: str | None = None, timeout: float = 30.0,
                 retry_window: float = 60.0) -> None:
        self.config = config if config is not None else load(context)
        self.timeout = timeout
        self.retry_window = retry_window
        self._ssl: ssl.SSLContext | None = None
        if self.config.tls:
            try:
                self._ssl = ssl.create_default_context(cafile=self.config.ca_file or None)
            except (OSError, ssl.SSLError) as e:
                raise TransportError(f"read CA file {self.config.ca_file}: {e}", retryable=False) from None
            self._ssl.minimum_version = ssl.TLSVersion.TLSv1_2
        self._pool_lock = threading.Lock()
        # Idle keep-alive connections, guarded by _pool_lock.
        self._idle: list[http.client.HTTPConnection] = []
        self._closed = False

    def __repr__(self) -> str:
        scheme = "https" if self._ssl else "http"
        return f"<levers9.Client {scheme}://{self.config.rest} context={self.config.context!r}>"

    # --- transport -------------------------------------------------------

    def _connect(self, timeout: float | None) -> http.client.HTTPConnection:
        host, port = self.config.rest_host, self.config.rest_port
        if self._ssl is not None:
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=self._ssl)
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        h = {"Accept": "application/json", "User-Agent": f"levers9-python/{__version__}"}
        if self.config.token:
            h["Authorization"] = "Bearer " + self.config.token
        if extra:
            h.update(extra)
        return h

    def _explain(self, op: str, e: BaseException) -> TransportError:
        """Turn a socket, TLS or HTTP-level failure into advice."""
        addr = self.config.rest
        if isinstance(e, ssl.SSLCertVerificationError):
            return TransportError(
                f"{op}: {addr} has a certificate this machine does not trust ({e.verify_message}): "
                "pass --ca FILE to `levers9 config create` (or set LEVERS9_CONTROLPLANE_CA)", retryable=False)
        if isinstance(e, ssl.SSLError) and ("WRONG_VERSION_NUMBER" in str(e) or "record layer" in str(e)):
            return TransportError(
                f"{op}: {addr} does not speak TLS: create the context without --tls "
                "(or unset LEVERS9_CONTROLPLANE_TLS)", retryable=False)
        if isinstance(e, ConnectionRefusedError):
            return TransportError(
                f"{op}: nothing listens on {addr} (the REST address): is the controlplane running (`make up`) "
                "and the address right (`levers9 config list`; the context's rest key or LEVERS9_REST)?")
        if isinstance(e, (socket.timeout, TimeoutError)):
            return TransportError(f"{op}: no answer from {addr} in time")
        if isinstance(e, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
                          http.client.IncompleteRead)):
            return TransportError(f"{op}: the connection to {addr} was lost")
        if isinstance(e, socket.gaierror):
            return TransportError(f"{op}: cannot resolve {self.config.rest_host}: {e.strerror}")
        if isinstance(e, OSError):
            return TransportError(f"{op}: connect to {addr}: {e.strerror or e}")
        return TransportError(f"{op}: {addr}: {e}")

    def _api_error(self, op: str, status: int, body: bytes) -> Exception:
        """The error for a non-2xx reply."""
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and "code" in doc:
            return APIError(op, int(doc.get("code") or 2), str(doc.get("message", "")), status)
        text = body.decode("utf-8", "replace").strip()
        if status == 400 and "HTTP request to an HTTPS server" in text:
            return TransportError(
                f"{op}: {self.config.rest} wants TLS: recreate the context with --tls "
                "or set LEVERS9_CONTROLPLANE_TLS=true", retryable=False)
        return APIError(op, _HTTP_TO_GRPC.get(status, 2), text[:200] or f"HTTP {status}", status)

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        """An idle kept connection (reused=True) or a new one."""
        with self._pool_lock:
            if self._idle:
                return self._idle.pop(), True
        return self._connect(self.timeout), False

    def _give(self, conn: http.client.HTTPConnection) -> None:
        """Keep a connection for the next call, or close it."""
        with self._pool_lock:
            if not self._closed and len(self._idle) < _MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close the kept connections; calls made later still work, on
        connections closed after each call."""
        with self._pool_lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _once(self, op: str, method: str, path: str, body: bytes | BinaryIO | None,
              headers: dict[str, str]) -> tuple[int, bytes]:
        """One request on a kept connection (a new one when the kept one
        turns out to be closed)."""
        while True:
            conn, reused = self._take()
            try:
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                conn.close()
                if reused and (body is None or isinstance(body, bytes)):
                    continue  # a kept connection the server had closed: again on another
                raise self._explain(op, e) from None
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise self._explain(op, e) from None
            if resp.will_close:
                conn.close()
            else:
                self._give(conn)
            return resp.status, data

    def call(self, op: str, method: str, path: str, *, body: Any = None, query: dict[str, Any] | None = None,
             raw: bytes | BinaryIO | None = None, content_type: str = "", retry: bool = False) -> dict:
        """Call the REST API and return the decoded JSON reply.

        ``body`` is sent as JSON; ``raw`` as it is with ``content_type``.
        With ``retry``, the call is repeated with backoff while the
        controlplane is unreachable or unavailable: pass it only for calls
        that are safe to repeat. A file given as ``raw`` is rewound for
        each try.
        """
        if query:
            path += "?" + urllib.parse.urlencode(query, doseq=True)
        headers = self._headers()
        data: bytes | BinaryIO | None = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        elif raw is not None:
            data = raw
            headers["Content-Type"] = content_type or "application/octet-stream"
            if not isinstance(raw, bytes):
                start = raw.tell()
                raw.seek(0, 2)
                headers["Content-Length"] = str(raw.tell() - start)
                raw.seek(start)
        bo = Backoff(self.retry_window)
        start_pos = data.tell() if data is not None and not isinstance(data, bytes) else 0
        while True:
            if data is not None and not isinstance(data, bytes):
                data.seek(start_pos)
            try:
                status, payload = self._once(op, method, path, data, headers)
                if 200 <= status < 300:
                    return json.loads(payload) if payload.strip() else {}
                err = self._api_error(op, status, payload)
            except TransportError as e:
                err = e
            if not retry or not getattr(err, "retryable", False) or not bo.wait():
                raise err

    def stream(self, op: str, path: str, query: dict[str, Any] | None = None,
               idle_timeout: float = 90.0) -> Iterator[dict]:
        """Open a newline-delimited JSON stream (a server-streaming call) and
        yield each message's ``result``. A ``{"error": ...}`` line raises
        :class:`APIError`; a broken or idle connection raises
        :class:`TransportError` (retryable)."""
        if query:
            path += "?" + urllib.parse.urlencode(query, doseq=True)
        conn = self._connect(idle_timeout)
        try:
            try:
                conn.request("GET", path, headers=self._headers())
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                raise self._explain(op, e) from None
            if resp.status != 200:
                raise self._api_error(op, resp.status, resp.read())
            while True:
                try:
                    line = resp.readline()
                except (socket.timeout, TimeoutError):
                    raise StreamIdle(f"{op}: nothing for {idle_timeout:.0f}s") from None
                except (OSError, http.client.HTTPException) as e:
                    raise self._explain(op, e) from None
                if not line:
                    return
                line = line.strip()
                if not line:
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    raise TransportError(f"{op}: {self.config.rest} sent a line that is not JSON") from None
                if "error" in msg and msg["error"]:
                    e = msg["error"]
                    raise APIError(op, int(e.get("code") or 2), str(e.get("message", "")), 200)
                yield msg.get("result") or {}
        finally:
            conn.close()

    # --- tasks -----------------------------------------------------------

    def submit_task(self, spec: dict, idempotency_key: str = "") -> dict:
        """Queue a task (TaskSpec in protojson form) and return it. With an
        idempotency key, a repeated submit returns the first task, so the
        call is retried while the controlplane is unreachable."""
        body: dict[str, Any] = {"spec": spec}
        if idempotency_key:
            body["idempotencyKey"] = idempotency_key
        resp = self.call("submit task", "POST", "/api/v1/tasks", body=body, retry=bool(idempotency_key))
        return resp.get("task") or {}

    def get_task(self, task_id: str) -> dict:
        """The task with its attempts."""
        return self.call(f"get task {task_id}", "GET", "/api/v1/tasks/" + _seg(task_id), retry=True).get("task") or {}

    def list_tasks(self, page_size: int = 50, page_token: str = "", states: list[str] | None = None) -> dict:
        """One page of the workspace's tasks, newest first: {"tasks", "nextPageToken"}."""
        q: dict[str, Any] = {"pageSize": page_size}
        if page_token:
            q["pageToken"] = page_token
        if states:
            q["states"] = states
        return self.call("list tasks", "GET", "/api/v1/tasks", query=q, retry=True)

    def cancel_task(self, task_id: str) -> dict:
        """Cancel a task (a finished one is returned unchanged)."""
        return self.call(f"cancel task {task_id}", "POST", f"/api/v1/tasks/{_seg(task_id)}/cancel", body={},
                         retry=True).get("task") or {}

    def task_result(self, task_id: str) -> dict:
        """What the task's last attempt wrote to /run/levers9/io/result:
        {"attempt", "present", "result" (bytes), "error"}. NOT_FOUND until
        that attempt ended."""
        resp = self.call(f"get result of task {task_id}", "GET", f"/api/v1/tasks/{_seg(task_id)}/result", retry=True)
        out = dict(resp)
        out["result"] = base64.b64decode(resp.get("result") or "")
        out["present"] = bool(resp.get("present"))
        out["attempt"] = int(resp.get("attempt") or 0)
        out["error"] = resp.get("error") or ""
        return out

    def follow(self, task_id: str, fn: Callable[[dict], None], cursor: str = "", no_wait: bool = False) -> str:
        """Deliver a task's events from ``cursor`` to ``fn``, in order, each
        once, until the terminal state was delivered (or, with ``no_wait``,
        until the events stored so far were). A broken stream is resumed
        from the last cursor; it gives up when the controlplane stays
        unreachable for the retry window. Returns the last cursor."""
        op = f"follow task {task_id}"
        bo = Backoff(self.retry_window)
        while True:
            terminal = progressed = False
            err: Exception | None = None
            try:
                q: dict[str, Any] = {}
                if cursor:
                    q["cursor"] = cursor
                if no_wait:
                    q["noWait"] = "true"
                for ev in self.stream(op, f"/api/v1/tasks/{_seg(task_id)}/events", q):
                    progressed = True
                    cursor = ev.get("cursor") or cursor
                    st = ev.get("state")
                    if st and is_terminal(st.get("taskState", "")):
                        terminal = True
                    fn(ev)
            except (TransportError, APIError) as e:
                err = e
            if err is None and (terminal or no_wait):
                return cursor
            if progressed:
                bo.reset()
            if err is None and not progressed:
                # A clean end with nothing new: the task may have ended
                # before the cursor, or the server cut the stream short.
                if is_terminal(self.get_task(task_id).get("state", "")):
                    return cursor
            if isinstance(err, StreamIdle):
                continue  # reconnect at once from the cursor
            if err is not None and not getattr(err, "retryable", False):
                raise err
            if not bo.wait():
                raise err if err is not None else TransportError(
                    f"{op}: the stream kept ending early (gave up after {self.retry_window:.0f}s)")

    # --- pools, blobs, images ---------------------------------------------

    def list_pools(self) -> list[dict]:
        """The pools with their effective security."""
        return self.call("list pools", "GET", "/api/v1/pools", retry=True).get("pools") or []

    def stat_blob(self, digest: str) -> bool:
        """Whether the workspace's blob store has the blob."""
        return bool(self.call(f"stat blob {digest}", "GET", "/api/v1/blobs/" + _seg(digest), retry=True).get("exists"))

    def put_blob(self, digest: str, data: bytes | BinaryIO) -> None:
        """Upload a blob (its bytes must hash to digest)."""
        self.call(f"upload blob {digest}", "PUT", "/api/v1/blobs/" + _seg(digest), raw=data,
                  content_type="application/octet-stream", retry=True)

    def build_image(self, recipe: bytes, force: bool = False) -> dict:
        """Start an image build (or find it built): {"image", "cached", "joined"}."""
        return self.call("build image", "POST", "/api/v1/images",
                         body={"recipe": base64.b64encode(recipe).decode(), "force": force}, retry=True)

    def get_image(self, image_hash: str) -> dict:
        """An image of the workspace by its recipe hash."""
        return self.call(f"get image {image_hash}", "GET", "/api/v1/images/" + _seg(image_hash), retry=True).get(
            "image") or {}


def _seg(s: str) -> str:
    """Escape a path segment (IDs and digests keep their colons)."""
    return urllib.parse.quote(s, safe=":")
