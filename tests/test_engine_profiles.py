"""The serving-engine profiles (autoconfig/profiles/engines/*.yaml): each loads, every fact
carries a source naming the engine version it was read at, a profile with an unknown key or an
unsourced fact is refused, a setting an engine lacks is one line naming the closest names, the
scheduler defaults are what the engines' code says, and docs/engines.md shows the profiles.

After editing a profile, rewrite the docs with `python tests/test_engine_profiles.py
--write-docs` and read the diff."""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter brings tomli
    import tomli as tomllib  # type: ignore[no-redef]

import pytest
import yaml

from autoconfig.base.errors import UserError
from autoconfig.spec import engines
from autoconfig.spec.engines import EngineSpec, Fact
from autoconfig.spec.vocab import Engine

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ROOT / "autoconfig" / "profiles" / "engines"
DOCS = ROOT / "docs" / "engines.md"


def _raw(name: str) -> dict:
    return yaml.safe_load((PROFILES / f"{name}.yaml").read_text())


def _refusal(tmp_path: Path, data: dict) -> str:
    """The one-line message a profile written from `data` is refused with."""
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(UserError) as caught:
        engines.load_profile(path)
    message = str(caught.value)
    assert "\n" not in message, message
    return message


# -- loading -------------------------------------------------------------------------------------


def test_every_engine_the_cli_names_has_a_profile_that_loads() -> None:
    assert engines.engine_names() == tuple(sorted(Engine.values()))
    for name in engines.engine_names():
        spec = engines.engine(name)
        assert isinstance(spec, EngineSpec) and spec.name == name
        assert len(list(spec.facts())) == 19
    # aliases and case reach the same profile
    assert engines.engine("TensorRT-LLM") is engines.engine("trtllm")
    assert engines.engine(" SGLang ") is engines.engine("sglang")


def test_every_fact_has_a_source_naming_the_version_read() -> None:
    for name in engines.engine_names():
        spec = engines.engine(name)
        assert spec.version in spec.source
        for where, fact in spec.facts():
            assert isinstance(fact, Fact)
            assert fact.source.strip(), f"{name} {where}"
            assert spec.version in fact.source, f"{name} {where}: {fact.source}"


def test_trtllm_facts_say_they_were_not_read_from_code() -> None:
    """The TensorRT-LLM wheel is not on PyPI (a stub that downloads it from NVIDIA's index):
    its facts come from the documentation and say so."""
    spec = engines.engine("trtllm")
    assert all("not read" in fact.source for _, fact in spec.facts())


# -- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "key"),
    [((), "max_batch"), (("scheduler",), "max_num_seqs"), (("kv_cache", "formats"), "note")],
)
def test_a_profile_with_an_unknown_key_is_refused(
    tmp_path: Path, where: tuple[str, ...], key: str
) -> None:
    data = _raw("vllm")
    place = data
    for part in where:
        place = place[part]
    place[key] = 1
    message = _refusal(tmp_path, data)
    assert key in message and "engine profile" in message


def test_a_fact_without_its_source_is_refused(tmp_path: Path) -> None:
    data = _raw("sglang")
    del data["scheduler"]["max_running_requests"]["source"]
    message = _refusal(tmp_path, data)
    assert "scheduler.max_running_requests.source" in message

    data = _raw("sglang")
    data["kv_cache"]["prefix_caching"]["source"] = "   "
    assert "kv_cache.prefix_caching.source" in _refusal(tmp_path, data)

    data = _raw("sglang")  # a bare value is a fact without a source
    data["scheduler"]["chunked_prefill"] = True
    assert "scheduler.chunked_prefill" in _refusal(tmp_path, data)


def test_a_source_without_the_version_is_refused(tmp_path: Path) -> None:
    data = _raw("vllm")
    data["cuda_graphs"]["covers"]["source"] = "vLLM docs"
    message = _refusal(tmp_path, data)
    assert message.endswith(
        "cuda_graphs.covers.source: must name the version read (0.33.0), got 'vLLM docs'"
    )
    data = _raw("vllm")  # a longer version is another version
    data["cuda_graphs"]["covers"]["source"] = "vllm 0.33.01 config/compilation.py"
    assert "cuda_graphs.covers.source" in _refusal(tmp_path, data)


@pytest.mark.parametrize(
    ("section", "key", "value", "needle"),
    [
        ("scheduler", "max_running_requests", True, "whole number"),
        ("scheduler", "max_tokens_per_iteration", 0, "whole number"),
        ("scheduler", "chunked_prefill", "yes", "true or false"),
        ("weights", "formats", ["fp8", "nvfp5"], "'nvfp5' is not among"),
        ("kv_cache", "formats", ["fp8", "fp8"], "twice"),
        ("kv_cache", "memory_fraction", 1.5, "fraction"),
        ("cuda_graphs", "covers", "prefill", "decode_and_mixed"),
        ("parallel", "ep_modes", [], "must list names"),
    ],
)
def test_a_fact_of_the_wrong_kind_is_refused(
    tmp_path: Path, section: str, key: str, value: object, needle: str
) -> None:
    data = _raw("vllm")
    data[section][key]["value"] = value
    message = _refusal(tmp_path, data)
    assert f"{section}.{key}" in message and needle in message, message


def test_capture_sizes_end_at_the_largest_capture_size(tmp_path: Path) -> None:
    data = _raw("trtllm")
    data["cuda_graphs"]["max_capture_size"]["value"] = 256
    assert "is not the largest capture size (128)" in _refusal(tmp_path, data)
    data = _raw("trtllm")
    data["cuda_graphs"]["capture_sizes"]["value"] = [1, 4, 2, 128]
    assert "ascending" in _refusal(tmp_path, data)


# -- settings ------------------------------------------------------------------------------------


def test_supports_reads_the_profiles_names_with_engine_spellings() -> None:
    vllm, sglang, trtllm = (engines.engine(n) for n in ("vllm", "sglang", "trtllm"))
    assert engines.supports(sglang, "weight_format", "nvfp4")
    assert engines.supports(vllm, "kv_format", "FP8_E4M3")  # the engines' own spelling
    assert engines.supports(sglang, "speculative_method", "NEXTN")
    assert engines.supports(trtllm, "speculative_method", "medusa")
    assert not engines.supports(sglang, "speculative_method", "medusa")
    assert not engines.supports(trtllm, "ep_mode", "mooncake")
    assert engines.supports(vllm, "ep_mode", "deepep-low-latency")
    with pytest.raises(ValueError, match="unknown engine setting 'quantization'"):
        engines.supports(vllm, "quantization", "fp8")


def test_check_setting_returns_the_profiles_name() -> None:
    assert engines.check_setting("sglang", "kv_format", "bfloat16") == "bf16"
    assert engines.check_setting("TRT-LLM", "speculative_method", "Eagle3") == "eagle3"


@pytest.mark.parametrize(
    ("engine", "setting", "value", "message"),
    [
        (
            "sglang",
            "weight_format",
            "nvfp5",
            "engine: sglang has no weight format 'nvfp5' (closest: nvfp4)",
        ),
        ("vlm", "weight_format", "fp8", "engine: unknown engine 'vlm' (closest: vllm)"),
        ("trtllm", "kv_format", "fp9", "engine: trtllm has no K/V format 'fp9' (closest: fp8)"),
        (
            "vllm",
            "ep_mode",
            "deep_ep",
            "engine: vllm has no EP mode 'deep_ep' (closest: deepep, deepep_v2)",
        ),
        (
            "sglang",
            "speculative_method",
            "medusa",  # another engine's method: this engine's whole list, not look-alikes
            "engine: sglang has no speculative method 'medusa' (allowed: eagle, eagle3, mtp, "
            "draft_model, ngram, dflash, dspark, uno)",
        ),
        (
            "trtllm",
            "ep_mode",
            "x\nmooncake",  # the message stays one line whatever is typed
            "engine: trtllm has no EP mode 'x\\nmooncake' (allowed: ep, deepep, "
            "deepep_low_latency, nvlink_alltoall)",
        ),
    ],
)
def test_check_setting_refuses_in_one_line_with_the_closest_names(
    engine: str, setting: str, value: str, message: str
) -> None:
    with pytest.raises(UserError) as caught:
        engines.check_setting(engine, setting, value)
    assert str(caught.value) == message


# -- the values, as read from the engines' code --------------------------------------------------


def _values(name: str, *facts: str) -> tuple:
    spec = engines.engine(name)
    found = dict(spec.facts())
    return tuple(found[f].value for f in facts)


SCHEDULER = (
    "scheduler.max_running_requests",
    "scheduler.max_tokens_per_iteration",
    "scheduler.chunked_prefill",
    "scheduler.mixed_batches",
)


def test_scheduler_defaults_are_the_engines() -> None:
    # vllm 0.33.0 engine/arg_utils.py get_batch_defaults (API server, 70-160 GiB, not A100)
    assert _values("vllm", *SCHEDULER) == (1024, 8192, True, True)
    # sglang 0.5.23: resolve_max_num_reqs's ceiling, memory_hook.py's chunk at 60-160 GiB,
    # enable_mixed_chunk False
    assert _values("sglang", *SCHEDULER) == (4096, 8192, True, False)
    # TensorRT-LLM 1.0 BuildConfig defaults, enable_chunked_prefill False
    assert _values("trtllm", *SCHEDULER) == (2048, 8192, False, True)


def test_cuda_graph_and_cache_defaults_are_the_engines() -> None:
    facts = (
        "cuda_graphs.max_capture_size",
        "cuda_graphs.covers",
        "kv_cache.block_size_tokens",
        "kv_cache.memory_fraction",
        "kv_cache.memory_fraction_of",
        "kv_cache.prefix_caching",
    )
    assert _values("vllm", *facts) == (512, "decode_and_mixed", 16, 0.92, "total", True)
    sglang = _values("sglang", *facts)
    assert sglang[:3] == (512, "decode_and_prefill", 1)
    assert sglang[3] == "(gpu_memory - reserved) / gpu_memory"
    assert sglang[4:] == ("weights_and_kv", True)
    assert _values("trtllm", *facts) == (128, "decode", 32, 0.9, "free_after_load", True)
    # vllm 0.33.0 config/vllm.py _set_cudagraph_sizes with max 512
    (vllm_sizes,) = _values("vllm", "cuda_graphs.capture_sizes")
    assert vllm_sizes == [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
    # sglang 0.5.23 cuda_graph_hook.py generate_decode_cuda_graph_batch_sizes with max_bs 512
    (sglang_sizes,) = _values("sglang", "cuda_graphs.capture_sizes")
    assert sglang_sizes == [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), 512]
    assert _values("vllm", "all_reduce.custom_max_bytes") == (8192 * 1024,)
    assert _values("sglang", "all_reduce.custom_max_bytes") == (16 * 1024 * 1024,)


# -- packaging and docs --------------------------------------------------------------------------


def test_the_engine_profiles_ship_in_the_wheel() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["autoconfig"]
    shipped = {p for pattern in patterns for p in (ROOT / "autoconfig").glob(pattern)}
    assert set(PROFILES.glob("*.yaml")) <= shipped, "add profiles/engines/*.yaml to package-data"


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list) and len(value) > 8 and all(isinstance(v, int) for v in value):
        return f"{', '.join(map(str, value[:4]))}, ..., {value[-1]} ({len(value)} sizes)"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)


def _cell(text: str) -> str:
    """Text for a table cell or a line of prose: no column breaks, no emphasis from `*`."""
    return text.replace("|", "\\|").replace("*", "\\*").replace("\n", " ")


def markdown() -> str:
    """docs/engines.md, written from the profiles."""
    lines = [
        "# Engine profiles",
        "",
        "What each serving engine does by default and what it can run, as its profile in",
        "`autoconfig/profiles/engines/` states it (read by `autoconfig.spec.engines`). Every",
        "fact carries its source: the engine's file and the version read. The names of formats,",
        "expert-parallel modes and speculative methods are engine-neutral; each source says",
        "which of the engine's own spellings a name stands for. Defaults that depend on the GPU",
        "or the parallel layout hold for the setting named under each engine; the source gives",
        "the other cases.",
        "",
        "Generated by `python tests/test_engine_profiles.py --write-docs`; a test checks it",
        "matches the profiles.",
    ]
    for name in engines.engine_names():
        spec = engines.engine(name)
        lines += [
            "",
            f"## {spec.title}",
            "",
            f"Profile `{spec.name}`, version {spec.version}. {_cell(spec.source)}.",
            "",
            f"Defaults for: {_cell(spec.defaults_for)}.",
            "",
            "| Fact | Value | Source |",
            "| --- | --- | --- |",
        ]
        lines += [
            f"| `{where}` | {_cell(_shown(fact.value))} | {_cell(fact.source)} |"
            for where, fact in spec.facts()
        ]
    lines += [
        "",
        "## Names",
        "",
        "| Setting | Names a profile may list |",
        "| --- | --- |",
    ]
    lines += [
        f"| `{setting}` | {', '.join(names)} |"
        for setting, (_, _, names) in engines.SETTINGS.items()
    ]
    return "\n".join(lines) + "\n"


def test_the_docs_show_the_profiles() -> None:
    assert DOCS.read_text() == markdown(), "run: python tests/test_engine_profiles.py --write-docs"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-docs"]:
        DOCS.write_text(markdown())
        print(f"wrote {DOCS}")
    else:
        sys.exit("usage: python tests/test_engine_profiles.py --write-docs")
