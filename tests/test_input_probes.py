"""Bad `search` flags that used to pass silently: each is one line naming the flag and what is
allowed, exit code 2, no traceback (helpers.assert_user_error), and nothing written."""

from __future__ import annotations

import pytest
from helpers import assert_user_error, run_cli

SEARCH = ["search", "--model", "tiny-llama", "--gpus", "1"]


@pytest.mark.parametrize("top", ["0", "-1"])
def test_top_below_one_is_refused(top: str) -> None:
    assert_user_error(run_cli(*SEARCH, "--top", top), "top", "1..")


@pytest.mark.parametrize("fix", [["tp=2,tp=4"], ["tp=2", "--fix", "tp=4"], ["tp=1,pp=1,tp=1"]])
def test_fix_dimension_given_twice_is_refused(fix: list[str]) -> None:
    assert_user_error(run_cli(*SEARCH, "--fix", *fix), "fix", "'tp'", "twice")


@pytest.mark.parametrize("fix", ["tp=2,,pp=2", "tp=2,", ",tp=2", ""])
def test_fix_empty_item_is_refused(fix: str) -> None:
    assert_user_error(run_cli(*SEARCH, "--fix", fix), "fix", "empty")


def test_empty_out_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert_user_error(run_cli(*SEARCH, "--out", ""), "out", "empty")
    assert list(tmp_path.iterdir()) == []  # nothing written in the current folder


def test_dot_out_still_writes_here(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_cli(*SEARCH, "--out", ".", "--top", "1")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "results.csv").is_file()


def test_resume_without_measure_is_refused(tmp_path) -> None:
    result = run_cli(*SEARCH, "--resume", "--out", str(tmp_path / "runs"))
    assert_user_error(result, "resume", "--measure")
    assert not (tmp_path / "runs").exists()


def test_old_gb_names_still_read_as_gib(tmp_path) -> None:
    """A GPU profile and flags written before GiB was named GiB keep working, with the same
    figure: `memory_gb: 79.6` is 79.6 GiB, and --max-memory-gb is --max-memory-gib."""
    import yaml

    from autoconfig.spec import catalog

    shipped = catalog.get_gpu("h100-sxm-80gb").model_dump(mode="json")
    shipped["memory_gb"] = shipped.pop("memory_gib")
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(shipped))
    assert catalog.get_gpu(str(old)).memory_gib == shipped["memory_gb"]
    new = run_cli("search", "--model", "tiny-llama", "--gpus", "8", "--max-memory-gib", "20")
    legacy = run_cli("search", "--model", "tiny-llama", "--gpus", "8", "--max-memory-gb", "20")
    assert new.returncode == legacy.returncode == 0
    assert new.stdout == legacy.stdout
