"""The one validation layer for every number and path autoconfig accepts (CLI flags, search-space
YAML, config.json, CSV rows): each check returns the clean value or raises one UserError line
naming the field and what is allowed."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from autoconfig.base.errors import UserError

# Counts (GPUs, tokens, sequences, layers, widths) stay at or below 2^24: far beyond any cluster
# or model, and low enough that products of two counts (tokens per batch, dp*mbs*...) stay
# exact integers in the cost model's float64 columns (2^53).
MAX_COUNT = 2**24
# Memory, time and money: finite and below a bound no real run approaches.
MAX_AMOUNT = 1e15
# The largest text file read whole (CSV of runs, config.json, YAML): bigger is not an input.
MAX_TEXT_BYTES = 64 * 2**20
# Paths whose writes the kernel refuses or discards, whatever the permissions say.
PSEUDO_FILESYSTEMS = ("/proc", "/sys", "/dev")
# Linux's NAME_MAX and PATH_MAX: a longer file or folder name, or a longer path, is refused by
# the kernel ("File name too long"), so it is refused here first, naming the flag.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096


def integer(value: object, field: str, low: int = 1, high: int = MAX_COUNT) -> int:
    """An exact integer in [low, high]. Booleans, fractions and text that is no integer are
    refused; an integral float is accepted only while float64 holds it exactly."""
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and abs(value) <= 2**53:
            number = int(value)
    elif isinstance(value, str):
        number = _int_text(value)
    elif hasattr(value, "item"):  # a numpy scalar
        return integer(value.item(), field, low, high)
    if number is None:
        raise UserError(f"{field}: must be an integer in {low}..{high:,} (got {shown(value)})")
    if not low <= number <= high:
        raise UserError(f"{field}: must be in {low}..{high:,} (got {shown(value)})")
    return number


def _int_text(text: str) -> int | None:
    """An integer written as text: '128', '1e3', '2.0' (exactly), else None."""
    text = text.strip().replace("_", "")
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return None
    if math.isfinite(number) and number.is_integer() and abs(number) <= 2**53:
        return int(number)
    return None


def number(
    value: object,
    field: str,
    low: float = 0.0,
    high: float = MAX_AMOUNT,
    *,
    low_inclusive: bool = False,
) -> float:
    """A finite number above `low` (or at it, when inclusive) and at most `high`."""
    x = _float(value)
    above = x is not None and (x >= low if low_inclusive else x > low)
    if x is None or not math.isfinite(x) or not above or x > high:
        if low == 0:
            what = "a positive number" if not low_inclusive else "a number >= 0"
        else:
            what = f"a number {'>=' if low_inclusive else '>'} {low:g}"
        raise UserError(f"{field}: must be {what}, finite, at most {high:g} (got {shown(value)})")
    return x


def _float(value: object) -> float | None:
    if hasattr(value, "item") and not isinstance(value, str):  # a numpy scalar
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value.strip()) if isinstance(value, str) else float(value)
    except (ValueError, OverflowError):
        return None


def fraction(value: object, field: str) -> float:
    """A fraction in [0, 1)."""
    x = number(value, field, 0.0, 1.0, low_inclusive=True)
    if x >= 1:
        raise UserError(f"{field}: must be a fraction in [0, 1) (got {shown(value)})")
    return x


def shown(value: object) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


# -- paths ----------------------------------------------------------------------------------------


def path_name(path: Path | str, field: str) -> Path:
    """`path` as a Path, if the filesystem can name it: no NUL character, no part longer than
    MAX_NAME_BYTES and at most MAX_PATH_BYTES in all (UTF-8 bytes, as the kernel counts).
    Every path flag passes here before anything looks the path up."""
    text = os.fspath(path)
    if "\x00" in text:
        raise UserError(f"{field}: a path cannot hold a NUL character (got {shown(text)})")
    size = len(os.fsencode(text))
    if size > MAX_PATH_BYTES:
        raise UserError(
            f"{field}: the path is {size:,} bytes long, more than the {MAX_PATH_BYTES:,} a path "
            f"may be (got {shown(text)})"
        )
    for part in Path(text).parts:
        size = len(os.fsencode(part))
        if size > MAX_NAME_BYTES:
            raise UserError(
                f"{field}: a file or folder name of {size:,} bytes, more than the "
                f"{MAX_NAME_BYTES} a name may be (got {shown(part)})"
            )
    return Path(text)


def text_file(path: Path | str, field: str, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The whole text of a UTF-8 file: it must exist, be a regular file (not a folder, a
    device or a pipe: those are refused before anything is read), hold at most `max_bytes`
    and no binary content."""
    path = path_name(path, field)
    if not path.exists():
        raise UserError(f"{field}: no such file '{path}'")
    if path.is_dir():
        raise UserError(f"{field}: '{path}' is a folder, not a file")
    if not path.is_file():
        raise UserError(f"{field}: '{path}' is not a regular file")
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise UserError(
                f"{field}: '{path}' holds {size:,} bytes, more than the {max_bytes:,} a text "
                "input may"
            )
        data = path.read_bytes()
    except PermissionError:
        raise UserError(f"{field}: cannot read '{path}' (permission denied)") from None
    except OSError as exc:
        raise UserError(f"{field}: cannot read '{path}' ({exc.strerror or exc})") from None
    if b"\x00" in data:
        raise UserError(f"{field}: '{path}' is a binary file, not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"{field}: '{path}' is not UTF-8 text") from None


def output_folder(path: Path | str, field: str) -> Path:
    """A folder autoconfig may create or write into: not a file, not under a pseudo
    filesystem, and the nearest existing ancestor a writable folder. Creates nothing."""
    if str(path) == "":  # Path('') would be '.': the current folder, never meant
        raise UserError(f"{field}: must not be empty (give a folder; '.' for the current one)")
    path = path_name(path, field)
    if path.exists() and not path.is_dir():
        raise UserError(f"{field}: '{path}' is a file, not a folder")
    _writable_place(path, field)
    return path


def output_file(path: Path | str, field: str) -> Path:
    """A file autoconfig may write whole: not a folder, not under a pseudo filesystem, and in a
    folder that exists or can be created and written. Creates nothing."""
    if str(path) == "":  # Path('') would be '.': never a file anyone meant
        raise UserError(f"{field}: must not be empty (give a file name)")
    path = path_name(path, field)
    if path.is_dir():
        raise UserError(f"{field}: '{path}' is a folder; give a file name")
    if path.exists() and not path.is_file():
        raise UserError(f"{field}: '{path}' is not a regular file")
    _writable_place(path.parent, field)
    return path


def _writable_place(folder: Path, field: str) -> None:
    absolute = Path(os.path.abspath(folder))
    for pseudo in PSEUDO_FILESYSTEMS:
        if absolute == Path(pseudo) or Path(pseudo) in absolute.parents:
            raise UserError(f"{field}: cannot write under {pseudo} ('{folder}')")
    existing = absolute
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{field}: '{existing}' is a file, so '{folder}' cannot be a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{field}: cannot write in '{existing}' (permission denied)")


def json_text(text: str, where: str) -> object:
    """JSON text parsed, with one line naming `where` when it is not JSON, nests too deeply, or
    gives a key twice in one object (json would keep the last silently)."""

    def unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
        seen: dict[str, object] = {}
        for key, value in pairs:
            if key in seen:
                raise UserError(f"{where}: key {shown(key)} is given twice in one object")
            seen[key] = value
        return seen

    try:
        return json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except RecursionError:
        raise UserError(f"{where}: nests too deeply") from None
