"""levers9: run Python functions on your own machines.

::

    import levers9

    app = levers9.App("example")

    @app.function(cpu=1, memory="1Gi", retries=2)
    def square(x: int) -> int:
        return x * x

    if __name__ == "__main__":
        print(square.remote(7))                        # 49, computed in a task
        print(list(square.map(range(10), concurrency=4)))

The client reads the levers9 CLI's contexts file (``~/.levers9/config.toml``,
``$LEVERS9_HOME`` moves it) or the ``LEVERS9_*`` environment and speaks the
controlplane's REST gateway. It needs nothing outside Python's standard
library (3.11+). See the README's "Python SDK" section.

What this package must never do: import anything outside the standard
library, log or print a token, or run the caller's ``__main__`` block in a
container. Its public API is what this module exports; it is young:
additions are expected, renames are not.
"""

from ._version import __version__
from .client import Client
from .config import Config, load as load_config
from .errors import (APIError, ConfigError, ImageBuildError, InputTooLargeError, Levers9Error, RemoteError,
                     RemoteTraceback, ResultError, SecurityEnvError, TaskError, TransportError)
from .function import App, Function, FunctionCall, build_image
from .image import Image

__all__ = [
    "__version__",
    "APIError",
    "App",
    "Client",
    "Config",
    "ConfigError",
    "Function",
    "FunctionCall",
    "Image",
    "ImageBuildError",
    "InputTooLargeError",
    "Levers9Error",
    "RemoteError",
    "RemoteTraceback",
    "ResultError",
    "SecurityEnvError",
    "TaskError",
    "TransportError",
    "build_image",
    "load_config",
]
