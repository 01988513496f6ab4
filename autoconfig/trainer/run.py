"""One rank of a trainer run: set up the layout, train a few steps on synthetic tokens, time
them, measure memory, and write this rank's result (rank0 assembles metrics.json)."""

from __future__ import annotations

import os
import platform
import resource
import signal
import socket
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule

from autoconfig.base.errors import UserError
from autoconfig.base.fileio import write_json
from autoconfig.trainer import lora, nf4, ops
from autoconfig.trainer.assemble import assemble
from autoconfig.trainer.config import TrainConfig
from autoconfig.trainer.context import chunk_positions
from autoconfig.trainer.experts import MoE, RoutingCounts
from autoconfig.trainer.generate import generate_rank
from autoconfig.trainer.mesh import build_meshes
from autoconfig.trainer.metrics import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_OOM,
    Environment,
    RankMemory,
)
from autoconfig.trainer.model import Transformer
from autoconfig.trainer.packing import DOCUMENT_STREAM, document_ids
from autoconfig.trainer.parallel import (
    apply_cp,
    apply_dp,
    apply_ep,
    apply_recompute,
    apply_tp,
    make_optimizer,
    reduce_on_last,
)


def rank_env() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's variables, else SLURM's (srun)."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0))
    if "SLURM_PROCID" in env:
        rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        env.setdefault("MASTER_ADDR", env.get("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1"))
        env.setdefault("MASTER_PORT", str(29500 + int(env.get("SLURM_JOB_ID", "0")) % 1000))
        env["RANK"], env["WORLD_SIZE"] = str(rank), str(world)
        return rank, world, int(env.get("SLURM_LOCALID", 0))
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", "29500")
    env["RANK"], env["WORLD_SIZE"] = "0", "1"
    return 0, 1, 0


def synthetic_batch(cfg: TrainConfig, step: int, vocab: int, seq: int) -> torch.Tensor:
    """The global batch of step `step`: seeded, identical whatever the layout."""
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + step)
    return torch.randint(0, vocab, (cfg.global_batch, seq + 1), generator=gen)


def synthetic_documents(cfg: TrainConfig, step: int, seq: int) -> torch.Tensor | None:
    """The document ids of step `step`'s global batch (packing.document_ids), identical
    whatever the layout; None when every sequence is one document."""
    docs = cfg.documents()
    if docs is None:
        return None
    return document_ids(docs, cfg.global_batch, seq, cfg.seed * 1000 + step + DOCUMENT_STREAM)


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1))


def rank_device(cfg: TrainConfig, local_rank: int) -> torch.device:
    """This rank's device, selected and capped at cfg.memory_limit_gib."""
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise UserError("device: cuda requested but no GPU is visible")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    limit_memory(cfg, device)
    return device


class Rank:
    """The state of one rank: its mesh coordinates, stage modules and optimizer."""

    def __init__(self, cfg: TrainConfig, rank: int, world: int, local_rank: int) -> None:
        self.cfg, self.rank, self.world = cfg, rank, world
        self.spec = cfg.trained_spec()
        self.seq = cfg.seq(self.spec)
        self.device = rank_device(cfg, local_rank)
        use_cuda = self.device.type == "cuda"
        self.bf16 = use_cuda and cfg.precision in ("auto", "bf16")
        self.cpu_bf16 = not use_cuda and cfg.precision == "bf16"
        moe = self.spec.is_moe
        self.mesh = build_meshes(cfg, self.device.type, moe) if world > 1 else None
        coords = self.mesh.world.get_coordinate() if self.mesh is not None else [0, 0, 0, 0]
        self.pp_rank, self.dp_rank, self.cp_rank, self.tp_rank = coords
        self.chunks = self._build_chunks()
        self.optimizer = make_optimizer(self.chunks, cfg, self.mesh)
        self.schedule = self._build_schedule() if cfg.pp > 1 else None
        self.tied_group = self._tied_group()
        self.counter = ops.SavedBytes()

    # -- construction -------------------------------------------------------------------
    @property
    def param_dtype(self) -> torch.dtype:
        """Weights and the residual stream (fp32 master weights under GPU autocast)."""
        return torch.bfloat16 if self.cpu_bf16 else torch.float32

    @property
    def activation_dtype(self) -> torch.dtype:
        """What the linears output (bf16 under GPU autocast)."""
        return torch.bfloat16 if self.bf16 or self.cpu_bf16 else torch.float32

    def _stage_ids(self) -> list[int]:
        """Interleaving: rank r holds stages r, r+pp, ... (Megatron's virtual pipeline)."""
        return [c * self.cfg.pp + self.pp_rank for c in range(self.cfg.vp)]

    def _build_chunks(self) -> list[torch.nn.Module]:
        cfg, spec = self.cfg, self.spec
        stages = cfg.pp * cfg.vp
        chunks = []
        for s in self._stage_ids():
            ids = cfg.stage_layer_ids(spec.layers, s)
            model = Transformer(
                spec,
                self.seq,
                ids,
                first=s == 0,
                last=s == stages - 1,
                capacity_factor=cfg.capacity_factor,
            )
            model.init_weights(cfg.seed)  # the full layers, then each layout keeps its share
            model.to(self.device, dtype=torch.bfloat16 if self.cpu_bf16 else None)
            if cfg.adapters:  # full-width adapters, split with the base weights below
                lora.attach(model, cfg.lora_rank, cfg.alpha, cfg.lora_targets, cfg.seed)
            if cfg.ep > 1 and self.mesh is not None:
                apply_ep(model, self.mesh.ep)
            if cfg.tp > 1 and self.mesh is not None:
                apply_tp(model, self.mesh["tp"], cfg.sp, whole_experts=cfg.whole_experts)
            if cfg.cp > 1 and self.mesh is not None:
                apply_cp(model, self.mesh["cp"], self.seq, self.activation_dtype)
            if cfg.quantized:  # each rank's shard of the layers' linear weights into NF4
                nf4.quantize_base(model)
            if cfg.adapters:  # before data parallelism, which wraps the trained weights only
                lora.freeze_base(model)
            apply_recompute(model, cfg)
            if cfg.compile:
                for block in model.layers.values():
                    block.compile()
            chunks.append(apply_dp(model, cfg, self.mesh, self.bf16) if self.mesh else model)
        return chunks

    def _build_schedule(self):
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleInterleaved1F1B,
        )

        cfg = self.cfg
        group = self.mesh["pp"].get_group()
        stages = [
            PipelineStage(
                chunk, s, cfg.pp * cfg.vp, self.device, *self._stage_shapes(s), group=group
            )
            for chunk, s in zip(self.chunks, self._stage_ids(), strict=True)
        ]
        if cfg.vp > 1:
            return ScheduleInterleaved1F1B(stages, cfg.micro_batches, loss_fn=loss_fn)
        return Schedule1F1B(stages[0], cfg.micro_batches, loss_fn=loss_fn)

    def _stage_shapes(self, stage: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(input, output) of one micro-batch on pipeline stage `stage`, as meta tensors, so
        the schedule need not infer them by running the stage on meta tensors (which MoE
        routing, with its data-dependent token counts, cannot)."""
        cfg, spec = self.cfg, self.spec
        local_seq = self.seq // cfg.cp
        between = (cfg.mbs, local_seq // cfg.tp if cfg.sp else local_seq, spec.hidden)
        # Activations flowing between stages carry gradients back; the tokens do not.
        hidden = torch.empty(between, dtype=self.param_dtype, device="meta", requires_grad=True)
        tokens = torch.empty((cfg.mbs, local_seq), dtype=torch.long, device="meta")
        logits = torch.empty((cfg.mbs, local_seq, spec.vocab), dtype=self.activation_dtype,
                             device="meta", requires_grad=True)  # fmt: skip
        last = cfg.pp * cfg.vp - 1
        return (tokens if stage == 0 else hidden), (logits if stage == last else hidden)

    def _tied_group(self) -> dist.ProcessGroup | None:
        """Tied embeddings across pipeline stages: the first and the last stage each keep a
        copy and sum their gradients (Megatron-LM's embedding group)."""
        if not (self.spec.tied_embeddings and self.cfg.pp > 1):
            return None
        mine = None
        ranks = self.mesh.world.mesh.reshape(self.cfg.pp, -1)
        for column in range(ranks.shape[1]):
            pair = [int(ranks[0, column]), int(ranks[-1, column])]
            group = dist.new_group(pair)
            if self.rank in pair:
                mine = group
        return mine

    # -- one step -----------------------------------------------------------------------
    def local_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This DP rank's sequences; with context parallelism, the tokens at its positions."""
        tokens = synthetic_batch(self.cfg, step, self.spec.vocab, self.seq)
        mine = self._dp_share(tokens)
        inputs, targets = mine[:, :-1], mine[:, 1:]
        if self.cfg.cp > 1:
            positions = chunk_positions(self.seq, self.cfg.cp, self.cp_rank)
            inputs, targets = inputs[:, positions], targets[:, positions]
        return inputs.contiguous().to(self.device), targets.contiguous().to(self.device)

    def _dp_share(self, batch: torch.Tensor) -> torch.Tensor:
        per_dp = self.cfg.global_batch // self.cfg.resolved_dp
        return batch[self.dp_rank * per_dp : (self.dp_rank + 1) * per_dp]

    def local_documents(self, step: int) -> dict[str, torch.Tensor]:
        """The model's keyword arguments for this DP rank's sequences: their document ids over
        the whole sequence (a context-parallel rank needs every key's document), or none."""
        docs = synthetic_documents(self.cfg, step, self.seq)
        return {} if docs is None else {"docs": self._dp_share(docs).to(self.device)}

    def step(self, step: int) -> float | None:
        """One optimizer step; returns the mean loss of this rank's micro-batches (None on
        ranks without the last stage)."""
        cfg = self.cfg
        inputs, targets = self.local_batch(step)
        docs = self.local_documents(step)  # split into micro-batches like the tokens
        autocast = torch.autocast("cuda", torch.bfloat16, enabled=self.bf16)
        loss = None
        with autocast:
            if self.schedule is not None:
                losses: list[torch.Tensor] = []
                is_first, is_last = self.pp_rank == 0, self.pp_rank == cfg.pp - 1
                args = (inputs,) if is_first else ()
                kwargs = {"target": targets, "losses": losses} if is_last else {}
                # Every stage takes the micro-batch's documents (the schedule splits keyword
                # arguments into micro-batches and hands them to each stage).
                self.schedule.step(*args, **kwargs, **docs)
                if is_last:
                    loss = float(torch.stack([x.detach().float() for x in losses]).mean())
            else:
                model = self.chunks[0]
                total = 0.0
                for i, mb in enumerate(range(0, inputs.shape[0], cfg.mbs)):
                    with reduce_on_last(model, last=i == cfg.micro_batches - 1):
                        batch = slice(mb, mb + cfg.mbs)
                        mine = {name: t[batch] for name, t in docs.items()}
                        mb_loss = loss_fn(model(inputs[batch], **mine), targets[batch])
                        (mb_loss / cfg.micro_batches).backward()
                    total += float(mb_loss.detach())
                loss = total / cfg.micro_batches
        self._sync_tied()
        self.grad_bytes = sum(
            _local_bytes(p.grad) for m in self.chunks for p in m.parameters() if p.grad is not None
        )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def _sync_tied(self) -> None:
        if self.tied_group is None:
            return
        for chunk in self.chunks:
            inner = getattr(chunk, "module", chunk)
            for module in (inner.tok_embeddings, inner.output):
                if module is not None and module.weight.grad is not None:
                    dist.all_reduce(ops.local_tensor(module.weight.grad), group=self.tied_group)

    def global_loss(self, loss: float | None) -> float:
        """The mean loss over the whole global batch, on every rank."""
        if self.world == 1:
            return float(loss)
        owner = self.pp_rank == self.cfg.pp - 1 and self.tp_rank == 0
        mine = loss if owner and loss is not None else 0.0
        value = torch.tensor([mine], dtype=torch.float64, device=self.device)
        dist.all_reduce(value)
        # dp*cp ranks each hold the mean over an equal share of the tokens.
        return float(value) / (self.cfg.resolved_dp * self.cfg.cp)

    def routing(self) -> tuple[int, int]:
        """(token-expert assignments routed, dropped) by the whole run's MoE layers since the
        last call; tp ranks route the same tokens, so only tp rank 0 counts."""
        moes = [m for chunk in self.chunks for m in chunk.modules() if isinstance(m, MoE)]
        mine = [sum(m.counts.routed for m in moes), sum(m.counts.dropped for m in moes)]
        for m in moes:
            m.counts = RoutingCounts()
        value = torch.tensor(mine if self.tp_rank == 0 else [0, 0], device=self.device)
        if self.world > 1:
            dist.all_reduce(value)
        return int(value[0]), int(value[1])

    # -- measurement ---------------------------------------------------------------------
    def memory(self, saved: int, per_layer: float) -> RankMemory:
        params = [p for m in self.chunks for p in m.parameters()]
        # qlora: the NF4 base weights (codes and block scales) are weights the rank holds,
        # counted in bytes as held and in parameters as the weights they stand for
        quantized = [q for m in self.chunks for q in nf4.quantized_linears(m)]
        state = getattr(self.optimizer, "optim", self.optimizer).state
        optim_bytes = sum(
            _local_bytes(v)
            for s in state.values()
            for name, v in s.items()
            if torch.is_tensor(v) and name != "step"  # Adam's step counters are scalars
        )
        cuda = self.device.type == "cuda"
        return RankMemory(
            rank=self.rank,
            pp_rank=self.pp_rank,
            peak_allocated_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
            parameter_bytes=sum(_local_bytes(p) for p in params)
            + sum(q.held_bytes() for q in quantized),
            gradient_bytes=getattr(self, "grad_bytes", 0),
            optimizer_bytes=optim_bytes,
            parameters=sum(ops.local_tensor(p).numel() for p in params)
            + sum(q.represented for q in quantized),
            saved_activation_bytes=saved,
            saved_activation_bytes_per_layer=per_layer,
        )


def _local_bytes(t: torch.Tensor) -> int:
    local = ops.local_tensor(t)
    return local.numel() * local.element_size()


class LayerProbe:
    """Counts what the first micro-batch's forward saves for backward, per layer and in all
    (one stage module per rank; interleaved chunks count their first chunk with layers)."""

    def __init__(self, counter: ops.SavedBytes, model: torch.nn.Module) -> None:
        self.counter, self.calls, self.handles = counter, 0, []
        inner = getattr(model, "module", model)
        counter.ignore_parameters(inner)
        self.layers = list(inner.layers.values())
        self.handles.append(inner.register_forward_pre_hook(self._start))
        self.handles.append(inner.register_forward_hook(self._stop))
        for i, block in enumerate(self.layers):
            self.handles.append(block.register_forward_pre_hook(self._enter(f"layer{i}", block)))
            self.handles.append(block.register_forward_hook(self._leave))
            for unit in block.modules():
                if unit is not block and isinstance(unit, FSDPModule):
                    # A nested FSDP unit (experts reduced over their own group) gathers its
                    # weights in its own pre-forward hook, which runs before this one.
                    self.handles.append(unit.register_forward_pre_hook(self._gathered(unit)))

    def _start(self, *_):
        if self.calls == 0:
            self.counter.stack = ["all"]

    def _stop(self, *_):
        self.calls += 1
        self.counter.stack = []

    def _enter(self, name: str, block: torch.nn.Module):
        def hook(*_):
            # FSDP has gathered the layer's weights by now: those are not activations.
            self.counter.transient_params = {
                ptr for p in block.parameters() for ptr, _ in ops.storages(p.data)
            }
            if self.counter.stack:
                self.counter.stack.append(name)

        return hook

    def _gathered(self, unit: torch.nn.Module):
        def hook(*_):
            self.counter.transient_params |= {
                ptr for p in unit.parameters() for ptr, _ in ops.storages(p.data)
            }

        return hook

    def _leave(self, *_):
        self.counter.transient_params = set()
        if len(self.counter.stack) > 1:
            self.counter.stack.pop()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def figures(self) -> tuple[int, float]:
        total = self.counter.by_region.get("all", 0)
        layers = [self.counter.by_region.get(f"layer{i}", 0) for i in range(len(self.layers))]
        return total, (sum(layers) / len(layers) if layers else 0.0)


class Interruption:
    """SIGINT (Ctrl-C) and SIGTERM (a launcher passing a signal on) while a rank runs. The
    first raises KeyboardInterrupt where the rank is, so it stops and writes the steps it
    finished; later ones (Ctrl-C reaches every rank, and the launcher repeats it) and any after
    disarm() are only noted, so the result file is written whole. Handlers are set only in the
    main thread (Python's rule) and the previous ones come back on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.received = False
        self.armed = True
        self.previous: dict[signal.Signals, object] = {}

    def __enter__(self) -> Interruption:
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def _handle(self, signum: int, frame: object) -> None:
        self.received = True
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt

    def disarm(self) -> None:
        self.armed = False


def train(cfg: TrainConfig, out: Path) -> int:
    """Run this rank; returns the process exit code. Each rank writes rank{r}.json; a rank
    stopped by Ctrl-C or SIGTERM writes the steps it finished, as interrupted."""
    rank, world, local_rank = rank_env()
    result: dict = {"rank": rank, "status": "error", "message": ""}
    done: dict[str, list[float]] = {"step_times_s": [], "losses": []}  # filled step by step
    started = False
    with Interruption() as stop:
        try:
            try:
                if cfg.world != world:
                    raise UserError(
                        f"world size: {world} processes but the layout needs tp*pp*dp*cp = "
                        f"{cfg.world}"
                    )
                if world > 1:
                    cuda = cfg.device != "cpu" and torch.cuda.is_available()
                    dist.init_process_group(
                        "nccl" if cuda else "gloo", timeout=timedelta(seconds=cfg.timeout_s)
                    )
                    started = True
                if cfg.task == "generate":
                    device = rank_device(cfg, local_rank)
                    fault = _injected_fault(cfg, rank)
                    result.update(generate_rank(cfg, rank, world, device, fault))
                else:
                    state = Rank(cfg, rank, world, local_rank)
                    state.fault = _injected_fault(cfg, rank)
                    result.update(train_loop(state, done))
                result["status"] = "ok"
                code = EXIT_OK
            except Exception as exc:  # any rank failure is data for the run, never a hang
                if stop.received:  # a peer that stopped first shows here as a lost connection
                    raise KeyboardInterrupt from None
                code = _failed(exc, result)
        except KeyboardInterrupt:
            stop.disarm()
            finished = len(done["losses"])
            message = f"interrupted after {finished} of {cfg.steps} steps"
            result.update(status="interrupted", message=message, **done)
            code = EXIT_INTERRUPTED
        stop.disarm()  # from here on a signal must not cut the result file short
        result["environment"] = environment(world).model_dump()
        write_json(out / f"rank{rank}.json", result)
        if started:
            code = _finish(cfg, out, rank, world, code)
    return code


def _failed(exc: Exception, result: dict) -> int:
    """The rank's result and exit code for a failure: oom, a refusal, or any other error."""
    if is_oom(exc):
        result.update(status="oom", message=str(exc).splitlines()[0][:500])
        return EXIT_OOM
    if isinstance(exc, UserError):
        result.update(status="error", message=str(exc))
        return EXIT_ERROR
    tail = traceback.format_exc().strip().splitlines()[-3:]
    result.update(status="error", message=f"{type(exc).__name__}: {exc}"[:500], trace=tail)
    return EXIT_ERROR


def _finish(cfg: TrainConfig, out: Path, rank: int, world: int, code: int) -> int:
    """After every rank wrote its result: rank 0 assembles metrics.json once all finished,
    and the process group closes. A peer that stopped or failed breaks the barrier; its own
    result says why, and the launcher assembles metrics.json from what the ranks left."""
    try:
        if code == EXIT_OK:
            dist.barrier()
            if rank == 0:
                assemble(cfg, out, world)
        dist.destroy_process_group()
    except Exception:
        return EXIT_ERROR if code == EXIT_OK else code
    return code


def train_loop(state: Rank, done: dict[str, list[float]] | None = None) -> dict:
    """Trains cfg.steps steps; each finished step's time and loss go to `done` as it ends (what
    an interrupted rank still reports)."""
    cfg = state.cfg
    # The first chunk holding layers: an interleave counting the embedding and the head as
    # layers can leave the first chunk only the embedding.
    layered = [c for c in state.chunks if len(getattr(c, "module", c).layers)]
    probe = LayerProbe(state.counter, (layered or state.chunks)[0])
    state.counter.stack = []
    done = {"step_times_s": [], "losses": []} if done is None else done
    times, losses, routed, dropped = done["step_times_s"], done["losses"], [], []
    for step in range(cfg.steps):
        if state.device.type == "cuda":
            torch.cuda.synchronize()
        if state.world > 1:
            dist.barrier()
        begin = time.perf_counter()
        if state.fault and step == 1:
            state.fault()
        if step == 0:
            with state.counter.hooks():
                loss = state.step(step)
            probe.remove()
        else:
            loss = state.step(step)
        if state.device.type == "cuda":
            torch.cuda.synchronize()
        took = time.perf_counter() - begin
        loss = state.global_loss(loss)
        times.append(took)  # a finished step: its time and its loss together
        losses.append(loss)
        if state.spec.is_moe:
            counts = state.routing()
            routed.append(counts[0])
            dropped.append(counts[1])
    saved, per_layer = probe.figures()
    extra = {"slice_layer": slice_layer(state, per_layer)} if cfg.slice else {}
    if state.spec.is_moe:
        extra["routing"] = {
            "capacity_factor": cfg.capacity_factor,
            "routed_per_step": routed,
            "dropped_per_step": dropped,
        }
    return {
        **extra,
        "step_times_s": times,
        "losses": losses,
        "memory": state.memory(saved, per_layer).model_dump(),
    }


def _injected_fault(cfg: TrainConfig, rank: int) -> Callable[[], None] | None:
    """The fault of cfg.fault (or AUTOCONFIG_TRAINER_FAULT), e.g. 'oom@1': rank 1 fails at its
    second step. How the tests exercise every failure path without a GPU."""
    spec = cfg.fault or os.environ.get("AUTOCONFIG_TRAINER_FAULT", "")
    kind, _, where = spec.partition("@")
    if not spec or int(where or 0) != rank:
        return None

    def fail() -> None:
        if kind == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory (injected fault)")
        if kind == "alloc":  # a real allocation, twice the cap (or 64 GiB without one)
            gib = 2 * (cfg.memory_limit_gib or 32)
            torch.ones(int(gib * 2**30) // 4, dtype=torch.float32)
        if kind == "sleep":
            # said on stderr, so a test knows when the rank hangs (and the step before ended)
            print(f"rank {rank}: sleeping (injected fault '{spec}')", file=sys.stderr, flush=True)
            time.sleep(10**6)
        if kind == "abort":  # killed by a signal, as glibc's heap checks or the kernel end one
            os.abort()
        raise RuntimeError(f"crash injected by fault '{spec}'")

    return fail


def limit_memory(cfg: TrainConfig, device: torch.device) -> None:
    """Caps this rank's memory at cfg.memory_limit_gib, so a layout that needs more ends as an
    oom instead of swapping (CPU) or borrowing from a neighbour's share (GPU)."""
    if cfg.memory_limit_gib is None:
        return
    limit = int(cfg.memory_limit_gib * 2**30)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), device)
        return
    with open("/proc/self/status") as status:
        held = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize"))
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (held + limit, hard))


def is_oom(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator refusing (an address-space limit)."""
    text = str(exc)
    return isinstance(exc, torch.OutOfMemoryError) or "can't allocate memory" in text


def slice_layer(state: Rank, saved_per_layer: float, repeats: int = 5) -> dict:
    """Slice mode: one layer's forward and backward time (median of `repeats`) and the
    activation memory it allocates, with the per-rank shapes of the full model."""
    cfg, spec = state.cfg, state.spec
    inner = getattr(state.chunks[0], "module", state.chunks[0])
    block = next(iter(inner.layers.values()))
    cuda = state.device.type == "cuda"
    rope = (inner.rope_cos, inner.rope_sin) if inner.rope_cos is not None else None
    fwd, bwd, allocated = [], [], None
    for _ in range(repeats):
        x = torch.randn(cfg.mbs, state.seq, spec.hidden, device=state.device, requires_grad=True)
        with torch.autocast("cuda", torch.bfloat16, enabled=state.bf16):
            sync(cuda)
            before = torch.cuda.memory_allocated() if cuda else 0
            t0 = time.perf_counter()
            y = block(x, rope)
            sync(cuda)
            t1 = time.perf_counter()
            if cuda:
                allocated = torch.cuda.memory_allocated() - before - y.numel() * y.element_size()
        y.backward(torch.ones_like(y))
        sync(cuda)
        fwd.append(t1 - t0)
        bwd.append(time.perf_counter() - t1)
        block.zero_grad(set_to_none=True)
    return {
        "forward_ms": statistics.median(fwd) * 1e3,
        "backward_ms": statistics.median(bwd) * 1e3,
        "saved_bytes_per_layer": saved_per_layer,
        "allocated_bytes_per_layer": allocated,
        "tp_of_shapes": cfg.tp,
    }


def sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def environment(world: int) -> Environment:
    cuda = torch.cuda.is_available()
    names = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if cuda
        else [platform.processor() or platform.machine()]
    )
    return Environment(
        torch=torch.__version__,
        python=sys.version.split()[0],
        backend=("nccl" if cuda else "gloo") if world > 1 else "none",
        device_type="cuda" if cuda else "cpu",
        device_names=names,
        world_size=world,
        hostname=socket.gethostname(),
    )
