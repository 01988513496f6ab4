"""The readers under fuzz: CSV rows of runs and serving points (random cells, sizes, encodings)
and Hugging Face config.json files (random values for every key the import reads). A reader
returns its result or raises one UserError line; a row either predicts finite positive figures
or carries its reason in `error`; an imported model holds exact integers within the bounds."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from helpers import fuzz_examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoconfig import api
from autoconfig.base import checks
from autoconfig.base.errors import UserError
from autoconfig.base.fileio import csv_text
from autoconfig.cli.options import read_csv
from autoconfig.spec.catalog import _HF_KEYS, model_from_hf_config

# Draws per test are their counts in the thorough Hypothesis profile ("dev"), scaled by the
# profile loaded (tests/conftest.py; helpers.fuzz_examples); the rest of the settings come from
# the profile too.
FUZZ = settings(
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ]
)

TRAINING = ["model", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len"]
TRAINING += ["gpu", "num_gpus", "tp", "pp", "vp", "cp", "ep", "dp", "mbs", "gbs", "recompute"]
TRAINING += ["recompute_layers", "zero", "precision", "sp", "num_experts", "topk", "gpus_per_node"]
SERVING = ["model", "layers", "hidden", "heads", "vocab", "gpu", "num_gpus", "tp", "pp"]
SERVING += ["batch_size", "input_len", "output_len", "precision", "kv_precision", "replicas"]

GOOD = {
    "model": ["llama3-8b", "tiny-llama", "gpt3-126m", "", "nobody"],
    "gpu": ["h100-sxm-80gb", "a100-sxm-80gb", "cpu-gloo", "h900"],
    "recompute": ["none", "selective", "full", ""],
    "precision": ["bf16", "fp16", "fp8", ""],
    "kv_precision": ["auto", "fp8", ""],
    "sp": ["y", "n", ""],
}
HOSTILE = [
    "", "unknown", "nan", "inf", "-inf", "1e23", "-1", "0", "2.5", "9007199254740993",
    "16777217", "=cmd|' /C calc'!A0", "+1+1", "@SUM(A1)", "-2+3", "ünïcödé", "\t", "1,000",
    "0x10", "true",
]  # fmt: skip


def fuzzed(examples: int, **strategies):
    """A test from a body: `examples` draws in the thorough profile, a share of them in "ci",
    but never fewer than a tenth of them (the readers are cheap: a tenth takes seconds)."""
    draws = max(examples // 10, fuzz_examples(examples))
    return lambda body: settings(FUZZ, max_examples=draws)(given(**strategies)(body))


def cell(column: str) -> st.SearchStrategy[str]:
    good = st.sampled_from(GOOD[column]) if column in GOOD else st.integers(1, 64).map(str)
    return st.one_of(good, good, st.sampled_from(HOSTILE), st.text(max_size=12))


def table(columns: list[str]) -> st.SearchStrategy[pd.DataFrame]:
    """A frame of text cells over a random subset of the columns (required ones kept mostly)."""

    @st.composite
    def build(draw: st.DrawFn) -> pd.DataFrame:
        kept = [c for c in columns if draw(st.floats(0, 1)) < 0.85]
        rows = draw(st.integers(0, 12))
        data = {c: [draw(cell(c)) for _ in range(rows)] for c in kept}
        return pd.DataFrame(data, columns=kept, dtype=object)

    return build()


def _figures_are_sane(out: pd.DataFrame, columns: list[str]) -> None:
    fine = out[out["error"] == ""]
    for col in columns:
        values = pd.to_numeric(fine[col], errors="coerce").to_numpy(float)
        assert np.isfinite(values).all(), (col, fine[col].tolist())
        assert (values > 0).all(), (col, fine[col].tolist())


def _training_rows(frame: pd.DataFrame) -> None:
    try:
        out = api.estimate_frame(frame)
    except UserError as exc:
        assert "missing required column" in str(exc) and "\n" not in str(exc)
        return
    assert len(out) == len(frame)
    assert out["error"].map(lambda e: "\n" not in e).all()
    _figures_are_sane(out, ["pred_step_time_s", "pred_tokens_per_s_per_gpu", "pred_peak_mem_gib"])
    text = csv_text(out)  # what estimate --runs writes: no cell a spreadsheet would run
    written = pd.read_csv(pd.io.common.StringIO(text), dtype=str, keep_default_na=False)
    for col in written.columns:
        risky = written[col].str.match(r"^[=+\-@\t\r]") & ~written[col].str.fullmatch(
            r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|nan)", case=False
        )
        assert not risky.any(), (col, written.loc[risky, col].tolist())


test_fuzz_training_rows = fuzzed(400, frame=table(TRAINING))(_training_rows)


def _serving_rows(frame: pd.DataFrame) -> None:
    try:
        out = api.infer_frame(frame)
    except UserError as exc:
        assert "missing required column" in str(exc) and "\n" not in str(exc)
        return
    assert len(out) == len(frame)
    _figures_are_sane(out, ["pred_ttft_ms", "pred_tpot_ms", "pred_output_tokens_per_s_per_gpu"])


ENCODINGS = ["utf-8", "utf-16", "latin-1", "cp1252", "utf-8-sig"]


test_fuzz_serving_rows = fuzzed(300, frame=table(SERVING))(_serving_rows)


def _csv_files(tmp_path_factory, frame, encoding, junk, cut) -> None:
    """Any bytes at --runs: a table of text, or one line saying why not."""
    path = tmp_path_factory.mktemp("csv") / "runs.csv"
    data = frame.to_csv(index=False).encode(encoding, errors="replace")
    path.write_bytes(data[: cut or None] + (junk if cut % 3 == 0 else b""))
    try:
        read = read_csv(path)
    except UserError as exc:
        assert str(exc).startswith("runs:") and "\n" not in str(exc)
        return
    assert isinstance(read, pd.DataFrame)
    try:
        api.estimate_frame(read)
    except UserError as exc:
        assert "\n" not in str(exc)


test_fuzz_csv_files = fuzzed(
    200,
    frame=table(TRAINING),
    encoding=st.sampled_from(ENCODINGS),
    junk=st.binary(max_size=64),
    cut=st.integers(0, 400),
)(_csv_files)

JSON_VALUES = st.one_of(
    st.integers(-(2**70), 2**70),
    st.integers(1, 256),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=8),
    st.sampled_from(["lots", "32", "1e400", ""]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
HF_BASE = {
    "num_hidden_layers": st.integers(1, 96),
    "hidden_size": st.sampled_from([64, 4096]),
    "num_attention_heads": st.sampled_from([1, 8, 32]),
    "vocab_size": st.integers(1, 10**6),
}
KEYS = sorted({k for keys in _HF_KEYS.values() for k in keys})
EXTRA = ["hidden_act", "tie_word_embeddings", "attention_dropout", "_name_or_path", "model_type"]


# Cheap (500 draws in 2 s): every profile keeps the 500 the default run always made, the
# thorough one ten times that.
@settings(FUZZ, max_examples=max(500, fuzz_examples(5000)))
@given(
    base=st.fixed_dictionaries(HF_BASE),
    noise=st.dictionaries(st.sampled_from(KEYS + EXTRA), JSON_VALUES, max_size=6),
)
def test_fuzz_config_json(tmp_path_factory, base, noise) -> None:
    path = tmp_path_factory.mktemp("hf") / "config.json"
    path.write_text(json.dumps({**base, **noise}))
    try:
        spec = model_from_hf_config(path)
    except UserError as exc:
        assert str(exc).startswith("model:") and "\n" not in str(exc)
        return
    for name in ("layers", "hidden", "heads", "vocab", "seq_len", "num_experts", "topk"):
        value = getattr(spec, name)
        assert type(value) is int and 0 <= value <= checks.MAX_COUNT, (name, value)
    assert spec.layers >= 1 and spec.heads >= 1 and spec.hidden >= 1
    assert math.isfinite(spec.param_count())


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("max_position_embeddings", "lots", "max_position_embeddings: must be an integer"),
        ("max_position_embeddings", float("inf"), "max_position_embeddings: must be an integer"),
        ("num_hidden_layers", True, "num_hidden_layers: must be an integer"),
        ("hidden_size", 4096.5, "hidden_size: must be an integer"),
        ("vocab_size", 2**60, "vocab_size: must be in 1..16,777,216"),
        ("tie_word_embeddings", "false", "tie_word_embeddings: must be true or false"),
        ("attention_dropout", "high", "attention_dropout: must be a number"),
    ],
)
def test_config_json_probes_are_one_line(tmp_path, field, value, needle) -> None:
    base = {"num_hidden_layers": 2, "hidden_size": 4096, "num_attention_heads": 32}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, "vocab_size": 32000, field: value}))
    with pytest.raises(UserError, match=needle):
        model_from_hf_config(path)
