"""`python -m autoconfig.trainer --config trial.json --out DIR`: one rank under torchrun or srun."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autoconfig.base.errors import UserError
from autoconfig.trainer.metrics import EXIT_BAD_INPUT, EXIT_INTERRUPTED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autoconfig.trainer")
    parser.add_argument("--config", required=True, type=Path, help="TrainConfig JSON")
    parser.add_argument("--out", required=True, type=Path, help="run folder")
    args = parser.parse_args(argv)
    # torch takes seconds to import: here, a Ctrl-C in those seconds ends the rank quietly
    from autoconfig.trainer.config import load_config
    from autoconfig.trainer.run import train

    try:
        cfg = load_config(args.config)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return train(cfg, args.out)


if __name__ == "__main__":
    try:
        code = main()
    except KeyboardInterrupt:  # before the rank's own handling began: no result, no traceback
        code = EXIT_INTERRUPTED
    sys.exit(code)
