"""Serving-engine profiles: what vLLM, SGLang and TensorRT-LLM do by default and what they can
run, each fact with the engine file (or document) and version it was read from, for the serving
model and for refusing a setting an engine does not have."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from functools import cache, lru_cache
from importlib.resources import files
from importlib.resources.abc import Traversable

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from autoconfig.base import checks, resources
from autoconfig.base.errors import UserError, pydantic_message
from autoconfig.spec.catalog import read_yaml

# The names a profile may list, engine-neutral so one setting reads the same for every engine;
# each profile's source says which of the engine's own spellings each name stands for.
WEIGHT_FORMATS = (
    "bf16",
    "fp16",
    "fp8",
    "mxfp8",
    "nvfp4",
    "mxfp4",
    "int8",
    "int4",  # weight-only int4 other than AWQ/GPTQ checkpoints (W4A16)
    "awq",
    "gptq",
    "w4a8",  # 4-bit weights, 8-bit activations
    "gguf",
    "bitsandbytes",
)
KV_FORMATS = ("bf16", "fp16", "fp8", "fp8_e5m2", "mxfp8", "nvfp4", "int8", "int4")
# How MoE tokens reach experts on other ranks: `ep` is the engine's plain expert parallelism
# (all-gather/reduce-scatter or all-reduce), the others its all-to-all backends.
EP_MODES = (
    "ep",
    "deepep",
    "deepep_low_latency",
    "deepep_v2",
    "nvlink_alltoall",
    "mooncake",
    "nixl",
    "mori",
    "moonep",
    "pplx",
    "megamoe",
)
SPECULATIVE_METHODS = (
    "eagle",
    "eagle3",
    "mtp",
    "ngram",
    "draft_model",
    "suffix",
    "dflash",
    "dspark",
    "uno",
    "medusa",
    "lookahead",
)
# Which batches run as CUDA graphs: decode-only batches; decode batches and prefill batches
# (which never mix with decodes); or decode batches and mixed prefill-decode batches.
GRAPH_COVERAGE = ("decode", "decode_and_prefill", "decode_and_mixed")
# What an engine's memory fraction is a fraction of: the GPU's whole memory for everything,
# the GPU's memory for weights plus KV cache, or the memory left free after loading for KV.
MEMORY_FRACTION_OF = ("total", "weights_and_kv", "free_after_load")
ALL_REDUCE = ("flashinfer", "nccl_symmetric", "custom", "torch_symmetric", "trtllm", "nccl")

# Engine spellings a user may type for a neutral name.
_ALIASES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp8_e4m3": "fp8",
    "nextn": "mtp",
    "standalone": "draft_model",
    "draft": "draft_model",
    "eagle_3": "eagle3",
}

# A setting check_setting knows: the section and field listing an engine's names, how a
# message names it, and every name any engine may list for it.
SETTINGS = {
    "weight_format": (("weights", "formats"), "weight format", WEIGHT_FORMATS),
    "kv_format": (("kv_cache", "formats"), "K/V format", KV_FORMATS),
    "ep_mode": (("parallel", "ep_modes"), "EP mode", EP_MODES),
    "speculative_method": (("speculative", "methods"), "speculative method", SPECULATIVE_METHODS),
}


class _Profile(BaseModel):
    # An unknown key is a typo or a fact the model does not read: refused, never ignored.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Fact(_Profile):
    """An engine fact and where it comes from (file and version of the engine, or its docs)."""

    # strict members: a YAML `true` stays a flag and never passes for the count 1
    value: StrictBool | StrictInt | StrictFloat | str | list[StrictInt] | list[str]
    source: str = Field(min_length=1)

    @field_validator("source")
    @classmethod
    def _said(cls, source: str) -> str:
        if not source.strip():
            raise ValueError("must say where the fact comes from")
        return source


def _whole(fact: Fact, low: int = 1) -> Fact:
    """`fact` if its value is an integer of at least `low`; else one line."""
    value = fact.value
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"must be a whole number of at least {low}, not {value!r}")
    return fact


def _yes_no(fact: Fact) -> Fact:
    if not isinstance(fact.value, bool):
        raise ValueError(f"must be true or false, not {fact.value!r}")
    return fact


def _one_of(fact: Fact, allowed: tuple[str, ...]) -> Fact:
    if not isinstance(fact.value, str) or fact.value not in allowed:
        raise ValueError(f"must be one of {', '.join(allowed)}, not {fact.value!r}")
    return fact


def _names(fact: Fact, allowed: tuple[str, ...]) -> Fact:
    """`fact` if its value lists distinct names among `allowed` (at least one)."""
    value = fact.value
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError(f"must list names among {', '.join(allowed)}, not {value!r}")
    unknown = [v for v in value if v not in allowed]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not among {', '.join(allowed)}")
    if len(set(value)) != len(value):
        raise ValueError("names a value twice")
    return fact


class Scheduler(_Profile):
    """How many requests and tokens one iteration may hold, and how prompts are batched."""

    max_running_requests: Fact  # requests in the running batch (max_num_seqs, max_batch_size)
    max_tokens_per_iteration: Fact  # token budget of one forward (max_num_batched_tokens)
    chunked_prefill: Fact  # long prompts prefilled in chunks within that budget
    mixed_batches: Fact  # prefill chunks and decodes share one iteration

    @field_validator("max_running_requests", "max_tokens_per_iteration")
    @classmethod
    def _counts(cls, fact: Fact) -> Fact:
        return _whole(fact)

    @field_validator("chunked_prefill", "mixed_batches")
    @classmethod
    def _flags(cls, fact: Fact) -> Fact:
        return _yes_no(fact)


class CudaGraphs(_Profile):
    """The batch sizes captured as CUDA graphs by default and which batches replay them."""

    capture_sizes: Fact  # ascending; a batch pads up to the next one
    max_capture_size: Fact  # the largest; bigger batches run eagerly
    covers: Fact  # GRAPH_COVERAGE

    @field_validator("capture_sizes")
    @classmethod
    def _ascending(cls, fact: Fact) -> Fact:
        value = fact.value
        sizes = [s for s in value if type(s) is int and s > 0] if isinstance(value, list) else []
        if not sizes or sizes != value:
            raise ValueError(f"must list positive batch sizes, not {value!r}")
        if sizes != sorted(set(sizes)):
            raise ValueError("must list each size once, in ascending order")
        return fact

    @field_validator("max_capture_size")
    @classmethod
    def _largest(cls, fact: Fact) -> Fact:
        return _whole(fact)

    @field_validator("covers")
    @classmethod
    def _coverage(cls, fact: Fact) -> Fact:
        return _one_of(fact, GRAPH_COVERAGE)

    @model_validator(mode="after")
    def _same_largest(self) -> CudaGraphs:
        sizes = self.capture_sizes.value
        if isinstance(sizes, list) and sizes[-1] != self.max_capture_size.value:
            raise UserError(
                f"cuda_graphs.max_capture_size: {self.max_capture_size.value} is not the "
                f"largest capture size ({sizes[-1]})"
            )
        return self


class KvCache(_Profile):
    """The K/V cache: its block (page) size, its share of memory, reuse, storage formats."""

    block_size_tokens: Fact
    memory_fraction: Fact  # a fraction in (0, 1], or the rule the engine computes it by
    memory_fraction_of: Fact  # MEMORY_FRACTION_OF
    prefix_caching: Fact  # blocks of a shared prompt prefix reused across requests
    formats: Fact  # KV_FORMATS

    @field_validator("block_size_tokens")
    @classmethod
    def _block(cls, fact: Fact) -> Fact:
        return _whole(fact)

    @field_validator("memory_fraction")
    @classmethod
    def _fraction(cls, fact: Fact) -> Fact:
        value = fact.value
        if isinstance(value, str) and value.strip():
            return fact
        if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1:
            return fact
        raise ValueError(f"must be a fraction in (0, 1] or the rule for one, not {value!r}")

    @field_validator("memory_fraction_of")
    @classmethod
    def _of(cls, fact: Fact) -> Fact:
        return _one_of(fact, MEMORY_FRACTION_OF)

    @field_validator("prefix_caching")
    @classmethod
    def _reuse(cls, fact: Fact) -> Fact:
        return _yes_no(fact)

    @field_validator("formats")
    @classmethod
    def _formats(cls, fact: Fact) -> Fact:
        return _names(fact, KV_FORMATS)


class Weights(_Profile):
    """The weight formats (quantizations) the engine loads."""

    formats: Fact  # WEIGHT_FORMATS

    @field_validator("formats")
    @classmethod
    def _formats(cls, fact: Fact) -> Fact:
        return _names(fact, WEIGHT_FORMATS)


class Parallel(_Profile):
    """Parallelism beyond tensor and pipeline parallelism: data-parallel attention and MoE
    expert parallelism."""

    attention_dp: Fact  # attention data parallel inside the TP group, MoE sharded across it
    ep_modes: Fact  # EP_MODES
    expert_load_balancing: Fact  # redundant experts placed by measured load (EPLB)

    @field_validator("attention_dp", "expert_load_balancing")
    @classmethod
    def _flags(cls, fact: Fact) -> Fact:
        return _yes_no(fact)

    @field_validator("ep_modes")
    @classmethod
    def _modes(cls, fact: Fact) -> Fact:
        return _names(fact, EP_MODES)


class Speculative(_Profile):
    """The speculative-decoding methods the engine runs."""

    methods: Fact  # SPECULATIVE_METHODS

    @field_validator("methods")
    @classmethod
    def _methods(cls, fact: Fact) -> Fact:
        return _names(fact, SPECULATIVE_METHODS)


class AllReduce(_Profile):
    """The all-reduce behind tensor parallelism: the implementations tried, in order, and the
    largest message the engine's own (custom) kernel takes before handing over."""

    implementation: Fact  # ALL_REDUCE, in the order the engine tries them
    custom_max_bytes: Fact

    @field_validator("implementation")
    @classmethod
    def _order(cls, fact: Fact) -> Fact:
        return _names(fact, ALL_REDUCE)

    @field_validator("custom_max_bytes")
    @classmethod
    def _limit(cls, fact: Fact) -> Fact:
        return _whole(fact)


class EngineSpec(_Profile):
    """A serving engine: its scheduler and CUDA-graph defaults, K/V cache, the formats and
    parallel modes it runs, and its TP all-reduce; every fact sourced at one engine version."""

    name: str = Field(min_length=1)
    title: str = Field(min_length=1)
    aliases: tuple[str, ...] = ()
    version: str = Field(pattern=r"^\d+(\.\d+)+$", description="the engine version read")
    source: str = Field(min_length=1, description="what was read, for the profile as a whole")
    defaults_for: str = Field(min_length=1, description="the setting the defaults hold for")
    scheduler: Scheduler
    cuda_graphs: CudaGraphs
    kv_cache: KvCache
    weights: Weights
    parallel: Parallel
    speculative: Speculative
    all_reduce: AllReduce

    def facts(self) -> Iterator[tuple[str, Fact]]:
        """Every fact with its place in the profile ('scheduler.max_running_requests')."""
        for section in type(self).model_fields:
            group = getattr(self, section)
            if isinstance(group, BaseModel):
                for key in type(group).model_fields:
                    yield f"{section}.{key}", getattr(group, key)

    @model_validator(mode="after")
    def _versioned(self) -> EngineSpec:
        """Each fact names the version it was read at: a default read at another release is a
        different fact."""
        # the version alone, not the start of a longer one (1.0 is not 1.0.1 nor 11.0)
        stated = re.compile(rf"(?<![\d.]){re.escape(self.version)}(?!\.?\d)")
        sources = [("source", self.source)]
        sources += [(f"{where}.source", fact.source) for where, fact in self.facts()]
        for where, source in sources:
            if not stated.search(source):
                raise UserError(
                    f"{where}: must name the version read ({self.version}), "
                    f"got {checks.shown(source)}"
                )
        return self

    def names(self, setting: str) -> tuple[str, ...]:
        """The names the engine allows for a check_setting setting ('weight_format', ...)."""
        if setting not in SETTINGS:
            raise ValueError(f"unknown engine setting {setting!r}; known: {', '.join(SETTINGS)}")
        (section, field), _, _ = SETTINGS[setting]
        value = getattr(getattr(self, section), field).value
        return tuple(value) if isinstance(value, list) else ()


def _folder() -> Traversable:
    """The engine profiles: AUTOCONFIG_PROFILES's engines/ where it has one, else the shipped
    ones (a replacement catalog of models and GPUs need not repeat the engines)."""
    chosen = resources.profiles() / "engines"
    return chosen if chosen.is_dir() else files("autoconfig") / "profiles" / "engines"


@cache
def _profiles() -> dict[str, EngineSpec]:
    """Engine profiles by name and alias (lower case)."""
    out: dict[str, EngineSpec] = {}
    for path in resources.yaml_files(_folder()):
        spec = load_profile(path)
        for name in (spec.name, *spec.aliases):
            out[name.lower()] = spec
    return out


def load_profile(path: Traversable) -> EngineSpec:
    """An engine profile from a YAML file; a bad one is one UserError line naming the file."""
    try:
        return EngineSpec(**read_yaml(path, "engine profile"))
    except ValidationError as exc:
        raise UserError(pydantic_message(exc, f"engine profile: {path}: ")) from None


def engine_names() -> tuple[str, ...]:
    """The engines with a profile, by name."""
    return tuple(sorted({spec.name for spec in _profiles().values()}))


def _closest(name: str, allowed: tuple[str, ...]) -> str:
    """The allowed names that look like `name`, else all of them. The names are short and
    alike (fp8, fp16, nvfp4), so a looser cutoff than the catalog's would offer fp8 for nvfp5."""
    near = difflib.get_close_matches(name, allowed, n=3, cutoff=0.6)
    return f"closest: {', '.join(near)}" if near else f"allowed: {', '.join(allowed)}"


# Only found profiles are cached (a miss raises), so the names and aliases bound it.
@lru_cache(maxsize=32)
def engine(name: str) -> EngineSpec:
    """An engine profile by name or alias; an unknown name is one UserError line."""
    key = str(name).strip().lower()
    catalog = _profiles()
    if key not in catalog:
        raise UserError(
            f"engine: unknown engine {checks.shown(name)} ({_closest(key, engine_names())})"
        )
    return catalog[key]


def _neutral(value: str) -> str:
    """The profile's name for a typed one: case, '-' for '_' and engine spellings forgiven."""
    key = str(value).strip().lower().replace("-", "_")
    return _ALIASES.get(key, key)


def supports(spec: EngineSpec, setting: str, value: str) -> bool:
    """Whether the engine runs `value` for `setting` (weight_format, kv_format, ep_mode or
    speculative_method)."""
    return _neutral(value) in spec.names(setting)


def check_setting(engine_name: str, setting: str, value: str) -> str:
    """The profile's name for `value` when the engine runs it; else one UserError line naming
    the engine, the setting and the closest names it allows."""
    spec = engine(engine_name)
    if supports(spec, setting, value):
        return _neutral(value)
    _, what, vocabulary = SETTINGS[setting]
    allowed = spec.names(setting)
    # A name another engine has is no typo: all this engine's names serve better than look-alikes.
    known = _neutral(value) in vocabulary
    hint = f"allowed: {', '.join(allowed)}" if known else _closest(_neutral(value), allowed)
    raise UserError(f"engine: {spec.name} has no {what} {checks.shown(value)} ({hint})")
