"""A script run as `python mainscript.py`: its function and class live in
__main__ here and in module mainscript in the container, whose
`if __name__ == "__main__":` block must not run."""

import dataclasses
import sys

import levers9

app = levers9.App("sdk-tests-script")


@dataclasses.dataclass
class Point:
    x: int
    y: int


@app.function(cpu=0.25, memory="128Mi")
def shift(p: Point, dx: int) -> Point:
    print(f"shifting in {__name__}")
    return Point(p.x + dx, p.y)


if __name__ == "__main__":
    print("main block ran", file=sys.stderr)
    q = shift.remote(Point(1, 2), 10)
    print(f"result {type(q).__module__}.{type(q).__qualname__} {q.x} {q.y}")
