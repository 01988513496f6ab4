"""What an RL post-training step is asked to do (the job) and where it runs (the plan): the
algorithm, the rollout batch and its lengths, the placement of the two roles on the GPUs, the
rollout engine's tensor parallelism and the trainer's layout; each checked with one line
naming the field that is wrong."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from autoconfig.base.errors import UserError
from autoconfig.rl.lengths import ResponseLengths
from autoconfig.spec.schema import ClusterSpec, GPUSpec, ModelSpec


class Algorithm(str, Enum):
    """The policy-gradient recipes planned. GRPO and DAPO score a group of samples per prompt
    against each other and train no value model (Shao et al. 2024; Yu et al. 2025); PPO trains a
    critic beside the actor and scores with a reward model (Ouyang et al. 2022)."""

    GRPO = "grpo"
    DAPO = "dapo"
    PPO = "ppo"

    @property
    def has_critic(self) -> bool:
        return self is Algorithm.PPO

    @classmethod
    def parse(cls, text: str, field: str = "algorithm") -> Algorithm:
        key = str(text).strip().lower().split(" ")[0]
        for member in cls:
            if member.value == key:
                return member
        allowed = ", ".join(m.value for m in cls)
        raise UserError(f"{field}: unknown algorithm '{text}'; allowed: {allowed}")


class Placement(str, Enum):
    """How the rollout engines and the trainer share the GPUs."""

    COLOCATED = "colocated"  # every GPU generates, then trains (time-sharing)
    DISAGGREGATED = "disaggregated"  # separate pools, lock-step (on-policy)
    ASYNC = "async"  # separate pools, rollouts k steps behind the trainer

    @classmethod
    def parse(cls, text: str, field: str = "placement") -> Placement:
        key = str(text).strip().lower()
        for member in cls:
            if member.value == key:
                return member
        allowed = ", ".join(m.value for m in cls)
        raise UserError(f"{field}: unknown placement '{text}'; allowed: {allowed}")


@dataclass(frozen=True)
class Job:
    """One RL step's work: `prompts` x `samples` sequences of a `prompt_tokens` prompt and a
    response drawn from `lengths`, on `gpus` GPUs of one type."""

    model: ModelSpec
    gpu: GPUSpec
    cluster: ClusterSpec
    gpus: int
    algorithm: Algorithm
    prompts: int
    samples: int
    prompt_tokens: int
    lengths: ResponseLengths
    critic: ModelSpec | None = None  # PPO's value model (the actor's shape when not given)
    reference: bool = True  # a KL penalty against a frozen reference policy
    precision: str = "bf16"  # training and generation (fp8: both, as NeMo-RL's FP8 recipes)
    # the share of a rollout GPU's memory the engine takes (vLLM's gpu_memory_utilization);
    # None: vLLM's own default (autoconfig.rl.frameworks)
    engine_memory_fraction: float | None = None

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples

    @property
    def tokens(self) -> float:
        """Tokens processed per step (prompt + response of every sequence): NeMo-RL's
        'Total Tokens Processed'."""
        return self.sequences * (self.prompt_tokens + self.lengths.mean_tokens)

    def checked(self) -> Job:
        """The job, or a UserError naming the first bad field."""
        for name, value in (("prompts", self.prompts), ("gpus", self.gpus)):
            if value < 1:
                raise UserError(f"{name}: must be at least 1 (got {value})")
        if self.samples < 1:
            raise UserError(f"samples: samples per prompt must be at least 1 (got {self.samples})")
        if self.prompt_tokens < 1:
            raise UserError(f"prompt-len: must be at least 1 token (got {self.prompt_tokens})")
        longest, mean = self.lengths.max_tokens, self.lengths.mean_tokens
        if longest < 1:
            raise UserError(f"max-response-len: must be at least 1 token (got {longest:g})")
        if not 1 <= mean <= longest:
            raise UserError(
                f"mean-response-len: must be between 1 and the maximum {longest:g} (got {mean:g})"
            )
        context = self.model.max_seq_len
        if context and self.prompt_tokens + longest > context:
            raise UserError(
                f"max-response-len: a {self.prompt_tokens}-token prompt plus {longest:g} "
                f"response tokens exceed {self.model.name}'s context of {context:,}"
            )
        share = self.engine_memory_fraction
        if share is not None and not 0.05 <= share <= 1.0:
            raise UserError(
                f"gpu-memory-utilization: the engine's share of a GPU's memory is between "
                f"0.05 and 1 (got {share:g})"
            )
        if self.critic is not None and not self.algorithm.has_critic:
            raise UserError(
                f"critic: {self.algorithm.value} trains no value model; drop --critic "
                "(or use --algorithm ppo)"
            )
        return self


@dataclass(frozen=True)
class TrainLayout:
    """The trainer's parallel layout on its GPUs (dp follows: train GPUs / (tp*pp*cp))."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    def label(self) -> str:
        parts = [f"tp{self.tp}", f"pp{self.pp}"]
        parts += [f"cp{self.cp}"] if self.cp > 1 else []
        parts += [f"ep{self.ep}"] if self.ep > 1 else []
        return " ".join(parts)


@dataclass(frozen=True)
class Plan:
    """Where a step runs: the placement, the GPUs of each role (all of them for both when
    colocated), the engines' tensor parallelism, the trainer's layout and, for async, the
    steps of staleness allowed."""

    placement: Placement
    rollout_gpus: int
    train_gpus: int
    rollout_tp: int
    train: TrainLayout
    staleness: int = 0
    max_num_seqs: int = 256  # vLLM's default running-batch limit

    @property
    def replicas(self) -> int:
        return self.rollout_gpus // self.rollout_tp

    def total_gpus(self) -> int:
        if self.placement is Placement.COLOCATED:
            return max(self.rollout_gpus, self.train_gpus)
        return self.rollout_gpus + self.train_gpus

    def label(self) -> str:
        where = {
            Placement.COLOCATED: "colocated",
            Placement.DISAGGREGATED: f"disaggregated {self.rollout_gpus}/{self.train_gpus}",
            Placement.ASYNC: f"async-{self.staleness} {self.rollout_gpus}/{self.train_gpus}",
        }[self.placement]
        return f"{where}, rollout tp{self.rollout_tp} x{self.replicas}, train {self.train.label()}"

    def checked(self, job: Job) -> Plan:
        """The plan, or a UserError naming the first field that leaves a role without GPUs or
        does not divide them."""
        if self.rollout_gpus < 1:
            raise UserError(
                f"rollout-gpus: the placement leaves no GPU to rollouts (got {self.rollout_gpus})"
            )
        if self.train_gpus < 1:
            raise UserError(
                f"train-gpus: the placement leaves no GPU to training (got {self.train_gpus})"
            )
        if self.total_gpus() > job.gpus:
            raise UserError(
                f"rollout-gpus: {self.rollout_gpus} rollout + {self.train_gpus} training GPUs "
                f"exceed the {job.gpus} GPUs"
            )
        if self.placement is Placement.ASYNC and self.staleness < 1:
            raise UserError(f"staleness: async needs at least 1 step (got {self.staleness})")
        if self.rollout_tp < 1 or self.rollout_gpus % self.rollout_tp:
            raise UserError(
                f"rollout-tp: {self.rollout_tp} does not divide the {self.rollout_gpus} "
                "rollout GPUs"
            )
        if self.train_gpus % self.train.model_parallel:
            raise UserError(
                f"train-layout: tp*pp*cp = {self.train.model_parallel} does not divide the "
                f"{self.train_gpus} training GPUs"
            )
        return self
