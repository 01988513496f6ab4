"""The files that deploy and benchmark the winning serving deployment: k8s.yaml, a Kubernetes
manifest that runs the engine with the flags of `serving_flags.launch_flags` (a Deployment of one
pod per replica and its Service; for a disaggregated winner an NVIDIA Dynamo
DynamoGraphDeployment with its prefill and decode pools, each pinned to its GPU type by a
nodeSelector where the pools run on different types), and bench.sh, the benchmark that
measures the predicted point (`vllm bench serve`; `genai-perf profile` for TensorRT-LLM).

Versions followed: Kubernetes apps/v1 and core/v1 (checked against the 1.31 and later OpenAPI
schemas); NVIDIA Dynamo 1.6.1, DynamoGraphDeployment nvidia.com/v1beta1, as in its profiler's
templates dgd/vllm/disagg.yaml and dgd/sglang/disagg.yaml; `vllm bench serve` of vLLM 0.10.2
(`vllm bench serve --help`); genai-perf 0.0.16 (`genai-perf profile --help`), with
perf_analyzer's `--request-distribution` passed through after `--`.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from autoconfig.base.errors import UserError
from autoconfig.base.fileio import write_text
from autoconfig.report.serving_flags import PRODUCT_LABEL, launch_flags, product_label
from autoconfig.serve.goodput import label_of
from autoconfig.serve.result import ServingResult
from autoconfig.serve.workload import Lengths
from autoconfig.spec.schema import GPUSpec
from autoconfig.spec.vocab import Arrival, Engine

MODEL_VAR = "MODEL_PATH"  # launch_flags' placeholder for the checkpoint, and the env var here
# Left for the user to fill: a value no engine can load, so a pod applied unfilled fails at
# once with the model's name in its log rather than serving something else.
MODEL_PLACEHOLDER = "REPLACE-WITH-MODEL-PATH"
HF_SECRET = "hf-token-secret"  # the secret Dynamo's own templates read HF_TOKEN from
MANIFEST = "k8s.yaml"
BENCH = "bench.sh"

DYNAMO_VERSION = "1.6.1"
DYNAMO_API = "nvidia.com/v1beta1"
VLLM_BENCH_VERSION = "0.10.2"
GENAI_PERF_VERSION = "0.0.16"
# NCCL and the engines' worker processes pass tensors through /dev/shm; a container runtime
# gives 64 MiB by default, which tensor- and pipeline-parallel engines outgrow.
SHM_SIZE = "16Gi"
BENCH_PERCENTILES = (50.0, 90.0, 99.0)


@dataclass(frozen=True)
class _EngineSpec:
    """How an engine runs in a container: its image, the port it serves its OpenAI API and
    /health on, the flags that take the model, and the backend `vllm bench serve` uses."""

    image: str
    port: int
    model_flag: tuple[str, ...]  # () for a positional model
    bench_backend: str


# vLLM: the release whose `vllm bench serve` bench.sh follows. SGLang publishes release tags
# with CUDA suffixes that change from release to release, so no tag is guessed here: pin the
# one you run.
_SERVERS = {
    Engine.VLLM: _EngineSpec(f"vllm/vllm-openai:v{VLLM_BENCH_VERSION}", 8000, (), "vllm"),
    # vllm bench serve has no sglang backend; SGLang serves the OpenAI completions API that
    # its `openai` backend speaks.
    Engine.SGLANG: _EngineSpec("lmsysorg/sglang:latest", 30000, ("--model-path",), "openai"),
}
_TRTLLM_PORT = 8000  # trtllm-serve's default
_DYNAMO_PORT = 8000  # dynamo.frontend's default --http-port
# The Dynamo worker module and the flag that takes the model, per engine (its templates).
_DYNAMO_WORKER = {Engine.VLLM: ("vllm", "--model"), Engine.SGLANG: ("sglang", "--model-path")}


@dataclass(frozen=True)
class Server:
    """One kind of server of the deployment: colocated ("server"), or a prefill or decode pool
    of a disaggregated one; `flags` are launch_flags' for one server of it, the model left out."""

    name: str
    program: list[str]
    flags: list[str]
    replicas: int
    gpus: int  # per server (pod)
    gpu: GPUSpec | None = None  # mixed pools: the pool's GPU type, its pods pinned to it


def deploy_texts(result: ServingResult, engine: Engine) -> dict[str, str]:
    """File name -> text of the files that deploy and benchmark `result`'s best deployment on
    `engine`: k8s.yaml (vLLM and SGLang) and bench.sh; empty when nothing meets the budget."""
    if result.best is None:
        return {}
    _check(result)
    files = {MANIFEST: manifest(result, engine)} if engine in _SERVERS else {}
    return files | {BENCH: bench_script(result, engine)}


def write_deploy_files(result: ServingResult, engine: Engine, folder: Path | str) -> list[Path]:
    """Write deploy_texts' files into `folder` (made if missing); bench.sh executable."""
    paths = []
    for name, text in deploy_texts(result, engine).items():
        path = Path(folder) / name
        write_text(path, text)  # whole or not at all
        if name == BENCH:
            path.chmod(0o755)
        paths.append(path)
    return paths


def _check(result: ServingResult) -> None:
    if result.request.batching != "continuous" or result.request.workload is None:
        raise UserError(
            "deploy files: need a continuous-batching result (static batches have no "
            "engine settings or request rate to deploy)"
        )


def _one_replica(result: ServingResult) -> ServingResult:
    """`result` with its best deployment cut to one replica: what one pod runs, as
    launch_flags gives it (its data-parallel flag becomes the Deployment's replicas)."""
    table = result.table.copy()
    table.iloc[0, table.columns.get_loc("replicas")] = 1
    return dataclasses.replace(result, table=table)


def _argvs(text: str) -> list[list[str]]:
    """The commands of launch_flags' shell text, each as its argv: comment lines dropped,
    continuation lines joined, quoting undone as a shell would."""
    argvs: list[list[str]] = []
    pending: list[str] = []
    for line in text.splitlines():
        part = line.strip()
        if not pending and (not part or part.startswith("#")):
            continue
        pending.append(part.removesuffix("\\"))
        if not part.endswith("\\"):
            argvs.append(shlex.split(" ".join(pending), comments=True))
            pending = []
    return argvs


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(program, flags) of a launch command, its model argument (MODEL_PATH, positional or
    after --model-path/--model) left out: each deployment file passes the model its own way."""
    at = argv.index(MODEL_VAR)
    rest = argv[: at - 1] if at and argv[at - 1] in ("--model-path", "--model") else argv[:at]
    rest += argv[at + 1 :]
    program = rest[: _first_flag(rest)]
    return program, rest[len(program) :]


def _first_flag(argv: list[str]) -> int:
    return next((i for i, a in enumerate(argv) if a.startswith("--")), len(argv))


def roles(result: ServingResult, engine: Engine) -> list[Server]:
    """The servers of the best deployment: one colocated role, or prefill then decode."""
    row = _best(result)
    if row.get("mode") == "disaggregated":
        # launch_flags lists the prefill server's command, then the decode server's.
        prefill, decode = _argvs(launch_flags(result, engine))
        pools = (
            ("prefill", prefill, row["prefill_replicas"], row["prefill_tp"] * row["prefill_pp"]),
            ("decode", decode, row["replicas"], row["tp"] * row["pp"]),
        )
        return [
            Server(name, *_split(argv), int(n), int(g), _pool_gpu(result, name))
            for name, argv, n, g in pools
        ]
    (argv,) = _argvs(launch_flags(_one_replica(result), engine))
    return [Server("server", *_split(argv), int(row["replicas"]), int(row["tp"] * row["pp"]))]


def _pool_gpu(result: ServingResult, role: str) -> GPUSpec | None:
    """A mixed deployment's GPU type for the pool `role`; None when both share the type."""
    if result.decode_gpu is None:
        return None
    return result.decode_gpu if role == "decode" else result.gpu


def _best(result: ServingResult) -> pd.Series:
    row = result.best
    if row is None:
        raise UserError("deploy files: no deployment meets the budget")
    return row


def _gpus_per_node(result: ServingResult, gpu: GPUSpec | None = None) -> int:
    """GPUs per node of `gpu`'s cluster (default the result's, the prefill type's)."""
    return int(result.request.gpus_per_node or (gpu or result.gpu).cluster.gpus_per_node)


def _name(result: ServingResult, engine: Engine) -> str:
    """A DNS-1123 name for the objects; short enough for the suffixes Dynamo appends."""
    slug = "".join(c if c.isalnum() else "-" for c in result.model.name.lower()).strip("-")
    return f"{slug[:40].strip('-')}-{engine.value}"


class _Dumper(yaml.SafeDumper):
    """Writes a mapping used twice (the labels) in full each time, not as an anchor and alias
    that readers of the manifest would have to follow."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _dump(docs: list[dict[str, Any]]) -> str:
    # width: never fold a long flag (a JSON --kv-transfer-config) across lines
    return "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=10_000) for d in docs)


def _predicted(result: ServingResult) -> str:
    row = _best(result)
    p = f"p{result.request.percentile:g}"
    return (
        f"{float(row['rate_rps']):,.2f} requests/s in total, {p} TTFT "
        f"{float(row['pred_ttft_ms']):,.1f} ms, TPOT {float(row['pred_tpot_ms']):,.2f} ms, "
        f"latency {float(row['pred_latency_ms']):,.0f} ms"
    )


def manifest(result: ServingResult, engine: Engine) -> str:
    """k8s.yaml: a Deployment and Service running the best colocated deployment on vLLM or
    SGLang, or a Dynamo DynamoGraphDeployment for a disaggregated one."""
    if engine not in _SERVERS:
        raise UserError(f"deploy files: no Kubernetes manifest for {engine.value} (vllm, sglang)")
    _check(result)
    row = _best(result)
    per_node = _gpus_per_node(result)
    servers = roles(result, engine)
    head = [
        f"# {MANIFEST}: {result.model.name} on {result.hardware()} with "
        f"{engine.value}, the deployment autoconfig predicted:",
        f"#   {label_of(row)}",
        f"#   at {_predicted(result)}.",
        f"# Fill {MODEL_VAR} (a Hugging Face id, or a path in the container on a volume you add),",
        f"# then `kubectl apply -f {MANIFEST}`; `bash {BENCH}` measures the predicted point.",
        "# A gated model needs a token:",
        f"#   kubectl create secret generic {HF_SECRET} --from-literal=HF_TOKEN=...",
    ]
    if row.get("mode") == "disaggregated":
        docs = [_dynamo(result, engine, servers, per_node)]
        head += [
            f"# NVIDIA Dynamo {DYNAMO_VERSION}, its operator installed: a DynamoGraphDeployment",
            f"# {DYNAMO_API}, as Dynamo's template dgd/{engine.value}/disagg.yaml writes one.",
            "# Its frontend routes each request to a prefill worker, then a decode worker; the",
            f"# operator serves it as the Service {_name(result, engine)}-frontend, port "
            f"{_DYNAMO_PORT}.",
        ]
        if result.mixed:
            head += [
                "# Each pool runs on its own GPU type: its pods select nodes by the label",
                f"# {PRODUCT_LABEL} that NVIDIA's GPU Feature Discovery sets; check the values",
                f"# with `kubectl get nodes -L {PRODUCT_LABEL}`:",
                *(
                    f"#   {s.name}: {s.gpu.name} ({PRODUCT_LABEL}={product_label(s.gpu)})"
                    for s in servers
                    if s.gpu is not None
                ),
            ]
    else:
        (server,) = servers
        docs = _colocated(result, engine, server)
        head += [
            "# One pod per replica: the engine's data-parallel size becomes the Deployment's",
            "# replicas, and the Service spreads connections over them, as the prediction's",
            "# load balancer in front of independent replicas.",
        ]
        if server.gpus > per_node:
            head += [
                f"# WARNING: one replica needs {server.gpus} GPUs, more than a node's {per_node};",
                "# a Deployment's pod cannot span nodes (a multi-node LeaderWorkerSet can).",
            ]
    text = "\n".join(head) + "\n---\n" + _dump(docs)
    # Say where the placeholder is, on its own line (a YAML dump carries no comments).
    return text.replace(
        f"value: {MODEL_PLACEHOLDER}",
        f"value: {MODEL_PLACEHOLDER}  # the {result.model.name} checkpoint",
    )


def _env() -> dict[str, Any]:
    return {
        "env": [{"name": MODEL_VAR, "value": MODEL_PLACEHOLDER}],
        # optional: a public model needs no token, and the pod starts without the secret
        "envFrom": [{"secretRef": {"name": HF_SECRET, "optional": True}}],
    }


def container_args(engine: Engine, server: Server) -> list[str]:
    """The arguments after the engine's program in the colocated container: the model from
    MODEL_PATH (expanded by Kubernetes), launch_flags' flags, then where to listen."""
    spec = _SERVERS[engine]
    model = [*spec.model_flag, f"$({MODEL_VAR})"]
    # SGLang listens on 127.0.0.1 by default, out of the Service's and the probe's reach; the
    # port is spelled out for the same reason on every engine.
    return [*model, *server.flags, "--host", "0.0.0.0", "--port", str(spec.port)]


def _colocated(result: ServingResult, engine: Engine, server: Server) -> list[dict[str, Any]]:
    spec = _SERVERS[engine]
    name = _name(result, engine)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "engine"}
    container = {
        "name": "engine",
        "image": spec.image,
        "command": server.program,
        "args": container_args(engine, server),
        **_env(),
        "ports": [{"name": "http", "containerPort": spec.port}],
        "resources": {"limits": {"nvidia.com/gpu": server.gpus}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        # Readiness only: loading weights takes minutes, and a liveness probe failing meanwhile
        # would restart the pod before it ever served.
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "initialDelaySeconds": 30,
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": server.replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [container],
                    "volumes": [
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}}
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "selector": labels,
            "ports": [{"name": "http", "port": spec.port, "targetPort": "http"}],
        },
    }
    return [deployment, service]


def dynamo_args(engine: Engine, server: Server) -> list[str]:
    """A Dynamo worker's arguments: the model, launch_flags' flags for its role, and what
    Dynamo's templates add (vLLM: --disaggregation-mode, which launch_flags leaves to the
    router; SGLang: the NIXL transfer, its bootstrap port and listening beyond localhost)."""
    _, model_flag = _DYNAMO_WORKER[engine]
    args = [model_flag, f"$({MODEL_VAR})", *server.flags]
    if engine is Engine.VLLM:
        return [*args, "--disaggregation-mode", server.name]
    return [
        *args,
        *("--disaggregation-transfer-backend", "nixl"),
        *("--disaggregation-bootstrap-port", "12345"),
        *("--host", "0.0.0.0"),
    ]


def _dynamo(
    result: ServingResult, engine: Engine, servers: list[Server], per_node: int
) -> dict[str, Any]:
    module, _ = _DYNAMO_WORKER[engine]
    image = f"nvcr.io/nvidia/ai-dynamo/{module}-runtime:{DYNAMO_VERSION}"
    secret = _env()["envFrom"]
    components: list[dict[str, Any]] = [
        {
            "name": "Frontend",
            "type": "frontend",
            "replicas": 1,
            "podTemplate": {
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": image,
                            "command": ["python3"],
                            "args": ["-m", "dynamo.frontend", "--http-port", str(_DYNAMO_PORT)],
                            "envFrom": secret,
                        }
                    ]
                }
            },
        }
    ]
    for server in servers:
        node = _gpus_per_node(result, server.gpu) if server.gpu is not None else per_node
        # mixed pools: the pool's pods only on nodes of its GPU type
        placement = (
            {"nodeSelector": {PRODUCT_LABEL: product_label(server.gpu)}}
            if server.gpu is not None
            else {}
        )
        component: dict[str, Any] = {
            "name": server.name,
            "type": server.name,
            "replicas": server.replicas,
            "podTemplate": {
                "spec": {
                    **placement,
                    # No /dev/shm volume: Dynamo's own templates declare none, leaving shared
                    # memory to the operator.
                    "containers": [
                        {
                            "name": "main",
                            "image": image,
                            "workingDir": f"/workspace/examples/backends/{module}",
                            "command": ["python3", "-m", f"dynamo.{module}"],
                            "args": dynamo_args(engine, server),
                            **_env(),
                            # per pod: a worker wider than a node spans nodeCount pods
                            "resources": {"limits": {"nvidia.com/gpu": min(server.gpus, node)}},
                        }
                    ],
                }
            },
        }
        if server.gpus > node:  # as Dynamo's profiler sets it (set_multinode_config)
            component["multinode"] = {"nodeCount": math.ceil(server.gpus / node)}
        components.append(component)
    return {
        "apiVersion": DYNAMO_API,
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": _name(result, engine)},
        "spec": {"components": components},
    }


@dataclass(frozen=True)
class BenchLoad:
    """The benchmark's request stream: lengths (mean and spread), requests, rate, seed."""

    input_mean: int
    output_mean: int
    range_ratio: float  # vLLM's --random-range-ratio (one for both lengths): the prompts'
    output_ratio: float  # what the outputs' would be
    input_std: int
    output_std: int
    requests: int
    rate: float  # requests/s in total; inf: all at once
    seed: int
    notes: tuple[str, ...]  # what the benchmark does not reproduce, whatever the tool


def _std(lengths: Lengths) -> float:
    if lengths.samples:
        return float(pd.Series(lengths.samples).std(ddof=0))
    return (lengths.high - lengths.low) / math.sqrt(12.0)  # a uniform's


def _ratio(lengths: Lengths) -> float:
    """vLLM draws uniformly in [len·(1-r), len·(1+r)]: a uniform [low, high] is r =
    (high-low)/(high+low) about its mean."""
    if lengths.samples or lengths.low == lengths.high:
        return 0.0
    return round((lengths.high - lengths.low) / (lengths.high + lengths.low), 3)


def bench_workload(result: ServingResult) -> BenchLoad:
    """What the benchmark sends: the simulated workload at the predicted operating rate
    (`rate_rps`: the goodput, or the requested rate when one was given)."""
    _check(result)
    row = _best(result)
    req = result.request
    work = req.workload
    assert work is not None  # _check
    notes = []
    if work.input.samples or work.output.samples:
        notes.append("the workload file's lengths are not replayed: their mean and spread stand in")
    rate = float(row["rate_rps"])
    if work.arrival is Arrival.BURST:
        rate = math.inf
    elif work.arrival is Arrival.TRACE:
        notes.append("the trace's arrival times are not replayed: Poisson at the same rate")
    return BenchLoad(
        input_mean=int(req.input_len),
        output_mean=int(req.output_len),
        range_ratio=_ratio(work.input),
        output_ratio=_ratio(work.output),
        input_std=round(_std(work.input)),
        output_std=round(_std(work.output)),
        requests=len(work.pairs) if work.arrival is Arrival.TRACE else work.requests,
        rate=rate,
        seed=work.seed,
        notes=tuple(notes),
    )


def _number(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.6g}"


def _percentiles(result: ServingResult) -> str:
    wanted = sorted({*BENCH_PERCENTILES, float(result.request.percentile)})
    return ",".join(f"{p:g}" for p in wanted)


def _limits(result: ServingResult) -> dict[str, float]:
    """The budget's latency limits in ms: ttft, tpot, latency, those that are set."""
    budget = result.request.budget
    limits = {
        "ttft": budget.max_ttft_ms,
        "tpot": budget.max_tpot_ms,
        "latency": budget.max_latency_ms,
    }
    return {k: float(v) for k, v in limits.items() if v is not None}


def _goodput(result: ServingResult, names: dict[str, str]) -> list[str]:
    """--goodput and the limits as KEY:ms pairs, keys as the benchmark names the metrics;
    nothing without a latency limit (the flag wants at least one)."""
    pairs = [f"{names[k]}:{v:g}" for k, v in _limits(result).items()]
    return ["--goodput", *pairs] if pairs else []


def _where(result: ServingResult, engine: Engine) -> tuple[str, int]:
    """The default host and port the benchmark targets: the Service the manifest makes."""
    if engine not in _SERVERS:
        return "localhost", _TRTLLM_PORT
    if _best(result).get("mode") == "disaggregated":
        return f"{_name(result, engine)}-frontend", _DYNAMO_PORT
    return _name(result, engine), _SERVERS[engine].port


def bench_args(result: ServingResult, engine: Engine) -> list[str]:
    """The benchmark's argv, with "$HOST", "$PORT" and "$MODEL_PATH" left for the shell."""
    w = bench_workload(result)
    model = f"${MODEL_VAR}"
    if engine is Engine.TRTLLM:
        warmup = w.requests // 10  # the simulation leaves the first tenth out of percentiles
        load = (
            ["--concurrency", str(w.requests)]
            if math.isinf(w.rate)
            else ["--request-rate", _number(w.rate)]
        )
        return [
            *("genai-perf", "profile"),
            *("--model", model, "--tokenizer", model),
            *("--endpoint-type", "completions", "--streaming"),
            *("--url", "$HOST:$PORT"),
            *("--synthetic-input-tokens-mean", str(w.input_mean)),
            *("--synthetic-input-tokens-stddev", str(w.input_std)),
            *("--output-tokens-mean", str(w.output_mean)),
            *("--output-tokens-stddev", str(w.output_std)),
            # every reply runs to its drawn length, as the simulation's do
            *("--extra-inputs", "ignore_eos:true"),
            *("--num-dataset-entries", str(w.requests)),
            *("--warmup-request-count", str(warmup)),
            *("--request-count", str(w.requests - warmup)),
            *load,
            *("--random-seed", str(w.seed)),
            *_goodput(
                result,
                {
                    "ttft": "time_to_first_token",
                    "tpot": "inter_token_latency",
                    "latency": "request_latency",
                },
            ),
            *("--artifact-dir", "bench-artifacts"),
            # perf_analyzer spaces requests evenly unless told otherwise; the prediction
            # assumed Poisson arrivals
            *(["--", "--request-distribution=poisson"] if not math.isinf(w.rate) else []),
        ]
    disaggregated = _best(result).get("mode") == "disaggregated"
    # Dynamo's frontend speaks the OpenAI API whatever the engine behind it
    backend = "openai" if disaggregated else _SERVERS[engine].bench_backend
    return [
        *("vllm", "bench", "serve"),
        *("--backend", backend, "--host", "$HOST", "--port", "$PORT"),
        *("--endpoint", "/v1/completions", "--model", model),
        *("--dataset-name", "random"),
        *("--random-input-len", str(w.input_mean)),
        *("--random-output-len", str(w.output_mean)),
        *("--random-range-ratio", f"{w.range_ratio:g}"),
        "--ignore-eos",  # every reply runs to its drawn length, as the simulation's do
        *("--num-prompts", str(w.requests)),
        *("--request-rate", _number(w.rate)),
        *("--burstiness", "1.0"),  # Poisson arrivals, as simulated
        *("--seed", str(w.seed)),
        *("--percentile-metrics", "ttft,tpot,e2el"),
        *("--metric-percentiles", _percentiles(result)),
        *_goodput(result, {"ttft": "ttft", "tpot": "tpot", "latency": "e2el"}),
        *("--save-result", "--result-filename", "bench-result.json"),
    ]


def _quote(arg: str) -> str:
    """Shell quoting that still expands the script's variables."""
    if arg.startswith("$") or "$HOST" in arg:
        return f'"{arg}"'
    return shlex.quote(arg)


def _tool_notes(w: BenchLoad, engine: Engine) -> list[str]:
    """Where the tool's length distribution departs from the simulated one."""
    if engine is Engine.TRTLLM:
        if w.input_std or w.output_std:
            return ["genai-perf draws lengths from a normal of the same mean and spread"]
        return []
    if w.output_ratio != w.range_ratio:
        return [
            f"vLLM takes one range ratio for both lengths, the prompts' ({w.range_ratio:g}): "
            f"outputs fall within ±{w.range_ratio:.0%} of their mean, not ±{w.output_ratio:.0%}"
        ]
    return []


def bench_script(result: ServingResult, engine: Engine) -> str:
    """bench.sh: the benchmark of the predicted point, with what it should measure."""
    w = bench_workload(result)
    args = bench_args(result, engine)
    host, port = _where(result, engine)
    tool = (
        f"genai-perf {GENAI_PERF_VERSION} (`genai-perf profile --help`)"
        if engine is Engine.TRTLLM
        else f"vLLM {VLLM_BENCH_VERSION}'s `vllm bench serve` (`vllm bench serve --help`)"
    )
    labels = {"ttft": "TTFT", "tpot": "TPOT", "latency": "latency"}
    budget = ", ".join(f"{labels[k]} <= {v:g} ms" for k, v in _limits(result).items())
    lines = [
        "#!/usr/bin/env bash",
        f"# Measures the point autoconfig predicted for {result.model.name} on "
        f"{result.hardware()} with {engine.value}:",
        f"#   {label_of(_best(result))}",
        f"#   {_predicted(result)}",
        f"#   (limits at p{result.request.percentile:g}: {budget or 'none'}),",
        f"#   workload: {result.workload}.",
        f"# Flags: {tool}.",
        (
            "# Set HOST and PORT to the trtllm-serve server."
            if engine is Engine.TRTLLM
            else f"# Run it where the Service {host} resolves (a pod in its namespace), or set HOST"
            " and PORT."
        ),
        f"# {MODEL_VAR} names the model the server runs, and the tokenizer loaded here.",
        "# More requests than the prediction simulated give steadier percentiles.",
        *(f"# Note: {note}." for note in (*w.notes, *_tool_notes(w, engine))),
        "set -euo pipefail",
        f': "${{{MODEL_VAR}:?set {MODEL_VAR} to the model the server runs}}"',
        f'HOST="${{HOST:-{host}}}"',
        f'PORT="${{PORT:-{port}}}"',
    ]
    body = [_quote(a) for a in args]
    command, rest = " ".join(body[: _first_flag(args)]), body[_first_flag(args) :]
    flags: list[str] = []
    for arg in rest:  # one flag and its values per line
        if arg.startswith("--") or not flags:
            flags.append(arg)
        else:
            flags[-1] += f" {arg}"
    return "\n".join([*lines, " \\\n    ".join([command, *flags])]) + "\n"
