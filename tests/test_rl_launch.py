"""RL plans written as NeMo-RL, verl and OpenRLHF launch lines, and what 1,000 steps cost."""

from __future__ import annotations

import re

import pytest
from helpers import assert_user_error
from helpers import run_cli as run

from autoconfig import api
from autoconfig.base.errors import UserError
from autoconfig.report.rl_launch import RLFramework, launch_line


def _args(line: str) -> dict[str, str]:
    """key -> value of a launch line's `key=value` overrides and `--flag value` pairs."""
    body = line.split("\n", 1)[1].replace("\\\n", " ")
    out: dict[str, str] = {}
    tokens = body.split()
    for i, tok in enumerate(tokens):
        if "=" in tok and not tok.startswith("-"):
            key, value = tok.split("=", 1)
            out[key] = value
        elif tok.startswith("--"):
            nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
            out[tok] = "" if nxt.startswith("--") or not nxt else nxt
    return out


@pytest.fixture(scope="module")
def plans():
    return api.rl("qwen3-32b", 64, "h100-sxm-80gb", top=None, gpu_hour_usd=2.0)


def _rank_of(plans, placement: str, pp_one: bool = False) -> int:
    table = plans.table
    rows = table[table["placement"] == placement]
    if pp_one:
        rows = rows[rows["train_pp"] == 1]
    return int(rows["rank"].iloc[0])


def test_cost_of_1000_steps_follows_step_time_and_gpus(plans):
    t = plans.table
    gpus = t["train_gpus"].where(t["placement"] == "colocated", t["train_gpus"] + t["rollout_gpus"])
    assert (t["gpu_hours_per_1000_steps"] - t["step_s"] * gpus / 3.6).abs().max() < 1e-6
    assert (t["usd_per_1000_steps"] - 2.0 * t["gpu_hours_per_1000_steps"]).abs().max() < 1e-6


def test_no_price_no_dollar_column():
    t = api.rl("qwen3-32b", 64, "h100-sxm-80gb", top=3).table
    assert "usd_per_1000_steps" not in t.columns
    assert (t["gpu_hours_per_1000_steps"] > 0).all()


def test_bad_price_names_the_field():
    with pytest.raises(UserError, match="gpu-hour-usd"):
        api.rl("qwen3-32b", 64, "h100-sxm-80gb", gpu_hour_usd=-1)


@pytest.mark.parametrize("placement", ["colocated", "async", "disaggregated"])
def test_nemo_rl_line_carries_the_plan(plans, placement):
    rank = _rank_of(plans, placement)
    step = plans.steps[rank - 1]
    a = _args(launch_line(plans, "nemo-rl", rank))
    assert a["policy.megatron_cfg.tensor_model_parallel_size"] == str(step.plan.train.tp)
    assert a["policy.megatron_cfg.pipeline_model_parallel_size"] == str(step.plan.train.pp)
    assert a["policy.generation.vllm_cfg.tensor_parallel_size"] == str(step.plan.rollout_tp)
    assert a["grpo.num_prompts_per_step"] == "64"
    assert a["grpo.num_generations_per_prompt"] == "16"
    nodes, per_node = int(a["cluster.num_nodes"]), int(a["cluster.gpus_per_node"])
    assert nodes * per_node == step.plan.total_gpus()
    colocated = a["policy.generation.colocated.enabled"] == "true"
    assert colocated == (placement == "colocated")
    if not colocated:
        gen_nodes = int(a["policy.generation.colocated.resources.num_nodes"])
        assert gen_nodes * per_node == step.plan.rollout_gpus
    assert ("grpo.async_grpo.enabled" in a) == (placement == "async")


def test_verl_colocated_and_one_step_off(plans):
    colocated = launch_line(plans, RLFramework.VERL, _rank_of(plans, "colocated"))
    assert "verl.trainer.main_ppo --config-name ppo_megatron_trainer" in colocated
    rank = _rank_of(plans, "async")
    line = launch_line(plans, "verl", rank)
    assert "one_step_off_policy.main_ppo" in line
    a, plan = _args(line), plans.steps[rank - 1].plan
    rollout = int(a["rollout.nnodes"]) * int(a["rollout.n_gpus_per_node"])
    train = int(a["trainer.nnodes"]) * int(a["trainer.n_gpus_per_node"])
    assert (rollout, train) == (plan.rollout_gpus, plan.train_gpus)
    assert a["actor_rollout_ref.rollout.n"] == "16"
    # verl refuses to start without a micro-batch size or a token budget
    assert a["actor_rollout_ref.actor.use_dynamic_bsz"] == "True"
    assert int(a["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"]) >= 256 + 4096
    assert a["actor_rollout_ref.rollout.tensor_model_parallel_size"] == str(plan.rollout_tp)


def test_verl_refuses_lock_step_separate_pools(plans):
    with pytest.raises(UserError, match=r"^emit: verl cannot run plan .*lock-step"):
        launch_line(plans, "verl", _rank_of(plans, "disaggregated"))


def test_openrlhf_engines_and_deepspeed_layout(plans):
    rank = _rank_of(plans, "async", pp_one=True)
    plan = plans.steps[rank - 1].plan
    a = _args(launch_line(plans, "openrlhf", rank))
    assert int(a["--vllm.num_engines"]) * int(a["--vllm.tensor_parallel_size"]) == (
        plan.rollout_gpus
    )
    assert int(a["--actor.num_nodes"]) * int(a["--actor.num_gpus_per_node"]) == plan.train_gpus
    assert a["--ds.tensor_parallel_size"] == str(plan.train.tp)
    assert "--train.async_enable" in a and "--train.colocate_all" not in a
    assert a["--algo.advantage.estimator"] == "group_norm"


def test_openrlhf_refuses_pipeline_parallel_trainers(plans):
    table = plans.table
    rank = int(table[table["train_pp"] > 1]["rank"].iloc[0])
    with pytest.raises(UserError, match="DeepSpeed trains without pipeline"):
        launch_line(plans, "openrlhf", rank)


def test_model_path_left_to_the_shell(plans):
    line = launch_line(plans, "openrlhf", _rank_of(plans, "async", pp_one=True))
    assert re.search(r"--actor.model_name_or_path \$MODEL_PATH\b", line)
    assert "'$MODEL_PATH'" not in line


def test_rank_out_of_range(plans):
    with pytest.raises(UserError, match="emit-rank: plans are ranked 1 to"):
        launch_line(plans, "verl", len(plans.steps) + 1)


def test_ppo_has_no_nemo_rl_recipe():
    ppo = api.rl("qwen3-32b", 64, "h100-sxm-80gb", algorithm="ppo", top=2)
    with pytest.raises(UserError, match=r"nemo-rl cannot run plan .*critic"):
        launch_line(ppo, "nemo-rl", 1)


def test_framework_sets_the_engines_memory_share_and_the_line_carries_it():
    from autoconfig.rl.frameworks import ENGINE_MEMORY_FRACTION, RLFramework

    shares = {}
    for fw in RLFramework:
        plans = api.rl("qwen3-32b", 64, "h100-sxm-80gb", top=3, framework=fw.value)
        assert plans.job.engine_memory_fraction == ENGINE_MEMORY_FRACTION[fw]
        shares[fw] = plans.steps[0].rollout.kv_tokens
    # a larger share holds more K/V tokens per replica
    assert shares[RLFramework.OPENRLHF] > shares[RLFramework.NEMO_RL] > shares[RLFramework.VERL]
    plans = api.rl("qwen3-32b", 64, "h100-sxm-80gb", top=1, gpu_memory_utilization=0.7)
    assert (
        _args(launch_line(plans, "nemo-rl", 1))["policy.generation.vllm_cfg.gpu_memory_utilization"]
        == "0.7"
    )


def test_smaller_engine_share_slows_a_kv_bound_rollout():
    big = api.rl("qwen3-32b", 32, "h100-sxm-80gb", top=None, gpu_memory_utilization=0.95)
    small = api.rl("qwen3-32b", 32, "h100-sxm-80gb", top=None, gpu_memory_utilization=0.45)

    def rollout_of(plans, label):
        return next(s.rollout for s in plans.steps if s.plan.label() == label)

    label = big.steps[0].plan.label()
    assert rollout_of(small, label).running < rollout_of(big, label).running
    assert rollout_of(small, label).seconds > rollout_of(big, label).seconds


@pytest.mark.parametrize("bad", [0.01, 1.5])
def test_bad_memory_share_names_the_field(bad):
    with pytest.raises(UserError, match="gpu-memory-utilization"):
        api.rl("qwen3-32b", 64, "h100-sxm-80gb", gpu_memory_utilization=bad)


def test_unknown_framework_names_the_allowed():
    with pytest.raises(UserError, match="rl-framework: must be nemo-rl, verl or openrlhf"):
        api.rl("qwen3-32b", 64, "h100-sxm-80gb", framework="trl")


def test_cli_emits_the_fastest_plan_the_framework_runs_and_prices_the_steps():
    result = run(
        "rl", "--model", "qwen3-32b", "--gpus", "64", "--top", "6", "--gpu-hour-usd", "3",
        "--emit", "openrlhf",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "GPU-hours per 1,000 steps ($" in result.stdout
    header = re.search(r"# openrlhf: plan #(\d+), (.*)", result.stdout)
    assert header, result.stdout
    plan_line = re.search(rf"#{header.group(1)} (.*?):", result.stdout)
    assert plan_line and plan_line.group(1) == header.group(2)
    assert "pp1" in header.group(2)  # OpenRLHF's DeepSpeed runs no pipeline
    # NeMo-RL's, verl's or OpenRLHF's default share: --emit names the framework
    assert "--vllm.gpu_memory_utilization 0.95" in result.stdout


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (("--emit", "trl"), ("emit: must be nemo-rl, verl or openrlhf", "'trl'")),
        (("--rl-framework", "trl"), ("rl-framework: must be nemo-rl",)),
        (("--gpu-memory-utilization", "2"), ("gpu-memory-utilization",)),
        (("--gpu-hour-usd", "-3"), ("gpu-hour-usd",)),
        (("--emit", "verl", "--emit-rank", "99"), ("emit-rank", "ranked 1 to")),
    ],
)
def test_cli_bad_rl_output_flags(flags, needles):
    result = run("rl", "--model", "qwen3-32b", "--gpus", "64", "--top", "3", *flags)
    assert_user_error(result, *needles)
