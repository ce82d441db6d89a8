"""Apps and remote functions: ``@app.function(...)``, ``.remote()``, ``.map()``, ``.spawn()``.

A call goes:

1. check (before anything is uploaded, built or submitted): the security
   variables of the function's env against its pool, the call's pickled
   size against the task input limit;
2. image: the function's image (a reference or a :class:`levers9.Image`)
   plus a copy step of its code bundle (:mod:`levers9.bundle`) to
   /opt/levers9/code, built through the controlplane's recipe builds (the
   bundle uploaded once per content; a build already done returns at once;
   otherwise its output is printed to stderr). The built reference is kept
   for the process;
3. submit: a task running ``python3 -m levers9._container`` with the
   pickled call as its input and an idempotency key, so a submit retried
   after a lost reply never runs twice;
4. follow: the task's output printed as it happens (a marker where a new
   attempt began), resumed across dropped connections;
5. result: the last attempt's pickled outcome: the value is returned, an
   exception re-raised with the remote traceback as its ``__cause__``.

Functions, apps and handles are safe to use from several threads.
"""

from __future__ import annotations

import base64
import concurrent.futures
import functools
import itertools
import math
import os
import re
import secrets as _secrets
import sys
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Mapping

from . import bundle as _bundle
from . import security, wire
from .client import Client
from .errors import (APIError, ImageBuildError, InputTooLargeError, RemoteError, RemoteTraceback, ResultError,
                     TaskError)
from .image import Image, marshal
from .output import Collector, StreamPrinter, state_name
from .tarball import tar_source

DEFAULT_RETRIES = 2
DEFAULT_CONCURRENCY = 8
MAX_COPY_BYTES = 512 << 20

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_MEMORY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)$")
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}


def parse_memory(v: int | str) -> int:
    """A size like "512Mi", "4Gi", "1.5G" or a number of bytes, as the CLI
    reads --memory (units case-insensitive; Ki/Mi/Gi/Ti binary, K/M/G/T
    decimal)."""
    if isinstance(v, bool):
        raise ValueError(f"{v!r}: want a size like 512Mi, 4Gi or 1048576 (bytes)")
    if isinstance(v, int):
        n = v
    else:
        m = _MEMORY.match(str(v).strip())
        unit = None
        if m:
            u = m.group(2)
            unit = _UNITS.get(u.removesuffix("B").removesuffix("b").lower())
            if unit is None and u:
                unit = _UNITS.get(u.lower())
        if not m or unit is None:
            raise ValueError(f"{v!r}: want a size like 512Mi, 4Gi or 1048576 (bytes)")
        n = int(float(m.group(1)) * unit)
    if n < (1 << 20) or n > (1 << 60):
        raise ValueError(f"{v!r}: want between 1Mi and 1Ei")
    return n


# Built image references per process: recipe JSON (with blobs) -> ref.
_built: dict[tuple[str, bytes], str] = {}
_built_lock = threading.Lock()
_build_locks: dict[tuple[str, bytes], threading.Lock] = {}


class App:
    """A named group of functions sharing a client.

    ``App("name")`` uses the CLI's current context (or LEVERS9_* env) when
    the first call is made; pass ``client=`` or ``context=`` to choose.
    Declaring functions needs no controlplane.
    """

    def __init__(self, name: str, *, client: Client | None = None, context: str | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("levers9.App: a name is required")
        self.name = name
        self._client = client
        self._context = context
        self._lock = threading.Lock()
        self._pools: dict[str, dict | None] | None = None
        self.functions: dict[str, Function] = {}

    def __repr__(self) -> str:
        return f"levers9.App({self.name!r}, functions={sorted(self.functions)})"

    @property
    def client(self) -> Client:
        """The client, made from the CLI config on first use."""
        with self._lock:
            if self._client is None:
                self._client = Client(context=self._context)
            return self._client

    @client.setter
    def client(self, c: Client) -> None:
        """Point the app's functions at another controlplane."""
        with self._lock:
            self._client = c
            self._pools = None

    def pool_security(self, pool: str) -> dict | None:
        """The effective security settings of a pool (None when the
        controlplane does not list it), read once per app."""
        with self._lock:
            pools = self._pools
        if pools is None:
            listed = self.client.list_pools()
            pools = {p.get("name", ""): p.get("security") or {} for p in listed}
            with self._lock:
                self._pools = pools
        return pools.get(pool)

    def function(self, fn: Callable | None = None, *, image: str | Image | None = None, gpu: int = 0,
                 gpu_type: str = "", cpu: float | None = None, memory: int | str | None = None, pool: str = "",
                 timeout: float | None = None, retries: int = DEFAULT_RETRIES,
                 env: Mapping[str, str] | None = None, secrets: Iterable[str] = (),
                 volumes: Mapping[str, str] | None = None) -> Any:
        """Declare a remote function (a decorator, with or without options).

        ``image``: a reference or a :class:`levers9.Image` (default: the
        runner image, Debian with Python 3.11). ``gpu``/``gpu_type``: whole
        GPUs, of a type. ``cpu``: cores (0.5 is half). ``memory``: bytes or
        "4Gi". ``pool``: default "default". ``timeout``: seconds per attempt.
        ``retries``: new attempts when the machine is lost (default 2).
        ``env``: environment variables (``LEVERS9_SECURITY_PROFILE`` and
        ``LEVERS9_SECCOMP`` may only tighten the pool's security).
        ``secrets``: workspace secret names whose keys become variables.
        ``volumes``: ``{"/data": "volume-name"}`` mounts, read-write.

        Every problem with the options is reported at once as ValueError.
        """
        opts = dict(image=image, gpu=gpu, gpu_type=gpu_type, cpu=cpu, memory=memory, pool=pool, timeout=timeout,
                    retries=retries, env=env, secrets=secrets, volumes=volumes)

        def wrap(f: Callable) -> Function:
            func = Function(self, f, **opts)
            self.functions[func.__qualname__] = func
            return func

        if fn is not None:
            return wrap(fn)
        return wrap


class Function:
    """A function that runs in a task. Calling it directly runs it here;
    ``.remote()`` runs it on the pool."""

    def __init__(self, app: App, fn: Callable, *, image: str | Image | None, gpu: int, gpu_type: str,
                 cpu: float | None, memory: int | str | None, pool: str, timeout: float | None, retries: int,
                 env: Mapping[str, str] | None, secrets: Iterable[str], volumes: Mapping[str, str] | None) -> None:
        if not callable(fn):
            raise TypeError(f"app.function: {fn!r} is not callable")
        functools.update_wrapper(self, fn)
        self.app = app
        self.local_function = fn
        self.name = f"{app.name}.{fn.__qualname__}"
        self._lock = threading.Lock()
        self._bundle: _bundle.Bundle | None = None
        problems: list[str] = []
        spec: dict[str, Any] = {}
        if isinstance(image, Image):
            problems += [f"image: {p}" for p in image.problems()]
            self.image = image
        elif image is None:
            self.image = Image()
        elif isinstance(image, str) and image:
            self.image = Image(image)
        else:
            problems.append(f"image: {image!r} is neither an image reference nor a levers9.Image")
            self.image = Image()
        if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0:
            problems.append(f"gpu: {gpu!r} is not a count of GPUs")
        elif gpu:
            spec["gpus"] = gpu
        if gpu_type:
            if not gpu:
                problems.append(f"gpu_type: {gpu_type!r} without a GPU count")
            spec["gpuType"] = gpu_type
        if cpu is not None:
            try:
                m = round(float(cpu) * 1000)
                if math.isnan(float(cpu)) or m < 1 or m > 2**31 - 1:
                    raise ValueError
                spec["cpuMillis"] = str(m)
            except (TypeError, ValueError, OverflowError):
                problems.append(f"cpu: {cpu!r} cores is not between 0.001 and {(2**31 - 1) // 1000}")
        if memory is not None:
            try:
                spec["memoryBytes"] = str(parse_memory(memory))
            except ValueError as e:
                problems.append(f"memory: {e}")
        self.pool = pool or "default"
        if pool:
            spec["pool"] = pool
        if timeout is not None:
            if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout < 0 or math.isnan(timeout):
                problems.append(f"timeout: {timeout!r} is not a number of seconds")
            elif timeout > 0:
                spec["timeout"] = f"{timeout:.9f}".rstrip("0").rstrip(".") + "s"
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            problems.append(f"retries: {retries!r} is not a count")
        else:
            spec["retries"] = retries
        self.env: dict[str, str] = {}
        for k, v in (env or {}).items():
            if not isinstance(k, str) or not _ENV_KEY.match(k):
                problems.append(f"env: {k!r} is not a variable name (letters, digits and _, not starting with a digit)")
            elif not isinstance(v, str):
                problems.append(f"env[{k}]: the value must be a string")
            else:
                self.env[k] = v
        for k in security.INHERITED:
            if k not in self.env and os.environ.get(k):
                self.env[k] = os.environ[k]
        if isinstance(secrets, str):
            secrets = [secrets]
        names: list[str] = []
        for s in secrets:
            if not isinstance(s, str) or not _SECRET.match(s):
                problems.append(f"secrets: {s!r} is not a secret name (1-63 letters, digits, '.', '_' or '-', "
                                "starting with a letter or digit)")
            elif s not in names:
                names.append(s)
        if names:
            spec["secrets"] = names
        vols = []
        for path, vol in (volumes or {}).items():
            if not isinstance(path, str) or not path.startswith("/"):
                problems.append(f"volumes: {path!r} is not an absolute container path")
            elif not isinstance(vol, str) or not vol:
                problems.append(f"volumes[{path}]: want a volume name")
            else:
                vols.append({"name": vol, "path": path, "readOnly": False})
        if vols:
            spec["volumes"] = vols
        if problems:
            raise ValueError(f"function {self.name}: " + "; ".join(problems))
        security.check_values(self.env, where=f"function {self.name}: env")
        self._spec = spec

    def __repr__(self) -> str:
        return f"<levers9.Function {self.name}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function here, in this process."""
        return self.local_function(*args, **kwargs)

    def local(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function here, in this process."""
        return self.local_function(*args, **kwargs)

    def __reduce__(self) -> Any:
        # Pickled by reference, as a plain function is.
        return (_lookup, (self.__module__, self.__qualname__))

    # --- calls -----------------------------------------------------------

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function in a task and return its return value, or raise
        its exception (with the remote traceback as ``__cause__``). Output
        streams to this process's stdout and stderr as it happens."""
        call = self.spawn(*args, **kwargs)
        try:
            return call.get()
        except KeyboardInterrupt:
            # As `levers9 run` does on Ctrl-C: nobody waits for it any more.
            _quiet_cancel(self, call.task_id)
            raise

    def spawn(self, *args: Any, **kwargs: Any) -> "FunctionCall":
        """Submit the call and return at once with a handle; ``.get()``
        waits for the result (and prints the task's output)."""
        b = self._code()
        payload = self._payload(b, args, kwargs)
        security.check_against_pool(self.env, self.pool, self.app.pool_security(self.pool),
                                    where=f"function {self.name}: env")
        ref = self._image_ref(b)
        spec = dict(self._spec)
        spec["image"] = ref
        spec["command"] = ["python3", "-m", "levers9._container"]
        env = dict(self.env)
        env["PYTHONPATH"] = _bundle.CODE_DIR + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("PYTHONUNBUFFERED", "1")
        spec["env"] = env
        spec["input"] = base64.b64encode(payload).decode()
        key = idempotency_key(self.name)
        task = self.app.client.submit_task(spec, key)
        return FunctionCall(self, task.get("id", ""), b)

    def map(self, *iterables: Iterable[Any], concurrency: int = DEFAULT_CONCURRENCY,
            return_exceptions: bool = False) -> Iterator[Any]:
        """Call the function once per input (one argument from each
        iterable, as the built-in map) with at most ``concurrency`` tasks
        at once, and yield the results in input order (calls start as the
        iteration starts, and inputs are read a few ahead). An exception
        ends the map (tasks still running are cancelled, as they are when
        the iteration is abandoned), unless ``return_exceptions`` yields it
        in its place."""
        if concurrency < 1:
            raise ValueError(f"map: concurrency {concurrency} is not 1 or more")
        if not iterables:
            raise TypeError("map: needs at least one iterable")
        return _map(self, zip(*iterables), concurrency, return_exceptions)

    # --- the steps of a call ----------------------------------------------

    def _code(self) -> _bundle.Bundle:
        """The function's code bundle, packed on first use."""
        with self._lock:
            if self._bundle is None:
                self._bundle = _bundle.build(sys.modules[self.__module__])
            return self._bundle

    def _payload(self, b: _bundle.Bundle, args: tuple, kwargs: dict) -> bytes:
        try:
            inner = wire.dumps((args, kwargs))
        except Exception as e:
            raise TypeError(f"function {self.name}: its arguments cannot be pickled: {e}") from e
        payload = wire.dumps({"levers9": wire.VERSION, "module": b.module, "qualname": self.__qualname__,
                              "main": b.main, "call": inner})
        if len(payload) > wire.MAX_INPUT_BYTES:
            raise InputTooLargeError(
                f"function {self.name}: the call's arguments are {wire.size_text(len(payload))} pickled, more than "
                f"the {wire.size_text(wire.MAX_INPUT_BYTES)} a task's input may be (put large data in a volume "
                "and pass its path)")
        return payload

    def _image_ref(self, b: _bundle.Bundle) -> str:
        """The built image for this function's image plus its code."""
        return build_image(self.app.client, self.image, extra_copy=(b.data, b.digest, _bundle.CODE_DIR))

    def _modmap(self, b: _bundle.Bundle) -> dict[str, str] | None:
        return {b.module: "__main__"} if b.main else None


def _lookup(module: str, qualname: str) -> Any:
    obj: Any = __import__(module, fromlist=["_"])
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def idempotency_key(name: str) -> str:
    """A fresh key labelled with name, as the Go SDK makes them."""
    label = re.sub(r"[^A-Za-z0-9._-]", "-", name)[:80]
    rand = base64.b32encode(_secrets.token_bytes(20)).decode().rstrip("=").lower()
    return f"py-{label}-{rand}"


class FunctionCall:
    """A submitted call. ``task_id`` names its task; ``get()`` waits."""

    def __init__(self, function: Function, task_id: str, b: _bundle.Bundle) -> None:
        self.function = function
        self.task_id = task_id
        self._bundle = b
        self._lock = threading.Lock()
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def __repr__(self) -> str:
        return f"<levers9.FunctionCall {self.function.name} task {self.task_id}>"

    def cancel(self) -> None:
        """Cancel the task (a finished one stays as it was)."""
        self.function.app.client.cancel_task(self.task_id)

    def get(self, *, output: bool = True) -> Any:
        """Wait for the task to end and return the function's value, or
        raise its exception. With ``output`` (default), the task's output is
        printed to this process's stdout and stderr as it comes."""
        with self._lock:
            if not self._done:
                try:
                    self._value = self._wait(output)
                except BaseException as e:
                    self._error = e
                self._done = True
        if self._error is not None:
            raise self._error
        return self._value

    def _wait(self, output: bool) -> Any:
        c = self.function.app.client
        printer = StreamPrinter() if output else None
        collect = Collector(printer)
        c.follow(self.task_id, collect)
        task = c.get_task(self.task_id)
        res = _result_of(c, self.task_id)
        if not res["present"]:
            raise _task_error(self.function.name, task, res.get("error", ""), collect.text())
        outer = wire.loads(res["result"])
        if outer.get("ok"):
            try:
                return wire.loads(outer["value"], self.function._modmap(self._bundle))
            except Exception as e:
                raise ResultError(f"function {self.function.name}: task {self.task_id} returned a value that cannot "
                                  f"be unpickled here: {type(e).__name__}: {e}") from None
        raise _remote_exception(self.function, self._bundle, self.task_id, outer)


def _result_of(c: Client, task_id: str, patience: float = 3.0) -> dict:
    """The task's result; a NOT_FOUND shortly after the end is asked again
    (the record may trail the terminal event), then means none."""
    deadline = time.monotonic() + patience
    while True:
        try:
            return c.task_result(task_id)
        except APIError as e:
            if not e.not_found:
                raise
            if time.monotonic() >= deadline:
                return {"present": False, "error": "", "result": b"", "attempt": 0}
        time.sleep(0.3)


def _remote_exception(fn: Function, b: _bundle.Bundle, task_id: str, outer: dict) -> BaseException:
    tb = outer.get("traceback") or ""
    exc: BaseException | None = None
    if outer.get("exc") is not None:
        try:
            exc = wire.loads(outer["exc"], fn._modmap(b))
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        return RemoteError(outer.get("type") or "Exception", outer.get("message") or "", tb, task_id=task_id)
    exc.__cause__ = RemoteTraceback('\n"""\n' + tb.rstrip("\n") + '\n"""')
    if hasattr(exc, "add_note"):
        exc.add_note(f"(raised remotely by {fn.name} in levers9 task {task_id})")
    return exc


def _task_error(name: str, task: dict, result_error: str, output: str) -> TaskError:
    """Why a task gave no result, in one sentence (as the Go SDK's TaskError)."""
    tid = task.get("id", "")
    state = task.get("state", "")
    attempts = task.get("attempts") or []
    last = attempts[-1] if attempts else {}
    exit_code = task.get("exitCode")
    exit_code = int(exit_code) if exit_code is not None else None
    on = f" on machine {last['machineId']}" if last.get("machineId") else ""
    msg = task.get("message") or last.get("message") or ""
    summary = last.get("summary") or ""
    reason = last.get("reason") or "FAILURE_REASON_UNSPECIFIED"
    head = f"function {name}: task {tid} "
    if result_error:
        text = head + f"ran, but its result could not be returned: {result_error}"
    elif state == "TASK_STATE_FAILED" and summary and reason in (
            "FAILURE_REASON_START_FAILED", "FAILURE_REASON_IMAGE_NOT_FOUND", "FAILURE_REASON_IMAGE_PULL_FAILED",
            "FAILURE_REASON_MOUNT_FAILED", "FAILURE_REASON_NETWORK_FAILED"):
        text = head + f"could not start{on}: {summary}"
    elif state == "TASK_STATE_FAILED" and summary and reason != "FAILURE_REASON_UNSPECIFIED":
        text = head + f"was killed{on} (exit code {exit_code}): {summary}"
    elif state == "TASK_STATE_CANCELLED":
        text = head + "was cancelled" + (f": {msg}" if msg else "")
    elif state == "TASK_STATE_TIMED_OUT":
        t = (task.get("spec") or {}).get("timeout")
        text = head + (f"timed out after {t}" if t else "timed out")
    elif last.get("state") == "ATTEMPT_STATE_LOST":
        text = head + f"lost its machine on attempt {len(attempts)} with no retries left"
    elif state == "TASK_STATE_FAILED" and exit_code:
        text = head + f"exited with code {exit_code} without a result" + (f": {msg}" if msg else "")
    elif state == "TASK_STATE_SUCCEEDED":
        text = head + "succeeded without writing a result (is the image's python3 running levers9._container?)"
    else:
        text = head + f"ended {state_name(state) or 'without a state'}" + (f": {msg}" if msg else "")
    if output and state == "TASK_STATE_FAILED" and not summary:
        text += "\n--- task output (end) ---\n" + output.rstrip("\n")
    return TaskError(text, task_id=tid, state=state, exit_code=exit_code, attempts=len(attempts))


def build_image(client: Client, image: Image, extra_copy: tuple[bytes, str, str] | None = None,
                force: bool = False) -> str:
    """Build an Image (plus, with extra_copy = (tar bytes, digest, dst), a
    last copy step of that tar) and return its reference. Copy sources are
    packed and uploaded once per content; the built reference is kept for
    the process."""
    steps = list(image.steps)
    blobs: dict[int, str] = {}
    for i, s in enumerate(steps):
        if s.copy_dst:
            blobs[i] = _upload_source(client, s.copy_src, i)
    recipe = image.recipe(blobs)
    if extra_copy is not None:
        data, digest, dst = extra_copy
        _upload(client, digest, data, "the function's code")
        recipe.setdefault("steps", []).append({"copy": {"src": "levers9-code", "dst": dst, "blob": digest}})
    problems = image.problems()
    if problems:
        raise ValueError("image recipe: " + "; ".join(problems))
    body = marshal(recipe)
    key = (client.config.rest, body)
    with _built_lock:
        if not force and key in _built:
            return _built[key]
        lock = _build_locks.setdefault(key, threading.Lock())
    with lock:
        with _built_lock:
            if not force and key in _built:
                return _built[key]
        ref = _build(client, body, force)
        with _built_lock:
            _built[key] = ref
        return ref


def _upload(client: Client, digest: str, data: Any, what: str) -> None:
    if client.stat_blob(digest):
        return
    client.put_blob(digest, data)


def _upload_source(client: Client, src: str, index: int) -> str:
    import tempfile

    with tempfile.TemporaryFile(prefix="levers9-copy-") as f:
        try:
            digest, size = tar_source(src, f, MAX_COPY_BYTES)
        except (OSError, ValueError) as e:
            raise ValueError(f"image recipe: steps[{index}]: copy {src}: {e}") from None
        if not client.stat_blob(digest):
            print(f"levers9: uploading {src} ({size} bytes)", file=sys.stderr)
            f.seek(0)
            client.put_blob(digest, f)
        return digest


def _build(client: Client, body: bytes, force: bool) -> str:
    resp = client.build_image(body, force)
    img = resp.get("image") or {}
    h = img.get("hash", "")
    short = h.removeprefix("sha256:")[:12]
    if resp.get("cached") and img.get("state") == "IMAGE_STATE_READY" and img.get("ref"):
        return img["ref"]
    tid = img.get("taskId", "")
    if resp.get("joined"):
        print(f"levers9: following the build of image {short} already running (task {tid})", file=sys.stderr)
    else:
        print(f"levers9: building image {short} in task {tid} ({img.get('cachedSteps', 0)} of "
              f"{img.get('steps', 0)} steps cached)", file=sys.stderr)
    # Build output goes to stderr: stdout is the functions' own.
    collect = Collector(StreamPrinter(out=_Stderr(), err=_Stderr()))
    err: BaseException | None = None
    if tid:
        try:
            client.follow(tid, collect)
        except Exception as e:  # the image record still says how it ended
            err = e
    final = client.get_image(h)
    if final.get("state") == "IMAGE_STATE_READY" and final.get("ref"):
        return final["ref"]
    if err is not None and final.get("state") == "IMAGE_STATE_BUILDING":
        raise err
    raise ImageBuildError(f"image {short}: build failed: {final.get('error') or state_name(final.get('state', ''))}",
                          output=collect.text(), task_id=tid)


class _Stderr:
    """sys.stderr as it is at each write."""

    def write(self, s: str) -> int:
        return sys.stderr.write(s)

    def flush(self) -> None:
        sys.stderr.flush()


class _Batch:
    """The tasks a map() has in flight, to cancel them when it stops early."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: set[str] = set()
        self.stopped = False


def _map(fn: Function, inputs: Iterator[tuple], concurrency: int, return_exceptions: bool) -> Iterator[Any]:
    batch = _Batch()

    def one(args: tuple) -> Any:
        with batch.lock:
            if batch.stopped:
                raise concurrent.futures.CancelledError()
        call = fn.spawn(*args)
        with batch.lock:
            batch.running.add(call.task_id)
            stopped = batch.stopped
        if stopped:
            _quiet_cancel(fn, call.task_id)
        try:
            return call.get()
        finally:
            with batch.lock:
                batch.running.discard(call.task_id)

    ex = concurrent.futures.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="levers9-map")
    window: list[concurrent.futures.Future] = []
    it = iter(inputs)
    ok = False
    try:
        for args in itertools.islice(it, concurrency * 2):
            window.append(ex.submit(one, args))
        while window:
            fut = window.pop(0)
            nxt = next(it, _END)
            if nxt is not _END:
                window.append(ex.submit(one, nxt))
            try:
                value = fut.result()
            except Exception as e:
                if not return_exceptions:
                    raise
                value = e
            yield value
        ok = True
    finally:
        if not ok:
            with batch.lock:
                batch.stopped = True
                running = list(batch.running)
            for f in window:
                f.cancel()
            for tid in running:
                _quiet_cancel(fn, tid)
        ex.shutdown(wait=ok, cancel_futures=True)


_END = object()


def _quiet_cancel(fn: Function, task_id: str) -> None:
    try:
        fn.app.client.cancel_task(task_id)
    except Exception:
        pass
