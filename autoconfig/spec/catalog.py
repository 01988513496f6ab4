"""The catalog: model and GPU profiles shipped with the package (or AUTOCONFIG_PROFILES),
profile files by path, Hugging Face config.json import, and which serving constants a GPU uses."""

from __future__ import annotations

import difflib
import json
import os
from functools import cache
from importlib.resources.abc import Traversable
from pathlib import Path

import yaml
from pydantic import ValidationError

from autoconfig.base import checks, resources
from autoconfig.base.errors import UserError, pydantic_message
from autoconfig.spec.schema import (
    MAX_LAYERS,
    ClusterSpec,
    FrameworkSpec,
    GPUSpec,
    InferenceEfficiency,
    ModelSpec,
)

# libyaml's safe loader where PyYAML was built with it (about ten times faster on the catalog's
# profiles, read at every start); the pure-Python one otherwise.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# A profile or search space is a few kilobytes (the largest shipped one 8 KB); 1 MiB of YAML
# parses in about half a second, where the 64 MiB a text input may hold would take a minute.
MAX_YAML_BYTES = 2**20


class DuplicateKey(yaml.constructor.ConstructorError):
    """A mapping that gives one key twice (YAML itself would keep the last silently)."""

    def __init__(self, key: object, first: yaml.Mark, again: yaml.Mark) -> None:
        super().__init__(problem=f"duplicate key {key!r}", problem_mark=again)
        self.key, self.first, self.again = key, first, again


class UniqueKeyLoader(SAFE_LOADER):  # type: ignore[misc, valid-type]
    """The safe loader, refusing a mapping that gives a key twice."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: dict[object, yaml.Mark] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges, not a key
                    continue
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, str | int | float | bool) or key is None:
                    continue  # unhashable or odd keys are refused by the spec that reads them
                if key in seen:
                    raise DuplicateKey(key, seen[key], key_node.start_mark)
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


def read_yaml(path: Traversable, what: str = "") -> dict:
    """A YAML mapping from a file; one line naming the file (and line) when it is not one, or
    when a mapping in it gives a key twice."""
    where = f"{what}: {path}" if what else str(path)
    # Files on disk through the one text-file check; packaged profiles are trusted text.
    if isinstance(path, Path):
        text = checks.text_file(path, what or "file", max_bytes=MAX_YAML_BYTES)
    else:
        text = path.read_text()
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)
    except DuplicateKey as exc:
        raise UserError(
            f"{where} line {exc.again.line + 1}: key {checks.shown(exc.key)} is given twice "
            f"(first on line {exc.first.line + 1})"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{where}{line}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    except RecursionError:
        raise UserError(f"{where}: nests too deeply to be a profile") from None
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a mapping of fields")
    return data


@cache
def models() -> dict[str, ModelSpec]:
    """Catalog models by name (aliases included)."""
    out: dict[str, ModelSpec] = {}
    for path in resources.yaml_files(resources.profiles() / "models"):
        try:
            spec = ModelSpec(**read_yaml(path))
        except ValidationError as exc:
            raise UserError(pydantic_message(exc, f"{path}: ")) from None
        for name in (spec.name, *spec.aliases):
            out[name] = spec
    return out


@cache
def gpus() -> dict[str, GPUSpec]:
    """GPU profiles by name."""
    out: dict[str, GPUSpec] = {}
    for path in resources.yaml_files(resources.profiles() / "gpus"):
        try:
            spec = GPUSpec(**read_yaml(path))
        except ValidationError as exc:
            raise UserError(pydantic_message(exc, f"{path}: ")) from None
        out[spec.name] = spec
    return out


@cache
def frameworks() -> dict[str, FrameworkSpec]:
    """Framework profiles by name and alias (lower case)."""
    out: dict[str, FrameworkSpec] = {}
    for path in resources.yaml_files(resources.profiles() / "frameworks"):
        try:
            spec = FrameworkSpec(**read_yaml(path))
        except ValidationError as exc:
            raise UserError(pydantic_message(exc, f"{path}: ")) from None
        for name in (spec.name, *spec.aliases):
            out[name.lower()] = spec
    return out


def get_framework(name: str, field: str = "framework") -> FrameworkSpec:
    """A framework profile by name or alias (the reference tables' spellings); an unknown
    name is a UserError naming `field` and the closest names."""
    catalog = frameworks()
    key = str(name).strip().lower()
    if key not in catalog:
        names = sorted({f.name for f in catalog.values()})
        raise UserError(f"{field}: unknown name '{name}'{_closest(key, names)}")
    return catalog[key]


def _closest(name: str, known: list[str]) -> str:
    # Names the typed text begins come first ('h100' -> the h100 profiles), then look-alikes.
    prefixed = sorted(k for k in known if name and k.startswith(name))
    alike = difflib.get_close_matches(name, known, n=3, cutoff=0.4)
    near = (prefixed + [k for k in alike if k not in prefixed])[:3]
    return f"; closest: {', '.join(near)}" if near else f"; known: {', '.join(sorted(known))}"


def get_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name, or a Hugging Face config.json by path."""
    if name_or_path.endswith(".json") or os.path.sep in name_or_path:
        return model_from_hf_config(Path(name_or_path))
    catalog = models()
    if name_or_path not in catalog:
        raise UserError(
            f"model: unknown name {checks.shown(name_or_path)}"
            + _closest(name_or_path, list(catalog))
        )
    return catalog[name_or_path]


def get_gpu(name: str) -> GPUSpec:
    """A catalog GPU profile by name, or a profile YAML by path (`autoconfig calibrate` writes
    these)."""
    name = name.strip()
    if name.endswith((".yaml", ".yml")) or os.path.sep in name:
        return gpu_from_file(Path(name))
    catalog = gpus()
    name = name.lower()
    if name not in catalog:
        raise UserError(f"gpu: unknown name {checks.shown(name)}{_closest(name, list(catalog))}")
    return catalog[name]


def gpu_from_file(path: Path) -> GPUSpec:
    try:
        return GPUSpec(**read_yaml(path, "profile"))
    except ValidationError as exc:
        raise UserError(pydantic_message(exc, f"profile: {path}: ")) from None


# The fitted GPU whose serving constants a GPU without its own serving measurements borrows.
# They are fractions of datasheet figures and small-kernel latencies, which transfer better
# across chips than the training constants do (those include eager-framework overheads).
FALLBACK_SERVING_GPU = "a100-sxm-80gb"


def serving_constants(gpu: GPUSpec) -> tuple[InferenceEfficiency, str]:
    """The GPU's serving constants and where they come from: its own fit, else a fitted GPU
    of the same chip, else the fallback GPU's, else the training constants with typical
    engine costs."""
    if gpu.inference is not None:
        return gpu.inference, gpu.inference.provenance
    fitted = [g for g in gpus().values() if g.inference is not None]
    donors = [g for g in fitted if g.chip == gpu.chip]
    donors += [g for g in fitted if g.name == FALLBACK_SERVING_GPU]
    if donors:
        donor = donors[0]
        return donor.inference, f"carried over from {donor.name} ({donor.inference.provenance})"
    e = gpu.efficiency
    guess = InferenceEfficiency(
        memory=e.memory,
        gemm=e.gemm,
        kernel_us=4.0,
        allreduce_base_us=15.0,
        allreduce_step_us=10.0,
        provenance="unfitted guesses",
    )
    return guess, guess.provenance


def cluster_for(gpu: GPUSpec, gpus_per_node: int | None = None) -> ClusterSpec:
    """The GPU's default cluster, optionally with another node size."""
    if gpus_per_node is None:
        return gpu.cluster
    return gpu.cluster.model_copy(update={"gpus_per_node": gpus_per_node})


# Hugging Face config.json keys, first match wins (GPT-2 style names as fallbacks).
_HF_KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "ffn_hidden": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "vocab": ("vocab_size",),
    "max_seq_len": ("max_position_embeddings", "n_positions", "seq_length"),
    "head_dim": ("head_dim",),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "topk": ("num_experts_per_tok", "moe_topk"),
    "moe_ffn_hidden": ("moe_intermediate_size",),
    "shared_experts": ("n_shared_experts", "num_shared_experts"),
}


# Counts that may be zero (a dense model has no experts).
_HF_MAY_BE_ZERO = ("num_experts", "topk", "shared_experts")


def model_from_hf_config(path: Path) -> ModelSpec:
    """A ModelSpec from a Hugging Face transformers config.json (or a model folder holding
    one). Every number is checked (checks.integer): an exact integer in range, not a bool."""
    path = checks.path_name(path, "model")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"model: '{path}' is a folder without a config.json")
        path = path / "config.json"
    cfg = checks.json_text(checks.text_file(path, "model"), f"model: '{path}'")
    if not isinstance(cfg, dict):
        raise UserError(f"model: '{path}' must hold a JSON object")
    fields: dict[str, object] = {}
    for field, keys in _HF_KEYS.items():
        for key in keys:
            if cfg.get(key) is not None:
                where = f"model: '{path}': {key}"
                if field == "max_seq_len":  # some configs say 2^31 for "unlimited": cap it
                    value = checks.integer(cfg[key], where, 1, 2**63)
                    fields[field] = min(value, checks.MAX_COUNT)
                else:
                    low = 0 if field in _HF_MAY_BE_ZERO else 1
                    high = MAX_LAYERS if field == "layers" else checks.MAX_COUNT
                    fields[field] = checks.integer(cfg[key], where, low, high)
                break
    for needed in ("layers", "hidden", "heads", "vocab"):
        if needed not in fields:
            names = " or ".join(_HF_KEYS[needed])
            raise UserError(f"model: '{path}' lacks {names} (needed for {needed})")
    name = cfg.get("_name_or_path")
    fields["name"] = (
        name if isinstance(name, str) and name.strip() else path.parent.name or path.stem
    )
    act = str(cfg.get("hidden_act") or cfg.get("activation_function") or "gelu").lower()
    model_type = str(cfg.get("model_type", "")).lower()
    gated = act in ("silu", "swiglu", "swish") or model_type in (
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen3",
        "gemma",
    )
    rms = "rms_norm_eps" in cfg or "rms_norm" in str(cfg.get("normalization", "")).lower()
    rope = "rope_theta" in cfg or "rope_scaling" in cfg or "rotary" in json.dumps(cfg).lower()
    fields.update(
        mlp="swiglu" if gated else ("squared_relu" if "relu2" in act else "gelu"),
        norm="rmsnorm" if rms else "layernorm",
        position="rope" if rope else ("alibi" if cfg.get("alibi") else "learned"),
        tied_embeddings=_flag(cfg, "tie_word_embeddings", not gated, path),
        seq_len=min(int(fields.get("max_seq_len", 4096)), 8192),
        dropout=any(
            checks.number(cfg[k], f"model: '{path}': {k}", 0, 1, low_inclusive=True) > 0
            for k in ("attention_dropout", "hidden_dropout")
            if cfg.get(k) is not None
        ),
        source=f"Hugging Face config {path}",
    )
    if fields.get("num_experts") and "moe_ffn_hidden" not in fields:
        fields["moe_ffn_hidden"] = fields.get("ffn_hidden")
    try:
        return ModelSpec(**fields)
    except ValidationError as exc:
        raise UserError(pydantic_message(exc, f"model: '{path}': ")) from None


def _flag(cfg: dict, key: str, default: bool, path: Path) -> bool:
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise UserError(f"model: '{path}': {key}: must be true or false (got {value!r})")
    return value
