"""The typer app every command registers on, and the entry point's rule for errors: bad input
is one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import sys

import typer

from autoconfig.errors import UserError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Find the fastest parallel configuration to train and serve a transformer.",
)


def run() -> None:
    """Runs the app; maps errors to exit codes."""
    try:
        code = app(standalone_mode=False)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except typer.TyperException as exc:  # usage errors: unknown flag, bad number, ...
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.exit(0)
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        hint = getattr(exc, "param_hint", None) or getattr(
            getattr(exc, "param", None), "name", None
        )
        where = f"{hint}: " if isinstance(hint, str) and hint not in message else ""
        print(f"error: {where}{' '.join(message.split())}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
