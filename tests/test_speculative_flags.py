"""The serving launch lines carry the speculative decoding the prediction assumed: vLLM's
--speculative-config, SGLang's --speculative-* flags, TensorRT-LLM's speculative_config."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from autoconfig import api
from autoconfig.report.serving_flags import launch_flags
from autoconfig.serve.result import ServingResult
from autoconfig.spec.vocab import Engine

pytestmark = pytest.mark.xdist_group("speculative_flags")

SMALL: dict[str, Any] = dict(
    model="llama3-8b", gpu="h100-sxm-80gb", gpus=2, max_num_seqs=(32, 128),
    max_num_batched_tokens=(2048,), requests=100, input_len=1024, output_len=256,
    max_ttft_ms=1000, max_tpot_ms=50,
)  # fmt: skip


def _argv(text: str) -> list[str]:
    joined = text.replace("\\\n", " ")
    lines = [ln for ln in joined.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return shlex.split(lines[0])


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.fixture(scope="module")
def speculating() -> ServingResult:
    return api.infer(
        **SMALL, disaggregation=False, speculative_tokens=3, acceptance_rate=0.7,
        speculative_method="eagle3",
    )  # fmt: skip


def test_vllm_speculative_config_is_json_with_the_predicted_drafts(speculating) -> None:
    config = json.loads(
        _flag(_argv(launch_flags(speculating, Engine.VLLM)), "--speculative-config")
    )
    assert config == {"method": "eagle3", "num_speculative_tokens": 3, "model": "DRAFT_PATH"}


def test_sglang_chain_of_drafts(speculating) -> None:
    argv = _argv(launch_flags(speculating, Engine.SGLANG))
    assert _flag(argv, "--speculative-algorithm") == "EAGLE3"
    assert _flag(argv, "--speculative-num-steps") == "3"
    assert _flag(argv, "--speculative-eagle-topk") == "1"
    assert _flag(argv, "--speculative-num-draft-tokens") == "4"


def test_trtllm_options_file_names_the_drafter(speculating) -> None:
    text = launch_flags(speculating, Engine.TRTLLM)
    assert "speculative_config: {decoding_type: Eagle, max_draft_len: 3" in text
    assert "eagle3_one_model: true" in text


def test_no_speculation_no_flags() -> None:
    plain = api.infer(**SMALL, disaggregation=False)
    for engine in Engine:
        assert "speculative" not in launch_flags(plain, engine)


@pytest.mark.parametrize(
    ("method", "vllm", "sglang"), [("mtp", "mtp", "NEXTN"), ("ngram", "ngram", "NGRAM")]
)
def test_headless_drafters_need_no_draft_checkpoint(method: str, vllm: str, sglang: str) -> None:
    result = api.infer(
        **SMALL, disaggregation=False, speculative_tokens=2, acceptance_rate=0.6,
        speculative_method=method,
    )  # fmt: skip
    config = json.loads(_flag(_argv(launch_flags(result, Engine.VLLM)), "--speculative-config"))
    assert config["method"] == vllm and "model" not in config
    argv = _argv(launch_flags(result, Engine.SGLANG))
    assert _flag(argv, "--speculative-algorithm") == sglang
    assert "--speculative-draft-model-path" not in argv
