"""Keeps the command outputs README.md quotes in step with what the commands print now.

    python scripts/readme_examples.py           # rewrites README's quoted outputs in place
    python scripts/readme_examples.py --check   # README untouched; exit 1 with a diff if stale
    python scripts/readme_examples.py --print   # prints the outputs, README untouched

Each quoted output in README is a code fence between `<!-- example: NAME -->` and
`<!-- /example -->` (HTML comments: invisible when rendered). NAME is an entry of EXAMPLES,
which says which command of README's ```bash blocks to run and which lines of its stdout
README shows. The command is read from README itself, so a command edited there is the one
that runs. It runs in this process through the entry point's own function
(`autoconfig.cli.app.execute`), in a scratch folder (for its `--out`), on a wide terminal:
the lines come out whole, as on a wide screen, not wrapped at the 160 columns of a pipe.
Source citations inside parentheses ("; Brown et al. 2020, Table 2.1; ...") are shortened
to "; ..." to keep README readable. tests/test_readme_examples.py runs the check.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

# A quoted output: the opening marker, a plain code fence, the closing marker.
BLOCK = re.compile(
    r"(?P<open><!-- example: (?P<name>[\w-]+) -->\n```\n)(?P<body>.*?)"
    r"(?P<close>```\n<!-- /example -->)",
    re.DOTALL,
)
BASH_FENCE = re.compile(r"```bash\n(.*?)```", re.DOTALL)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
PARENTHESES = re.compile(r"\(([^()]*)\)")
COLUMNS = 4000  # wider than any line a command prints: nothing wraps


@dataclass(frozen=True)
class Example:
    """One command whose output README quotes."""

    name: str  # the marker's NAME
    picks: Callable[[list[str]], bool]  # true for the argv of README's command
    keep: tuple[str, ...]  # regexes: the stdout lines README shows (matched from the start)

    def lines(self, stdout: str) -> list[str]:
        """The lines of `stdout` README shows, in order, shortened."""
        patterns = [re.compile(p) for p in self.keep]
        kept = [
            shorten(line.rstrip())
            for line in stdout.splitlines()
            if any(p.match(line) for p in patterns)
        ]
        if not kept:
            raise RuntimeError(f"example {self.name}: no line of the output matches {self.keep}")
        return kept


EXAMPLES = {
    e.name: e
    for e in (
        Example(
            "plan",
            lambda argv: argv[:2] == ["autoconfig", "plan"],
            # the plan, the batch it used, and each other GPU type's best plan
            (r"plan: ", r"gbs: ", r"  [\w.-]+: [\d,]+ x "),
        ),
        Example(
            "compare",
            lambda argv: argv[:2] == ["autoconfig", "estimate"] and "--compare" in argv,
            # the rank and the single changes that gain most
            (r"your layout ranks ", r"  .+: [+-][\d.]+%$"),
        ),
    )
}


def shorten(line: str) -> str:
    """`line` with the source citations inside each parenthesis (the `; `-separated parts
    naming "et al.") replaced by one "...": "(GPT-3 175B: 3.2M, ...: 4M; ...)"."""

    def inner(match: re.Match[str]) -> str:
        parts = match.group(1).split("; ")
        kept = [p for p in parts if "et al." not in p]
        if len(kept) == len(parts):
            return match.group(0)
        return "(" + "; ".join([*kept, "..."]) + ")"

    return PARENTHESES.sub(inner, line)


def readme_commands(readme: str) -> list[list[str]]:
    """Every command of README's ```bash blocks as argv: continuation lines joined, comments
    dropped."""
    commands = []
    for block in BASH_FENCE.findall(readme):
        for command in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(command, comments=True)
            if argv:
                commands.append(argv)
    return commands


def command_of(example: Example, readme: str) -> list[str]:
    """README's one command for `example`."""
    found = [argv for argv in readme_commands(readme) if example.picks(argv)]
    if len(found) != 1:
        raise RuntimeError(
            f"example {example.name}: README has {len(found)} commands it could be, not one"
        )
    return found[0]


class _Terminal(io.StringIO):
    """Captured stdout that says it is a terminal, so output is laid out for a screen
    (COLUMNS wide) and not for a pipe."""

    def isatty(self) -> bool:
        return True


@contextlib.contextmanager
def _scratch(**environ: str) -> Iterator[None]:
    """A scratch working folder and the environment variables `environ`, both undone after."""
    before_cwd = os.getcwd()
    before_env = {k: os.environ.get(k) for k in environ}
    with tempfile.TemporaryDirectory(prefix="readme-example-") as tmp:
        try:
            os.chdir(tmp)
            os.environ.update(environ)
            yield
        finally:
            os.chdir(before_cwd)
            for key, value in before_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def run(argv: list[str]) -> str:
    """stdout of README's command `argv` ("autoconfig ..."), run in this process on a wide
    terminal without colour; a failing command raises with its stderr."""
    from autoconfig.cli.app import execute  # here: `--help` needs no package import

    out, err = _Terminal(), io.StringIO()
    # TERM=dumb and NO_COLOR: no colour codes (any left are stripped below).
    environ = {"COLUMNS": str(COLUMNS), "LINES": "50", "TERM": "dumb", "NO_COLOR": "1"}
    with _scratch(**environ), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = execute(argv[1:])
    if code != 0:
        raise RuntimeError(f"{shlex.join(argv)} exited {code}:\n{err.getvalue()}")
    return ANSI.sub("", out.getvalue())


def quoted(readme: str) -> dict[str, str]:
    """README's quoted output of each example, by name (the fence's body)."""
    blocks = {m["name"]: m["body"] for m in BLOCK.finditer(readme)}
    unknown = sorted(set(blocks) - set(EXAMPLES))
    if unknown:
        raise RuntimeError(f"README marks examples this script does not know: {unknown}")
    return blocks


def current(readme: str, names: list[str] | None = None) -> dict[str, str]:
    """What each example's command prints now, as README would quote it (a fence's body),
    for the examples `names` (README's marked ones when None)."""
    names = list(quoted(readme)) if names is None else names
    return {
        name: "\n".join(EXAMPLES[name].lines(run(command_of(EXAMPLES[name], readme)))) + "\n"
        for name in names
    }


def rewrite(readme: str, outputs: dict[str, str]) -> str:
    """`readme` with each marked block's body replaced by its entry of `outputs`."""
    return BLOCK.sub(lambda m: m["open"] + outputs.get(m["name"], m["body"]) + m["close"], readme)


def differences(readme: str, outputs: dict[str, str] | None = None) -> str:
    """A unified diff from README's quoted outputs to the commands' current ones; empty when
    README is up to date. `outputs`: already computed outputs (else the commands run)."""
    outputs = current(readme) if outputs is None else outputs
    missing = sorted(set(EXAMPLES) - set(quoted(readme)))
    if missing:
        raise RuntimeError(f"README has no <!-- example: NAME --> block for {missing}")
    return "".join(
        difflib.unified_diff(
            readme.splitlines(keepends=True),
            rewrite(readme, outputs).splitlines(keepends=True),
            "README.md",
            "README.md (commands now)",
        )
    )


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 with a diff if stale")
    mode.add_argument("--print", action="store_true", help="print the outputs only")
    parser.add_argument("--readme", type=Path, default=README)
    opts = parser.parse_args(args)
    readme = opts.readme.read_text()
    outputs = current(readme)
    if opts.print:
        for name, body in outputs.items():
            print(f"<!-- example: {name} -->\n{body}", end="")
        return 0
    diff = differences(readme, outputs)
    if opts.check:
        if diff:
            print(diff, end="")
            print("README's quoted outputs are stale: python scripts/readme_examples.py")
            return 1
        print(f"README's quoted outputs are current ({', '.join(outputs)})")
        return 0
    if diff:
        opts.readme.write_text(rewrite(readme, outputs))
        print(diff, end="")
    state = "rewritten" if diff else "current"
    print(f"{opts.readme.name}: {len(outputs)} quoted outputs, {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
