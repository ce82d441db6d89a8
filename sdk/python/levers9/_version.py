"""The SDK's version (the package's, in pyproject.toml too)."""

__version__ = "0.1.0"
