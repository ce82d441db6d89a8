"""``python -m levers9``: the CLI's task listing and log following, for
notebooks and machines without the Go CLI.

    python -m levers9 tasks [--state running,failed] [--limit 50] [-o json]
    python -m levers9 logs ID [--no-wait]

``logs`` prints the task's stdout to stdout and stderr to stderr, with a
marker where a new attempt began, follows it to its end and exits with its
exit code (124 when it timed out, 1 with a message when it ended without
one); ``--no-wait`` prints what the task wrote so far and exits 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import Sequence

from .client import Client, is_terminal
from .errors import Levers9Error
from .output import StreamPrinter, state_name

_STATES = ("pending", "scheduled", "running", "succeeded", "failed", "cancelled", "timed_out")


def _when(ts: str | None) -> str:
    if not ts:
        return "-"
    try:
        t = datetime.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return ts
    return t.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _command_text(argv: Sequence[str], limit: int) -> str:
    parts = []
    for s in argv:
        if s == "" or any(c in s for c in " \t\n'\"\\$`"):
            s = "'" + s.replace("'", "'\\''") + "'"
        parts.append(s)
    out = " ".join(parts)
    if limit and len(out) > limit:
        out = out[: limit - 1] + "…"
    return out


def _exit_text(t: dict) -> str:
    st = t.get("state", "")
    if not is_terminal(st) or st == "TASK_STATE_CANCELLED" or t.get("exitCode") is None:
        return "-"
    return str(t["exitCode"])


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [c.ljust(widths[i]) if i < len(r) - 1 else c for i, c in enumerate(r)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def cmd_tasks(c: Client, args: argparse.Namespace) -> int:
    """List the workspace's tasks, newest first."""
    states: list[str] = []
    for v in args.state or []:
        for s in v.split(","):
            s = s.strip().lower()
            if not s:
                continue
            if s not in _STATES:
                raise SystemExit(f"levers9: --state {s!r}: want one of {', '.join(_STATES)}")
            states.append("TASK_STATE_" + s.upper())
    if args.limit < 1:
        raise SystemExit(f"levers9: --limit {args.limit}: want 1 or more")
    tasks: list[dict] = []
    token = ""
    while len(tasks) < args.limit:
        page = c.list_tasks(min(args.limit - len(tasks), 500), token, states)
        got = page.get("tasks") or []
        tasks += got
        token = page.get("nextPageToken") or ""
        if not token or not got:
            break
    tasks = tasks[: args.limit]
    if args.output == "json":
        json.dump({"tasks": tasks}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    rows = [["ID", "STATE", "POOL", "IMAGE", "ATTEMPTS", "EXIT", "CREATED", "COMMAND"]]
    for t in tasks:
        sp = t.get("spec") or {}
        rows.append([t.get("id", ""), state_name(t.get("state", "")), sp.get("pool") or "-", sp.get("image") or "-",
                     str(len(t.get("attempts") or [])), _exit_text(t), _when(t.get("createdAt")),
                     _command_text(sp.get("command") or [], 60)])
    sys.stdout.write(_table(rows))
    return 0


def exit_code_for(t: dict) -> tuple[int, str]:
    """The process exit for a finished task, as `levers9 task logs -f`:
    its exit code, 124 for a timeout, 1 with a message otherwise."""
    st = t.get("state", "")
    attempts = t.get("attempts") or []
    last = attempts[-1] if attempts else {}
    why = last.get("summary") or t.get("message") or last.get("message") or ""
    if st == "TASK_STATE_SUCCEEDED":
        return 0, ""
    if st == "TASK_STATE_TIMED_OUT":
        return 124, f"task {t.get('id')} timed out" + (f": {why}" if why else "")
    code = t.get("exitCode")
    if st == "TASK_STATE_FAILED" and code is not None and 0 < int(code) < 256:
        return int(code), (f"task {t.get('id')}: {last['summary']}" if last.get("summary") else "")
    return 1, f"task {t.get('id')} ended {state_name(st)}" + (f": {why}" if why else "")


def cmd_logs(c: Client, args: argparse.Namespace) -> int:
    """Print a task's output, following it to its end."""
    printer = StreamPrinter()
    c.follow(args.id, printer, no_wait=args.no_wait)
    if args.no_wait:
        return 0
    code, msg = exit_code_for(c.get_task(args.id))
    if msg:
        print(f"levers9: {msg}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return its exit code."""
    p = argparse.ArgumentParser(prog="python -m levers9", description=__doc__.split("\n\n")[0])
    p.add_argument("--context", help="the CLI context to use (default: LEVERS9_CONTEXT, then the current one)")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tasks", help="list the workspace's tasks, newest first")
    t.add_argument("--state", action="append", help="only tasks in these states (repeatable or comma-separated): "
                   + ", ".join(_STATES))
    t.add_argument("--limit", type=int, default=50, help="show at most this many tasks (default 50)")
    t.add_argument("-o", "--output", choices=("table", "json"), default="table")
    lg = sub.add_parser("logs", help="print a task's output, follow it to its end, exit with its exit code")
    lg.add_argument("id", help="the task ID (t_...)")
    lg.add_argument("--no-wait", action="store_true", help="print what the task wrote so far and exit")
    args = p.parse_args(argv)
    try:
        with Client(context=args.context) as c:
            if args.cmd == "tasks":
                return cmd_tasks(c, args)
            return cmd_logs(c, args)
    except Levers9Error as e:
        print(f"levers9: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if args.cmd == "logs":
            print(f"levers9: stopped following; the task keeps running (python -m levers9 logs {args.id})",
                  file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
