"""The typer app every command registers on, and the entry point's rule for errors: bad input
is one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import errno
import functools
import importlib
import os
import sys

import typer
import typer.core

from autoconfig.base.errors import UserError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Find the fastest parallel configuration to train and serve a transformer.",
)


@app.callback()
def _commands() -> None:
    """A callback makes the app a group of commands even when a run registers only one."""


# The module of autoconfig.cli that registers each command. A run imports only the module of the
# command it names, since Python's start-up is most of a search's wall time; help, or a name not
# listed here, imports them all.
COMMAND_MODULES = {
    "models": "catalog",
    "gpus": "catalog",
    "calibrate": "catalog",
    "estimate": "estimate",
    "infer": "infer",
    "plan": "plan",
    "rl": "rl",
    "rl-measure": "rl",
    "search": "search",
    "train": "train",
}


def register(args: list[str] | None = None) -> typer.Typer:
    """Registers on the app the command that `args` names first (every command when `args` is
    None or starts otherwise, as `--help search` does) and returns the app."""
    named = args[0] if args else None
    wanted = {COMMAND_MODULES[named]} if named in COMMAND_MODULES else set(COMMAND_MODULES.values())
    for module in sorted(wanted):
        importlib.import_module(f"autoconfig.cli.{module}")
    return app


@functools.cache
def _command(registered: int) -> typer.core.TyperGroup | typer.core.TyperCommand:
    """The command typer builds from the app with `registered` commands, once per process and
    set of commands (building it inspects every flag of every command: tens of milliseconds).
    Recent typer releases carry their own copy of click, so the project names no click of its
    own."""
    return typer.main.get_command(app)


def run() -> None:
    """Runs the app on the command line's arguments and exits with its code."""
    sys.exit(execute())


def execute(args: list[str] | None = None) -> int:
    """Runs the app (on `args`, or the command line's) and returns the exit code: bad input is
    one line on stderr and code 2, Ctrl-C code 130, never a traceback."""
    args = sys.argv[1:] if args is None else args
    register(args)
    try:
        command = _command(len(app.registered_commands))
        code = command.main(args=args, prog_name="autoconfig", standalone_mode=False)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except SystemExit as exc:  # a command's own sys.exit(code)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except (typer.Abort, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # A full disk is the machine's, not the input's: one line, and what was written
        # before it (finished trials, the last whole report set) stays for --resume.
        where = f"{exc.filename}: " if exc.filename else ""
        print(
            f"error: {where}{os.strerror(exc.errno)}; files written before it are kept "
            "(a measured search continues with --resume once there is space)",
            file=sys.stderr,
        )
        return 1
    except typer.TyperException as exc:  # usage errors: unknown flag, bad number, ...
        if type(exc).__name__ == "NoArgsIsHelpError":
            return 0
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        hint = getattr(exc, "param_hint", None) or getattr(
            getattr(exc, "param", None), "name", None
        )
        where = f"{hint}: " if isinstance(hint, str) and hint not in message else ""
        print(f"error: {where}{' '.join(message.split())}", file=sys.stderr)
        return 2
    return code if isinstance(code, int) else 0
