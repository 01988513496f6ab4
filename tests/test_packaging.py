"""autoconfig works as an installed wheel: built from this checkout, installed (not editable)
into a fresh virtual environment, and run from a folder outside the checkout, its catalog,
search space and report assets come from the package itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_installed_wheel_searches_serves_and_lists_outside_the_checkout(tmp_path: Path) -> None:
    dist, venv, elsewhere = tmp_path / "dist", tmp_path / "venv", tmp_path / "elsewhere"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*build, "-w", str(dist), str(ROOT)], check=True, capture_output=True)
    (wheel,) = dist.glob("autoconfig-*.whl")
    # The environment sees the machine's packages (numpy, torch, ...) but gets autoconfig
    # only from the wheel.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python, cli = venv / "bin" / "python", venv / "bin" / "autoconfig"
    install = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed"]
    subprocess.run([*install, str(wheel)], check=True, capture_output=True)
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AUTOCONFIG_PROFILES")}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(args), cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300
        )

    where = run(str(python), "-c", "import autoconfig.catalog as c; print(c.__file__)")
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr

    search = run(str(cli), "search", "--model", "gpt3-175b", "--gpus", "1024", "--out", "out")
    assert search.returncode == 0, search.stderr
    best = json.loads((elsewhere / "out" / "best.json").read_text())
    assert best["best"]["rank"] == 1 and best["inputs"]["model"] == "gpt3-175b"
    page = (elsewhere / "out" / "report.html").read_text()
    assert "Known accuracy" in page  # the packaged accuracy asset was found

    serve = run(
        str(cli), "infer", "--model", "llama2-70b", "--gpus", "8",
        "--input-len", "512", "--output-len", "64",
    )  # fmt: skip
    assert serve.returncode == 0, serve.stderr
    assert "tok/s/GPU" in serve.stdout

    models = run(str(cli), "models")
    assert models.returncode == 0 and "mixtral-8x22b" in models.stdout
