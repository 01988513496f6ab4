"""Every architecture in the catalog trains for two steps on this machine's CPU with two layers at
sequence 128 (`autoconfig train --model M --layers 2 --seq-len 128 --device cpu`), and a run
that cannot fit the machine's memory is refused in one line that names the slice that would.

A model whose two full-width layers the cost model predicts above BUDGET_GB runs as one tensor-
parallel rank's shapes (`--slice --tp T`, T the largest the heads allow, at most about 4 GiB):
llama3-405b's two full layers need about 213 GiB with fp32 Adam, far beyond a CI machine.

Models that share an architecture signature (attention kind, MoE shape, Mamba, MLP, norm,
positions, ..., and the way the test runs them: full width, a slice, a one-layer slice) build
the same modules with other sizes: the walk trains the cheapest model of each signature (21 of
the catalog's 48 today); every model's run is still planned and checked."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest

from autoconfig.base.errors import UserError
from autoconfig.base.intmath import divisors
from autoconfig.spec import catalog
from autoconfig.trainer.config import make_config
from autoconfig.trainer.hostmem import check_fits, need_gib

BUDGET_GB = 2.0  # predicted memory of a full-width run: keeps the walk to minutes on 2 cores
# A slice predicted above this runs one layer instead of two: one tp rank of nemotron-3-ultra's
# 512 experts of hidden 8192 is 1.4B parameters a layer (28.5 GiB predicted for two layers with
# fp32 AdamW), beyond a 24 GiB CI machine.
MACHINE_GB = 18.0
RUN = {"layers": 2, "seq_len": 128, "device": "cpu", "steps": 2, "warmup": 1}


def _models() -> list[str]:
    unique = {id(m): m.name for m in catalog.models().values()}
    return sorted(unique.values())


@functools.cache  # the signature, the cost and the test each ask for it
def _flags(name: str) -> tuple[str, ...]:
    """Full width when it fits the budget, else the smallest slice the trainer runs (with
    one layer when two would not fit MACHINE_GB)."""
    if need_gib(make_config(model=name, **RUN)) <= BUDGET_GB:
        return ("--layers", "2")
    for tp in reversed(divisors(catalog.get_model(name).heads)):
        try:
            cfg = make_config(model=name, slice=True, tp=tp, **RUN)
        except UserError:
            continue
        layers = 2 if need_gib(cfg) <= MACHINE_GB else 1
        return ("--slice", "--tp", str(tp), "--layers", str(layers))
    raise AssertionError(f"{name}: the trainer runs no slice of it")


def _signature(name: str) -> tuple:
    """What the trainer builds differently for a model, and how this test runs it."""
    m = catalog.get_model(name)
    moe = (m.shared_experts > 0, m.dense_layers > 0, m.moe_every > 1, m.moe_latent is not None)
    return (
        "mla" if m.mla else ("gqa" if (m.kv_heads or m.heads) < m.heads else "mha"),
        m.sliding_window is not None,
        moe if m.num_experts else "dense",
        m.mamba is not None,
        m.mlp,
        m.norm,
        m.position,
        m.tied_embeddings,
        m.dropout,
        m.mtp_layers > 0,
        m.head_dim is not None and m.head_dim * m.heads != m.hidden,  # head width of its own
        _route(_flags(name)),
    )


def _route(flags: tuple[str, ...]) -> str:
    if "--slice" not in flags:
        return "full width"
    return "slice" if flags[-1] == "2" else "one-layer slice"


def _cost(name: str) -> float:
    """Predicted memory of the run _flags picks, as the cheapest-to-train measure."""
    flags = _flags(name)
    if "--slice" not in flags:
        return need_gib(make_config(model=name, **RUN))
    return need_gib(
        make_config(model=name, slice=True, tp=int(flags[2]), **{**RUN, "layers": int(flags[-1])})
    )


def _one_per_signature() -> list[str]:
    cheapest: dict[tuple, str] = {}
    for name in sorted(_models(), key=lambda n: (_cost(n), n)):
        cheapest.setdefault(_signature(name), name)
    return sorted(cheapest.values())


@pytest.mark.slow
@pytest.mark.xdist_group("catalog-walk")  # one worker, one model at a time: the large slices
@pytest.mark.parametrize("name", _one_per_signature())  # each want most of a CI machine's memory
def test_every_catalog_architecture_trains_two_layers_on_cpu(name: str, tmp_path) -> None:
    """Each model in a process of its own: the memory a large slice held goes back to the
    machine before the next model checks what is available."""
    out = tmp_path / "run"
    args = ["train", "--model", name, "--seq-len", "128", "--device", "cpu"]
    args += ["--steps", "2", "--warmup", "1", "--out", str(out), *_flags(name)]
    done = subprocess.run(
        [sys.executable, "-m", "autoconfig.cli", *args], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "ok"
    assert metrics["tokens_per_s_per_gpu"] > 0
    assert len(metrics["losses"]) == 2 and all(loss > 0 for loss in metrics["losses"])


def test_a_cpu_run_beyond_this_machine_is_one_line_naming_a_slice_that_fits() -> None:
    cfg = make_config(model="llama3-405b", **RUN)
    with pytest.raises(UserError, match=r"needs about 213\.\d GiB.*--slice --tp \d+") as err:
        check_fits(cfg, available=16.0)
    assert "\n" not in str(err.value)
    check_fits(make_config(model="tiny-llama", **RUN), available=16.0)  # fits: no error


def test_catalog_models_without_a_stated_context_take_a_sequence_length() -> None:
    # gpt3-* and megatron-gpt-* state no max_position_embeddings: seq_len must not compare
    # an int with None (it raised TypeError for 22 of the 33 catalog models).
    stated_none = [n for n in _models() if catalog.get_model(n).max_seq_len is None]
    assert len(stated_none) >= 20
    for name in stated_none:
        assert make_config(model=name, **RUN).spec().seq_len == 128
