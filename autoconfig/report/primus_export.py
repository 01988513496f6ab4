"""A layout as a Primus experiment YAML: Megatron-LM's exported flags as its snake_case overrides.

Primus (AMD-AGI/Primus, AMD's training framework for Instinct GPUs; no PyPI release) runs
Megatron-LM underneath. An experiment is a YAML file whose `modules: pre_trainer:` names
`framework: megatron`, a base `config`, a `model` file and `overrides:` keyed by Megatron-LM's
argument names in snake case (`tensor_model_parallel_size: 8`, `sequence_parallel: true`),
launched with `EXP=<file> bash ./examples/run_pretrain.sh`. These names are as recalled, not
read here. So the overrides are not templates of their own: each Megatron flag the layout
needs (exports.lines, Megatron's templates in spec.layout) becomes one key. A flag that cannot
become one key refuses the export with one line; the YAML is never written half.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import yaml

from autoconfig.base.errors import UserError
from autoconfig.spec.schema import FrameworkSpec
from autoconfig.spec.vocab import Framework

NAME = Framework.PRIMUS.value
DERIVES_FROM = Framework.MEGATRON  # whose flags (spec.layout templates, exports.RUN_FLAGS) it takes

# Megatron-LM arguments whose attribute (argparse dest), which Primus's overrides name, is not
# the flag in snake case: --fp8-format stores into `fp8` (megatron/training/arguments.py, as
# recalled; Primus's configs write `fp8: hybrid`).
DEST = {"--fp8-format": "fp8"}

# Megatron flags that ask for something a Primus profile states it does not do (`does:` false):
# left out of the overrides, so the experiment asks for what the prediction charged.
BEHAVIOUR_FLAGS = {"--tp-comm-overlap": "tp_overlap"}

_FLAG = re.compile(r"--[a-z0-9]+(-[a-z0-9]+)*")
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?([0-9]+\.[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")

EXPERIMENT_FILE = "primus_experiment.yaml"


def _refuse(line: str, why: str) -> UserError:
    return UserError(f"emit: {NAME} cannot write Megatron's `{line}` as an override: {why}")


def _value(token: str, quoted: bool) -> Any:
    """A flag's value as YAML should hold it: a quoted value stays a string, an unquoted one
    is an integer or a number where it reads as one, else a string (never YAML's own reading,
    which would turn `no` or `null` into something else)."""
    if quoted:
        return token
    if _INT.fullmatch(token):
        return int(token)
    if _FLOAT.fullmatch(token):
        return float(token)
    return token


def _pairs(line: str) -> list[tuple[str, Any]]:
    """The (flag, value) pairs of one Megatron line: a bare switch is true, a flag and one
    value its value; anything else refuses."""
    try:
        words, as_typed = shlex.split(line), shlex.split(line, posix=False)
    except ValueError as exc:  # an unclosed quote
        raise _refuse(line, str(exc)) from None
    if len(words) != len(as_typed):
        raise _refuse(line, "its words do not split one way")
    out: list[tuple[str, Any]] = []
    i = 0
    while i < len(words):
        flag = words[i]
        if "=" in flag:
            raise _refuse(line, f"{flag!r} is not a flag and a value apart")
        if not _FLAG.fullmatch(flag):
            raise _refuse(line, f"{flag!r} is not a --flag")
        if flag.startswith("--no-"):
            # Megatron's --no-X flags store false into X, or into no_X: not one rule
            raise _refuse(line, f"{flag} stores into an argument its name does not give")
        values = []
        i += 1
        while i < len(words) and not words[i].startswith("--"):
            values.append(_value(words[i], as_typed[i][:1] in ("'", '"')))
            i += 1
        if len(values) > 1:
            raise _refuse(line, f"{flag} takes more than one value")
        out.append((flag, values[0] if values else True))
    if not out:
        raise _refuse(line, "no flag in it")
    return out


def key(flag: str) -> str:
    """The override key of a Megatron flag: its argument name in snake case."""
    return DEST.get(flag, flag[2:].replace("-", "_"))


def overrides(megatron: list[str], profile: FrameworkSpec) -> dict[str, Any]:
    """Primus's overrides for the Megatron lines `megatron` (exports.lines with Megatron's
    templates), in their order, less the flags for what `profile` does not do; a line that
    is not flags and values, or a key given two values, refuses with one line."""
    out: dict[str, Any] = {}
    for line in megatron:
        for flag, value in _pairs(line):
            behaviour = BEHAVIOUR_FLAGS.get(flag)
            if behaviour is not None and not getattr(profile.does, behaviour).value:
                continue
            name = key(flag)
            if name in out and out[name] != value:
                raise _refuse(line, f"{name} is already {out[name]!r}")
            out[name] = value
    return out


def experiment(
    megatron: list[str],
    profile: FrameworkSpec,
    precision: str,
    gpus: int,
    gpus_per_node: int = 8,
) -> str:
    """The Primus experiment YAML for a layout whose Megatron-LM lines are `megatron`, run on
    `gpus` GPUs in nodes of `gpus_per_node`, with the launch command as its first lines."""
    allowed = [str(p) for p in profile.allows("precisions")]
    if precision not in allowed:
        raise UserError(f"emit: {NAME} trains in {', '.join(allowed)}, not {precision}")
    tree = {
        "work_group": "${PRIMUS_TEAM:amd}",
        "user_name": "${PRIMUS_USER:root}",
        "exp_name": "${PRIMUS_EXP_NAME:autoconfig}",
        "workspace": "./output",
        "modules": {
            "pre_trainer": {
                "framework": "megatron",
                "config": "pre_trainer.yaml",
                "model": "<model>.yaml",
                "overrides": overrides(megatron, profile),
            }
        },
    }
    per_node = min(gpus, gpus_per_node)
    if gpus % per_node:
        raise UserError(
            f"emit: {gpus} GPUs do not fill whole nodes of {gpus_per_node}; {NAME}'s "
            "run_pretrain.sh starts the same number of ranks on every node"
        )
    nodes = gpus // per_node
    # run_pretrain.sh's torchrun settings by environment (NNODES, NODE_RANK, MASTER_ADDR,
    # GPUS_PER_NODE, default 8; as recalled)
    where = f"GPUS_PER_NODE={per_node} " if per_node != 8 else ""
    if nodes > 1:
        where += f"NNODES={nodes} NODE_RANK=<0..{nodes - 1}> MASTER_ADDR=<first node> "
    header = [
        f"# Primus (AMD-AGI/Primus, Megatron-LM backend): save as {EXPERIMENT_FILE} in a Primus "
        "checkout, name the model's config file for <model>, and launch"
        + (" on each node" if nodes > 1 else "")
        + " with",
        f"# {where}EXP={EXPERIMENT_FILE} bash ./examples/run_pretrain.sh",
    ]
    return "\n".join([*header, yaml.safe_dump(tree, sort_keys=False).rstrip()])
