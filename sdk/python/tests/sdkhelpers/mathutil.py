"""Arithmetic the test functions do remotely (a local module shipped with them)."""


def square(x: int) -> int:
    """x squared."""
    return x * x
