"""One rank of a measured serving trial: the bundled model generates with a K/V cache, tensor
parallel through DTensor (the trainer's own TP plan), and times prefill and every decode step;
or serves a request trace with continuous batching (trainer/serve_loop.py).

Greedy decoding of a static batch: prefill runs the whole prompt and yields the first token
(TTFT); each decode step feeds one token per sequence and reads the cache (TPOT). The first
`warmup` generations are left out; the figures are medians over the remaining `steps`.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from autoconfig.base.errors import UserError
from autoconfig.trainer import ops
from autoconfig.trainer.config import TrainConfig
from autoconfig.trainer.metrics import RankMemory
from autoconfig.trainer.model import Attention, Block, Transformer, apply_rope
from autoconfig.trainer.parallel import apply_tp
from autoconfig.trainer.serve_loop import load_for, serve_rank


class KVCache:
    """Preallocated K and V of one layer: (batch, local kv heads, max length, head dim)."""

    def __init__(self, shape: tuple[int, int, int, int], dtype, device) -> None:
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


def _attend(attn: Attention, x: torch.Tensor, rope, cache: KVCache, pos: int) -> torch.Tensor:
    b, s, _ = x.shape
    d = attn.head_dim
    q = attn.wq(x).view(b, s, -1, d)
    k = attn.wk(x).view(b, s, -1, d)
    v = attn.wv(x).view(b, s, -1, d)
    if rope is not None:
        cos, sin = rope[0][pos : pos + s], rope[1][pos : pos + s]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    cache.k[:, :, pos : pos + s] = k
    cache.v[:, :, pos : pos + s] = v
    keys, values = cache.k[:, :, : pos + s], cache.v[:, :, : pos + s]
    # Prefill is causal over the prompt; a decode step's one query sees the whole cache.
    out = F.scaled_dot_product_attention(
        q, keys, values, is_causal=s > 1, enable_gqa=q.shape[1] != keys.shape[1]
    )
    return attn.wo(out.transpose(1, 2).reshape(b, s, -1))


def _block(block: Block, x: torch.Tensor, rope, cache: KVCache, pos: int) -> torch.Tensor:
    x = x + _attend(block.attn, block.attn_norm(x), rope, cache, pos)
    return x + block.mlp(block.mlp_norm(x))


@torch.no_grad()
def forward(model: Transformer, tokens: torch.Tensor, caches: list[KVCache], pos: int):
    """Logits of the last position, the cache extended by `tokens` from position `pos`."""
    x = model.tok_embeddings(tokens)
    if model.pos_embeddings is not None:
        positions = torch.arange(pos, pos + tokens.shape[1], device=tokens.device)
        x = x + model.pos_embeddings(positions)
    rope = (model.rope_cos, model.rope_sin) if model.rope_cos is not None else None
    for block, cache in zip(model.layers.values(), caches, strict=True):
        x = _block(block, x, rope, cache, pos)
    x = model.norm(x[:, -1:])
    logits = model.head(x)
    return ops.local_tensor(logits)


class Generator:
    """This rank's model shard, its caches and the prompts."""

    def __init__(self, cfg: TrainConfig, rank: int, world: int, device: torch.device) -> None:
        if cfg.input_len is None or cfg.output_len is None:
            raise UserError("task: generate needs input_len and output_len")
        self.cfg, self.rank, self.device = cfg, rank, device
        self.spec = cfg.spec()
        self.length = cfg.input_len + cfg.output_len
        cuda = device.type == "cuda"
        bf16 = cfg.precision == "bf16" or (cuda and cfg.precision == "auto")
        self.dtype = torch.bfloat16 if bf16 else torch.float32
        model = Transformer(self.spec, self.length)
        model.init_weights(cfg.seed)
        model.to(device, dtype=self.dtype)
        model.eval()
        if world > 1:
            mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("tp",))
            apply_tp(model, mesh, sp=False)
        self.model = model
        kv_local = self.spec.kv // cfg.tp
        shape = (cfg.mbs, kv_local, self.length, self.spec.dhead)
        self.caches = [KVCache(shape, self.dtype, device) for _ in model.layers]
        gen = torch.Generator().manual_seed(cfg.seed)
        self.prompts = torch.randint(
            0, self.spec.vocab, (cfg.mbs, cfg.input_len), generator=gen
        ).to(device)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def generate_once(self) -> tuple[float, list[float]]:
        """(prefill seconds, every decode step's seconds) of one generation; the tokens it
        produced are left in self.generated."""
        self._sync()
        begin = time.perf_counter()
        logits = forward(self.model, self.prompts, self.caches, 0)
        token = logits[:, -1].argmax(-1, keepdim=True)
        self._sync()
        prefill = time.perf_counter() - begin
        self.generated = [token]
        steps = []
        pos = self.cfg.input_len
        for _ in range(self.cfg.output_len - 1):
            begin = time.perf_counter()
            logits = forward(self.model, token, self.caches, pos)
            token = logits[:, -1].argmax(-1, keepdim=True)
            self._sync()
            steps.append(time.perf_counter() - begin)
            self.generated.append(token)
            pos += 1
        return prefill, steps

    def memory(self) -> RankMemory:
        params = list(self.model.parameters())
        cuda = self.device.type == "cuda"
        kv = sum(c.nbytes for c in self.caches)
        return RankMemory(
            rank=self.rank,
            pp_rank=0,
            peak_allocated_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
            parameter_bytes=sum(ops.local_tensor(p).numel() * p.element_size() for p in params),
            gradient_bytes=0,
            optimizer_bytes=0,
            parameters=sum(ops.local_tensor(p).numel() for p in params),
            saved_activation_bytes=kv,  # the K/V cache: what a serving rank keeps
            saved_activation_bytes_per_layer=kv / max(len(self.caches), 1),
        )


def generate_rank(cfg: TrainConfig, rank: int, world: int, device: torch.device, fault) -> dict:
    """Runs warmup + steps generations of a static batch, or, when the trial comes with a
    request trace (trainer/serve_loop.py), serves it with continuous batching; returns this
    rank's result fields."""
    gen = Generator(cfg, rank, world, device)
    load = load_for(cfg)
    if load is not None:
        if fault:
            fault()
        out = serve_rank(
            gen.model,
            load,
            cfg,
            world,
            device,
            gen.dtype,
            gen.spec.vocab,
            gen.spec.kv // cfg.tp,
            gen.spec.dhead,
        )
        return {**out, "memory": gen.memory().model_dump()}
    ttfts, tpots, latencies = [], [], []
    for i in range(cfg.steps):
        if world > 1:
            dist.barrier()
        if fault and i == 1:
            fault()
        prefill, steps = gen.generate_once()
        ttfts.append(prefill)
        tpots.append(statistics.mean(steps) if steps else 0.0)
        latencies.append(prefill + sum(steps))
    keep = slice(cfg.warmup, None)
    return {
        "step_times_s": latencies,
        "ttft_ms": 1e3 * statistics.median(ttfts[keep]),
        "tpot_ms": 1e3 * statistics.median(tpots[keep]),
        "memory": gen.memory().model_dump(),
        # the first sequence's greedy tokens: equal across layouts when TP is right
        "generated": torch.cat(gen.generated, dim=1)[0].tolist(),
    }
