"""The errors the levers9 SDK raises.

Every error is a :class:`Levers9Error`. None of them ever holds a token:
messages name addresses, task IDs and fields, never credentials.
"""

from __future__ import annotations

# gRPC status codes as the REST gateway reports them in {"code": N}.
GRPC_CODES = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}

UNAVAILABLE = 14
NOT_FOUND = 5


class Levers9Error(Exception):
    """Base class of every error the SDK raises."""


class ConfigError(Levers9Error):
    """The client configuration is missing or wrong (the CLI's contexts file
    or the LEVERS9_* environment)."""


class TransportError(Levers9Error):
    """The controlplane could not be reached or spoke something unexpected
    (connection refused, TLS mismatch, untrusted certificate). The message
    says what to check. ``retryable`` is true when trying again later can
    help."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class APIError(Levers9Error):
    """The controlplane refused or failed a call.

    ``code`` is the gRPC status code (``code_name`` its name, such as
    ``"NOT_FOUND"``), ``http_status`` the HTTP status of the REST reply and
    ``message`` the controlplane's own words.
    """

    def __init__(self, operation: str, code: int, message: str, http_status: int = 0) -> None:
        self.operation = operation
        self.code = code
        self.code_name = GRPC_CODES.get(code, f"CODE_{code}")
        self.message = message
        self.http_status = http_status
        super().__init__(f"{operation}: {message} ({self.code_name.lower().replace('_', ' ')})")

    @property
    def retryable(self) -> bool:
        """True when the same call may succeed later (the controlplane was
        unavailable)."""
        return self.code == UNAVAILABLE

    @property
    def not_found(self) -> bool:
        """True for NOT_FOUND."""
        return self.code == NOT_FOUND


class SecurityEnvError(Levers9Error, ValueError):
    """A function's environment asks for security looser than its pool's, or
    names a value levers9 does not know. Raised before anything is
    submitted."""


class InputTooLargeError(Levers9Error, ValueError):
    """A call's pickled arguments are larger than a task's input may be."""


class ImageBuildError(Levers9Error):
    """An image build failed. ``output`` holds the end of the build's output;
    ``task_id`` is the build task."""

    def __init__(self, message: str, *, output: str = "", task_id: str = "") -> None:
        full = message
        if output:
            full += "\n--- build output (end) ---\n" + output.rstrip("\n")
        super().__init__(full)
        self.output = output
        self.task_id = task_id


class TaskError(Levers9Error):
    """A task ended without a result to return: it was cancelled, timed out,
    lost its machine with no retries left, could not start, was killed at a
    limit, or exited without writing a result. The attributes say which."""

    def __init__(self, message: str, *, task_id: str = "", state: str = "", exit_code: int | None = None,
                 attempts: int = 0) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.state = state
        self.exit_code = exit_code
        self.attempts = attempts


class ResultError(Levers9Error):
    """The remote function ran but its result could not be sent back: the
    return value (or exception) could not be pickled, or it was larger than
    a task's result may be."""


class RemoteError(Levers9Error):
    """An exception raised by the remote function that could not be rebuilt
    here (its class cannot be pickled or is not importable locally).

    ``type_name`` is its class's qualified name, ``message`` its ``str()``
    and ``traceback`` the remote traceback, formatted.
    """

    def __init__(self, type_name: str, message: str, traceback: str = "", *, task_id: str = "") -> None:
        self.type_name = type_name
        self.message = message
        self.traceback = traceback
        self.task_id = task_id
        text = f"{type_name}: {message}" if message else type_name
        if traceback:
            text += "\n\nRemote traceback:\n" + traceback.rstrip("\n")
        super().__init__(text)

    def __reduce__(self):  # keep it picklable with its fields
        return (_rebuild_remote_error, (self.type_name, self.message, self.traceback, self.task_id))


def _rebuild_remote_error(type_name: str, message: str, traceback: str, task_id: str) -> RemoteError:
    return RemoteError(type_name, message, traceback, task_id=task_id)


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a task, attached as the
    ``__cause__`` of the re-raised exception (as concurrent.futures does for
    process pools), so that Python prints it above the local one."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb
