"""Files written whole or not at all: a file goes to a temporary name beside the target and is
renamed into place; a set of files (a report) is switched in one rename; CSV cells that a
spreadsheet would run as formulas are written as text. And CSV text read into rows, each row
cut to the header's cells with its own error where it held more."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoconfig.base.errors import UserError

SETS = ".report"  # the folder's report sets; its `current` link names the one shown
CURRENT = "current"


def write_text(path: Path, text: str, field: str = "out") -> None:
    """`text` to `path` whole; a path that cannot be written is one line naming `field`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except IsADirectoryError:
        raise UserError(f"{field}: '{path}' is a folder; give a file name") from None
    except OSError as exc:
        raise UserError(f"{field}: cannot write '{path}' ({exc.strerror or exc})") from None
    finally:  # interrupted (Ctrl-C) or failed: leave no temporary behind
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def write_json(path: Path, data: Any, field: str = "out") -> None:
    write_text(path, json.dumps(data, indent=2, default=str), field)


def write_set(folder: Path, files: dict[str, str]) -> None:
    """Write `files` (name -> text) into `folder` as one unit: a killed run leaves the previous
    set or this one, never a mix. Each name in the folder is a link into `.report/current/`,
    and the set is switched by renaming that one link. The caller holds the folder's lock."""
    folder = Path(folder)
    store = folder / SETS
    stage: Path | None = None
    made: list[Path] = []
    switched = False
    try:
        store.mkdir(parents=True, exist_ok=True)
        stage = store / f"set-{time.time_ns()}-{os.getpid()}"
        stage.mkdir()
        for name, text in files.items():
            (stage / name).write_text(text)
        _adopt_plain_files(folder, store, list(files))
        for name in files:
            if _link(folder / name, f"{SETS}/{CURRENT}/{name}"):
                made.append(folder / name)
        _link(store / CURRENT, stage.name)  # the switch: one rename
        switched = True
        _tidy(folder, store, stage)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise UserError(f"out: cannot write the report in '{folder}' ({reason})") from None
    finally:
        if not switched:  # failed or interrupted before the switch: the old set stays whole
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)
            for link in made:
                if link.is_symlink() and not link.exists():
                    link.unlink()
            with contextlib.suppress(OSError):
                store.rmdir()  # only when no set was ever shown


def _link(path: Path, target: str) -> bool:
    """Make `path` a symbolic link to `target`, atomically (a new link renamed over it);
    False when it already was one."""
    if path.is_symlink() and os.readlink(path) == target:
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.link")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(target, tmp)
    try:
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return True


def _adopt_plain_files(folder: Path, store: Path, names: list[str]) -> None:
    """Plain files of the new set's names (written before sets existed) join the set shown now,
    so replacing each by a link shows the same content until the switch."""
    plain = [n for n in names if (folder / n).is_file() and not (folder / n).is_symlink()]
    if not plain:
        return
    current = store / CURRENT
    if not current.is_dir():
        adopted = store / f"set-{time.time_ns()}-adopted"
        adopted.mkdir()
        _link(current, adopted.name)
    for name in plain:
        shutil.copy2(folder / name, current / name)
        _link(folder / name, f"{SETS}/{CURRENT}/{name}")


def _tidy(folder: Path, store: Path, shown: Path) -> None:
    """Links whose file the new set lacks, and every set but the one shown."""
    prefix = f"{SETS}/{CURRENT}/"
    for entry in folder.iterdir():
        if entry.is_symlink() and os.readlink(entry).startswith(prefix) and not entry.exists():
            entry.unlink()
    for entry in store.iterdir():
        if entry.name.startswith("set-") and entry != shown:
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.name.endswith(".link"):
            entry.unlink()


# OWASP's advice on CSV injection: a cell starting with one of these is a formula to a
# spreadsheet; prefixing a quote keeps it text. Plain numbers (-1.5, +3) are left alone.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|nan)", re.I)


def safe_cell(value: object) -> object:
    """A text cell a spreadsheet shows as text; other values unchanged."""
    formula = isinstance(value, str) and value.startswith(_FORMULA_START)
    if formula and not _PLAIN_NUMBER.fullmatch(value.strip()):
        return "'" + value
    return value


def csv_text(frame: Any) -> str:
    """A pandas DataFrame as CSV text with every text cell made safe for spreadsheets."""
    text_columns = [c for c in frame.columns if frame[c].dtype.kind in "OSU"]
    if text_columns:
        frame = frame.copy()
        for col in text_columns:
            frame[col] = frame[col].map(safe_cell)
    frame = frame.rename(columns={c: safe_cell(c) for c in frame.columns if isinstance(c, str)})
    return frame.to_csv(index=False)


# -- reading CSV ----------------------------------------------------------------------------------

# Data rows one CSV input may hold: the published reference table has about 2,100; 100,000 rows
# are estimated in about 30 s and 1.3 GB on two cores.
MAX_CSV_ROWS = 100_000
# The DataFrame.attrs key under which a table read from CSV keeps its rows' own errors
# (row position -> message), for the row readers to report beside their other errors.
ROW_ERRORS = "row_errors"


@dataclass(frozen=True)
class CsvRows:
    """A CSV table as text: the header, every data row as long as the header (cells it lacked
    are ''), and the error of each row that held more cells than the header (by position)."""

    header: list[str]
    rows: list[list[str]]
    errors: dict[int, str]


def csv_rows(text: str, field: str, where: str) -> CsvRows:
    """The rows of CSV `text` (read from `where`). A row with more cells than the header is
    that row's error, wherever it is, and its first cells are kept; blank lines are skipped.
    A header that names a column twice, quoting that never closes or more than MAX_CSV_ROWS
    rows refuse the whole file (one line naming `field`)."""
    max_rows = MAX_CSV_ROWS
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header: list[str] | None = None
    rows: list[list[str]] = []
    errors: dict[int, str] = {}
    line = 1  # where the next record starts (a quoted cell may span lines)
    try:
        for cells in reader:
            start, line = line, reader.line_num + 1
            if not cells:
                continue
            if header is None:
                header = cells
                twice = next((c for i, c in enumerate(cells) if c in cells[:i]), None)
                if twice is not None:
                    raise UserError(f"{field}: {where} names column '{twice}' twice")
                continue
            if len(rows) == max_rows:
                raise UserError(
                    f"{field}: {where} holds more than the {max_rows:,} rows one file may"
                )
            if len(cells) > len(header):
                errors[len(rows)] = (
                    f"{field}: line {start} has {len(cells)} cells, the header {len(header)}"
                )
            rows.append((cells + [""] * len(header))[: len(header)])
    except csv.Error as exc:
        raise UserError(
            f"{field}: {where} is not a readable CSV (line {reader.line_num}: {exc})"
        ) from None
    if header is None:
        raise UserError(f"{field}: {where} is empty (no header line)")
    return CsvRows(header, rows, errors)
