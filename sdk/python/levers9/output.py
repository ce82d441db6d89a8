"""Printing a followed task as if it ran here.

stdout lines go to the caller's ``sys.stdout``, stderr lines to
``sys.stderr`` (looked up at each line, so ``contextlib.redirect_stdout``
works), and marker lines starting with ``--- `` go to stderr where a new
attempt began or lines were dropped, worded as the Go CLI words them.
"""

from __future__ import annotations

import sys
import threading
from typing import TextIO

# Serialises whole lines from the threads of f.map().
_print_lock = threading.Lock()

_ATTEMPT_END = {"ATTEMPT_STATE_SUCCEEDED", "ATTEMPT_STATE_FAILED", "ATTEMPT_STATE_CANCELLED",
                "ATTEMPT_STATE_TIMED_OUT", "ATTEMPT_STATE_LOST"}


def state_name(state: str) -> str:
    """"TASK_STATE_RUNNING" -> "running" (attempt states likewise)."""
    for prefix in ("TASK_STATE_", "ATTEMPT_STATE_"):
        if state.startswith(prefix):
            return state[len(prefix):].lower()
    return state.lower()


class StreamPrinter:
    """Prints a task's events; one per followed task.

    ``out`` and ``err`` default to the current sys.stdout and sys.stderr;
    ``prefix`` is put before every line (f.map() leaves it empty).
    """

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None, prefix: str = "") -> None:
        self._out, self._err, self.prefix = out, err, prefix
        self.ended: dict[int, str] = {}
        self.last_state: dict | None = None
        self.attempts_seen: set[int] = set()

    def _write(self, stream: TextIO | None, fallback: str, line: str) -> None:
        w = stream if stream is not None else getattr(sys, fallback)
        with _print_lock:
            w.write(self.prefix + line + "\n")
            w.flush()

    def marker(self, text: str) -> None:
        """One marker line on stderr."""
        self._write(self._err, "stderr", "--- " + text)

    def __call__(self, ev: dict) -> None:
        self.event(ev)

    def event(self, ev: dict) -> None:
        """Print one TaskEvent (protojson dict)."""
        attempt = int(ev.get("attempt") or 0)
        if attempt:
            self.attempts_seen.add(attempt)
        log = ev.get("log")
        if log is not None:
            dropped = int(log.get("droppedBefore") or 0)
            if dropped:
                self.marker(f"{dropped} lines dropped here (output came faster than it could be shipped)")
            if log.get("stream") == "LOG_STREAM_STDERR":
                self._write(self._err, "stderr", log.get("text", ""))
            else:
                self._write(self._out, "stdout", log.get("text", ""))
            return
        mounts = ev.get("mounts")
        if mounts is not None:
            for f in mounts.get("findings") or []:
                self.marker(f"volume {f.get('volume')} at {f.get('path')}: {f.get('reason')}; "
                            "worker.volumeMountValidation log let it through, enforce would refuse it")
            return
        st = ev.get("state")
        if st is None:
            return
        self.last_state = st
        if st.get("newAttempt"):
            prev = attempt - 1
            how = self.ended.get(prev) or "ended"
            machine = st.get("machineId") or "(not placed yet)"
            self.marker(f"attempt {attempt} on machine {machine} (attempt {prev} {how})")
        astate = st.get("attemptState", "")
        if astate in _ATTEMPT_END:
            how = state_name(astate)
            msg = st.get("message") or ""
            lead = f"attempt {attempt} {how}: "
            if msg.startswith(lead):
                msg = msg[len(lead):]
            if msg.endswith("; retrying"):
                msg = msg[: -len("; retrying")]
            if msg:
                how += ": " + msg
            self.ended[attempt] = how


class Collector:
    """Keeps the last ``max_lines`` output lines of a task (both streams),
    for error messages, and passes every event on to ``then``."""

    def __init__(self, then=None, max_lines: int = 60) -> None:
        self.then = then
        self.max_lines = max_lines
        self.lines: list[str] = []

    def __call__(self, ev: dict) -> None:
        log = ev.get("log")
        if log is not None:
            self.lines.append(log.get("text", ""))
            if len(self.lines) > self.max_lines:
                del self.lines[: len(self.lines) - self.max_lines]
        if self.then is not None:
            self.then(ev)

    def text(self) -> str:
        """The kept lines, newline-terminated."""
        return "".join(line + "\n" for line in self.lines)
