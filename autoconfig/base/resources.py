"""The data shipped inside the package: model and GPU profiles, search spaces and report
assets, found through importlib.resources so an installed wheel reads the same files as a
checkout (whose top-level profiles/ and search_spaces/ point here)."""

from __future__ import annotations

import os
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

PROFILES_ENV = "AUTOCONFIG_PROFILES"  # a folder with models/ and gpus/ replaces the shipped ones


def profiles() -> Traversable:
    """The profiles folder: models/, gpus/ (AUTOCONFIG_PROFILES overrides it)."""
    env = os.environ.get(PROFILES_ENV)
    return Path(env) if env else files("autoconfig") / "profiles"


def yaml_files(folder: Traversable) -> list[Traversable]:
    """The *.yaml files of a folder, by name (none when the folder does not exist)."""
    if not folder.is_dir():
        return []
    return sorted((f for f in folder.iterdir() if f.name.endswith(".yaml")), key=lambda f: f.name)


def search_space(name: str = "default") -> Traversable:
    return files("autoconfig") / "search_spaces" / f"{name}.yaml"


def asset(name: str) -> Traversable:
    """A report asset (the model's measured accuracy, written by the validation scripts)."""
    return files("autoconfig") / "report" / "assets" / name


def asset_path(name: str) -> Path:
    """Where the validation scripts write a report asset in a checkout."""
    return Path(str(asset(name)))
