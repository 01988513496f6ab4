"""The launch line of a ranked RL plan in the configuration keys of the framework that runs it:
NeMo-RL, verl or OpenRLHF, so the placement, the rollout engines' tp and count, the trainer's
layout and the batch the plan was timed on are what the framework is told.

Versions followed:
- verl 0.9.1: Hydra overrides of `trainer/config/ppo_megatron_trainer.yaml` (colocated, its
  hybrid engine) and of `experimental/one_step_off_policy/config/
  one_step_off_ppo_megatron_trainer.yaml` (separate pools, one step of staleness: `rollout.*`
  sizes the generation pool, `trainer.*` the training pool);
- OpenRLHF 0.11.2: the flags of `openrlhf.cli.train_ppo_ray` (`--actor.*`, `--vllm.*`,
  `--train.colocate_all`, `--train.async_enable`, `--ds.*`);
- NeMo-RL (GRPO with the Megatron backend): OmegaConf overrides of its GRPO example config
  (`grpo.num_prompts_per_step`, `policy.megatron_cfg.*`, `policy.generation.vllm_cfg.*`,
  `policy.generation.colocated.*`, `grpo.async_grpo.*`, `cluster.*`).

What a framework cannot run is refused with one line naming the plan's field: OpenRLHF trains
with DeepSpeed (no pipeline or expert parallelism); verl's recipes run colocated or one step
off-policy; NeMo-RL plans GRPO-family algorithms without a critic.
"""

from __future__ import annotations

import shlex

from autoconfig.base.errors import UserError
from autoconfig.rl.frameworks import RLFramework, engine_memory_fraction
from autoconfig.rl.job import Algorithm, Job, Placement
from autoconfig.rl.plan import RLPlans
from autoconfig.rl.step import StepEstimate

MODEL_VAR = "MODEL_PATH"  # the checkpoint: an environment variable the user sets
VERL_TOKENS_PER_GPU = 16384  # verl 0.9.1 actor.ppo_max_token_len_per_gpu default


def _nodes(gpus: int, per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node) of a pool: whole nodes, or part of one; a pool over several nodes
    that does not fill them is refused (the frameworks start as many ranks on every node)."""
    if gpus <= per_node:
        return 1, gpus
    if gpus % per_node:
        raise UserError(
            f"emit: a pool of {gpus} GPUs does not fill whole nodes of {per_node}; the "
            "frameworks place the same number of GPUs on every node"
        )
    return gpus // per_node, per_node


def _refuse(step: StepEstimate, framework: RLFramework, why: str) -> UserError:
    return UserError(f"emit: {framework.value} cannot run plan '{step.plan.label()}': {why}")


def _nemo_rl(job: Job, step: StepEstimate) -> list[str]:
    plan, lay = step.plan, step.plan.train
    if job.algorithm.has_critic:
        raise _refuse(step, RLFramework.NEMO_RL, "its GRPO recipes train no critic (ppo)")
    per_node = job.cluster.gpus_per_node
    nodes, gpus_per_node = _nodes(plan.total_gpus(), per_node)
    out = [
        f"policy.model_name=${MODEL_VAR}",
        f"grpo.num_prompts_per_step={job.prompts}",
        f"grpo.num_generations_per_prompt={job.samples}",
        f"policy.train_global_batch_size={job.sequences}",
        f"policy.max_total_sequence_length={job.prompt_tokens + int(job.lengths.max_tokens)}",
        "policy.dtensor_cfg.enabled=false",
        "policy.megatron_cfg.enabled=true",
        f"policy.megatron_cfg.tensor_model_parallel_size={lay.tp}",
        f"policy.megatron_cfg.pipeline_model_parallel_size={lay.pp}",
        f"policy.megatron_cfg.context_parallel_size={lay.cp}",
        f"policy.megatron_cfg.expert_model_parallel_size={lay.ep}",
        f"policy.megatron_cfg.sequence_parallel={str(lay.tp > 1).lower()}",
        f"policy.megatron_cfg.activation_checkpointing={_recomputes(step)}",
        "policy.sequence_packing.enabled=true",
        "policy.generation.backend=vllm",
        f"policy.generation.vllm_cfg.tensor_parallel_size={plan.rollout_tp}",
        f"policy.generation.vllm_cfg.gpu_memory_utilization={_share(job)}",
        f"cluster.num_nodes={nodes}",
        f"cluster.gpus_per_node={gpus_per_node}",
    ]
    if plan.placement is Placement.COLOCATED:
        return [*out, "policy.generation.colocated.enabled=true"]
    out.append("policy.generation.colocated.enabled=false")
    # One node split between the roles names GPUs; several nodes give generation whole nodes.
    if nodes == 1:
        out.append(f"policy.generation.colocated.resources.gpus_per_node={plan.rollout_gpus}")
    else:
        out.append(
            f"policy.generation.colocated.resources.num_nodes={plan.rollout_gpus // per_node}"
        )
    if plan.placement is Placement.ASYNC:
        out += [
            "grpo.async_grpo.enabled=true",
            f"grpo.async_grpo.max_trajectory_age_steps={plan.staleness}",
            "policy.generation.vllm_cfg.async_engine=true",
        ]
    return out


def _share(job: Job) -> str:
    """The engine's share of GPU memory the plan was timed with."""
    share = job.engine_memory_fraction
    return f"{engine_memory_fraction(None) if share is None else share:g}"


def _token_budget(job: Job) -> int:
    """verl's per-GPU token budget of a packed micro-batch: its default 16,384, or one whole
    sequence when that is longer."""
    return max(VERL_TOKENS_PER_GPU, job.prompt_tokens + int(job.lengths.max_tokens))


def _recomputes(step: StepEstimate) -> str:
    return str(step.update.recompute == "full").lower()


def _verl(job: Job, step: StepEstimate) -> tuple[str, list[str]]:
    plan, lay = step.plan, step.plan.train
    per_node = job.cluster.gpus_per_node
    if plan.placement is Placement.DISAGGREGATED:
        raise _refuse(
            step,
            RLFramework.VERL,
            "its recipes run colocated or one step off-policy, not "
            "separate pools in lock-step (try --placement colocated or async)",
        )
    if plan.placement is Placement.ASYNC and plan.staleness != 1:
        raise _refuse(
            step,
            RLFramework.VERL,
            f"its one-step-off-policy recipe lags one step, the plan "
            f"{plan.staleness} (try --staleness 1)",
        )
    estimator = "gae" if job.algorithm.has_critic else "grpo"
    megatron = "actor_rollout_ref.actor.megatron"
    out = [
        f"algorithm.adv_estimator={estimator}",
        f"data.train_batch_size={job.prompts}",
        f"data.max_prompt_length={job.prompt_tokens}",
        f"data.max_response_length={int(job.lengths.max_tokens)}",
        f"actor_rollout_ref.model.path=${MODEL_VAR}",
        # one policy update per step, as the plan was timed
        f"actor_rollout_ref.actor.ppo_mini_batch_size={job.prompts}",
        # micro-batches packed to a token budget (verl requires a micro-batch size or this):
        # at least one whole sequence, verl's default budget otherwise; the reference's and the
        # rollout's log-prob passes and the critic follow the actor's setting
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={_token_budget(job)}",
        f"actor_rollout_ref.actor.use_kl_loss={str(job.reference).lower()}",
        f"{megatron}.tensor_model_parallel_size={lay.tp}",
        f"{megatron}.pipeline_model_parallel_size={lay.pp}",
        f"{megatron}.context_parallel_size={lay.cp}",
        f"{megatron}.expert_model_parallel_size={lay.ep}",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.n={job.samples}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={plan.rollout_tp}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={_share(job)}",
    ]
    if step.update.recompute == "full":
        out += [
            f"{megatron}.override_transformer_config.recompute_granularity=full",
            f"{megatron}.override_transformer_config.recompute_method=uniform",
            f"{megatron}.override_transformer_config.recompute_num_layers=1",
        ]
    if job.algorithm.has_critic:
        out += [
            f"critic.ppo_max_token_len_per_gpu={_token_budget(job)}",
            f"critic.model.path=${MODEL_VAR}",
            f"critic.megatron.tensor_model_parallel_size={lay.tp}",
            f"critic.megatron.pipeline_model_parallel_size={lay.pp}",
        ]
    if plan.placement is Placement.COLOCATED:
        nodes, gpus_per_node = _nodes(plan.total_gpus(), per_node)
        module, config = "verl.trainer.main_ppo", "ppo_megatron_trainer"
        out += [f"trainer.nnodes={nodes}", f"trainer.n_gpus_per_node={gpus_per_node}"]
    else:
        module = "verl.experimental.one_step_off_policy.main_ppo"
        config = "one_step_off_ppo_megatron_trainer"
        r_nodes, r_per_node = _nodes(plan.rollout_gpus, per_node)
        t_nodes, t_per_node = _nodes(plan.train_gpus, per_node)
        out += [
            f"rollout.nnodes={r_nodes}",
            f"rollout.n_gpus_per_node={r_per_node}",
            f"trainer.nnodes={t_nodes}",
            f"trainer.n_gpus_per_node={t_per_node}",
        ]
    return f"python3 -m {module} --config-name {config}", out


def _openrlhf(job: Job, step: StepEstimate) -> list[str]:
    plan, lay = step.plan, step.plan.train
    if lay.pp > 1 or lay.ep > 1:
        raise _refuse(
            step,
            RLFramework.OPENRLHF,
            f"DeepSpeed trains without pipeline or expert "
            f"parallelism (the plan's trainer has pp {lay.pp}, ep {lay.ep})",
        )
    if job.algorithm.has_critic and plan.placement is not Placement.COLOCATED:
        raise _refuse(
            step,
            RLFramework.OPENRLHF,
            "the critic gets GPUs of its own unless every model is "
            "colocated (try --placement colocated)",
        )
    per_node = job.cluster.gpus_per_node
    t_nodes, t_per_node = _nodes(plan.train_gpus, per_node)
    estimator = {Algorithm.PPO: "gae", Algorithm.GRPO: "group_norm", Algorithm.DAPO: "group_norm"}
    out = [
        f"--actor.model_name_or_path ${MODEL_VAR}",
        f"--actor.num_nodes {t_nodes}",
        f"--actor.num_gpus_per_node {t_per_node}",
        f"--vllm.num_engines {plan.replicas}",
        f"--vllm.tensor_parallel_size {plan.rollout_tp}",
        f"--vllm.gpu_memory_utilization {_share(job)}",
        f"--rollout.batch_size {job.prompts}",
        f"--rollout.n_samples_per_prompt {job.samples}",
        f"--rollout.max_new_tokens {int(job.lengths.max_tokens)}",
        f"--data.max_len {job.prompt_tokens + int(job.lengths.max_tokens)}",
        f"--train.batch_size {job.sequences}",
        f"--algo.advantage.estimator {estimator[job.algorithm]}",
        # ZeRO-3 shards the weights; DeepSpeed's tensor-parallel training (AutoTP) combines
        # with ZeRO 1 and 2 only
        f"--ds.zero_stage {3 if lay.tp == 1 else 2}",
        f"--ds.tensor_parallel_size {lay.tp}",
        f"--ds.ring_attn_size {lay.cp}",
        "--ds.packing_samples",
    ]
    if job.reference:
        # the reference's log-probs run on the training GPUs, as the plan times them
        out += [f"--ref.num_nodes {t_nodes}", f"--ref.num_gpus_per_node {t_per_node}"]
        if plan.placement is not Placement.COLOCATED:
            out.append("--train.colocate_actor_ref")
    else:
        out.append("--algo.kl.init_coef 0")
    if job.algorithm.has_critic:
        out += [
            f"--critic.model_name_or_path ${MODEL_VAR}",
            f"--critic.num_nodes {t_nodes}",
            f"--critic.num_gpus_per_node {t_per_node}",
        ]
    if step.update.recompute == "full":
        out.append("--actor.gradient_checkpointing_enable")
    if plan.placement is Placement.COLOCATED:
        out += ["--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep"]
    elif plan.placement is Placement.ASYNC:
        # a queue of k rollout batches lets the sampler run k steps ahead of the trainer
        out += ["--train.async_enable", f"--train.async_queue_size {plan.staleness}"]
    return out


def launch_line(plans: RLPlans, framework: RLFramework | str, rank: int = 1) -> str:
    """The shell command that runs plan `rank` (1 = the fastest) with `framework`; the
    checkpoint is read from $MODEL_PATH. Raises UserError naming the field when the rank does
    not exist or the framework cannot run the plan."""
    framework = RLFramework.parse(framework, "emit")
    if not 1 <= rank <= len(plans.steps):
        raise UserError(f"emit-rank: plans are ranked 1 to {len(plans.steps)} (got {rank})")
    step, job = plans.steps[rank - 1], plans.job
    if framework is RLFramework.NEMO_RL:
        head, args = "uv run examples/run_grpo_math.py", _nemo_rl(job, step)
    elif framework is RLFramework.VERL:
        head, args = _verl(job, step)
    else:
        head, args = "python3 -m openrlhf.cli.train_ppo_ray", _openrlhf(job, step)
    # $MODEL_PATH stays unquoted so the shell expands it
    quoted = [
        " ".join(part if "$" in part else shlex.quote(part) for part in arg.split(" ", 1))
        for arg in args
    ]
    return f"# {framework.value}: plan #{rank}, {step.plan.label()}\n" + " \\\n  ".join(
        [head, *quoted]
    )


def fastest_runnable(plans: RLPlans, framework: RLFramework | str) -> int:
    """The rank of the fastest plan `framework` can run; the UserError of the fastest plan when
    it runs none of them."""
    for rank in range(1, len(plans.steps) + 1):
        try:
            launch_line(plans, framework, rank)
        except UserError:
            continue
        return rank
    launch_line(plans, framework, 1)  # raises: the fastest plan's reason
    raise UserError(f"emit: no plan to write for {RLFramework.parse(framework, 'emit')}")
