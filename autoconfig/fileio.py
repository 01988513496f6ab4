"""Files written whole or not at all: write to a temporary name beside the target, then
rename, so an interrupted run never leaves a half-written file (or the temporary) behind."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:  # interrupted (Ctrl-C) or failed: leave no temporary behind
        tmp.unlink(missing_ok=True)


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, default=str))
