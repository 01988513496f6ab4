"""The package type-checks: mypy (configured in pyproject.toml's [tool.mypy]) runs on autoconfig/
and every error it reports must be one the baseline accepts (tests/mypy_baseline.txt). An error
is matched by its file and message, not its line, so edits above it do not break the match; an
error that appears more often than the baseline lists it is a new one.

After fixing accepted errors (the second test fails until the baseline drops them), rewrite the
baseline with `python tests/test_typing.py --write-baseline` and read its diff: it should only
lose lines."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASELINE = Path(__file__).with_name("mypy_baseline.txt")
ERROR = re.compile(r"^(?P<path>[^:\s]+\.py):(?P<line>\d+): error: (?P<message>.+)$")
# numpy's stubs spell an array's parameters differently from release to release
# (ndarray[Any, dtype[Any]], ndarray[tuple[Any, ...], dtype[Any]], ...): matched as plain ndarray.
ARRAY = re.compile(r"ndarray\[")

# Both tests read one mypy run: on one xdist worker, which runs it once.
pytestmark = pytest.mark.xdist_group("mypy")


def run_mypy() -> list[str]:
    """The errors mypy reports on the package, each as 'path: message  [code]'."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-pretty", "--no-error-summary", "--no-color-output"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode not in (0, 1):  # 2: mypy itself failed (bad configuration, a crash)
        raise RuntimeError(f"mypy exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    errors = [ERROR.match(line) for line in done.stdout.splitlines()]
    return sorted(f"{m['path']}: {plain_arrays(m['message'])}" for m in errors if m)


def plain_arrays(message: str) -> str:
    """`message` with every ndarray[...] (brackets balanced) written as ndarray."""
    while found := ARRAY.search(message):
        depth, end = 0, found.end() - 1
        for end in range(found.end() - 1, len(message)):
            depth += {"[": 1, "]": -1}.get(message[end], 0)
            if depth == 0:
                break
        message = message[: found.start()] + "ndarray" + message[end + 1 :]
    return message


def read_baseline() -> Counter[str]:
    lines = BASELINE.read_text().splitlines()
    return Counter(line for line in lines if line.strip() and not line.startswith("#"))


@pytest.fixture(scope="module")
def reported() -> Counter[str]:
    return Counter(run_mypy())


def test_mypy_reports_no_error_beyond_the_baseline(reported) -> None:
    new = reported - read_baseline()
    assert not new, "new type errors (fix them; mypy prints their lines):\n" + "\n".join(
        sorted(new.elements())
    )


def test_the_baseline_lists_only_errors_that_remain(reported) -> None:
    fixed = read_baseline() - reported
    assert not fixed, (
        "errors fixed but still accepted (python tests/test_typing.py --write-baseline):\n"
        + "\n".join(sorted(fixed.elements()))
    )


def write_baseline() -> None:
    header = (
        "# mypy errors accepted for now, one per line as 'file: message  [code]' (no line\n"
        "# numbers). tests/test_typing.py fails on any other; fix an error rather than add it.\n"
    )
    BASELINE.write_text(header + "".join(f"{line}\n" for line in run_mypy()))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-baseline"]:
        sys.exit("usage: python tests/test_typing.py --write-baseline")
    write_baseline()
