"""The deploy files of the winning serving deployment: every Kubernetes object valid against the
Kubernetes schema, the container running exactly launch_flags' flags with the predicted
replicas and GPUs, the Dynamo resource's pools as predicted, and the benchmark sending the
predicted rate and lengths (run through stand-ins for vllm and genai-perf)."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
import stat
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pandas as pd
import pytest
import yaml

from autoconfig import api
from autoconfig.base.errors import UserError
from autoconfig.report import deploy_files
from autoconfig.report.deploy_files import deploy_texts, write_deploy_files
from autoconfig.report.serving_flags import launch_flags
from autoconfig.serve.request import Budget
from autoconfig.serve.result import ServingResult
from autoconfig.spec.vocab import Engine

# The searches below are shared by the module's tests: keep them on one xdist worker.
pytestmark = pytest.mark.xdist_group("deploy_files")

SMALL: dict[str, Any] = dict(
    model="llama3-8b",
    gpu="h100-sxm-80gb",
    max_num_seqs=(32, 128),
    max_num_batched_tokens=(2048,),
    requests=100,
)
# The oldest Kubernetes the dev extra's kubernetes-validate pin ships, and its newest.
VERSIONS = ("1.31", kubernetes_validate.latest_version())
DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SERVED = (Engine.VLLM, Engine.SGLANG)
DP_FLAG = {Engine.VLLM: "--data-parallel-size", Engine.SGLANG: "--dp-size"}


@pytest.fixture(scope="module")
def colocated() -> ServingResult:
    """Two replicas of four GPUs: the data-parallel size must become pods, each with its GPUs."""
    result = api.infer(
        **{**SMALL, "model": "llama3-70b"}, gpus=8, precision="bf16", input_len=1024,
        output_len=256, max_ttft_ms=1000, max_tpot_ms=50, disaggregation=False,
    )  # fmt: skip
    best = result.best
    assert best is not None and int(best["replicas"]) == 2 and best["tp"] * best["pp"] == 4
    return result


@pytest.fixture(scope="module")
def disaggregated() -> ServingResult:
    # Long prompts, short answers: a prefill/decode split wins (as test_infer_continuous's),
    # here with several servers in each pool.
    result = api.infer(
        **SMALL, gpus=8, input_len=4000, output_len=64, max_ttft_ms=2000, max_tpot_ms=20
    )
    best = result.best
    assert best is not None and best["mode"] == "disaggregated"
    assert int(best["replicas"]) >= 2 and int(best["prefill_replicas"]) >= 2
    return result


def _best(result: ServingResult) -> pd.Series:
    assert result.best is not None
    return result.best


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def _valid(doc: dict[str, Any]) -> None:
    for version in VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path)
            pytest.fail(f"{doc['kind']} invalid for Kubernetes {version} at {where}: {exc.message}")


def _commands(text: str) -> list[list[str]]:
    """launch_flags' commands as argv, read as a shell would (comments out, lines joined)."""
    joined = text.replace("\\\n", " ")
    return [
        shlex.split(line)
        for line in joined.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _without_model(argv: list[str], model: str) -> list[str]:
    """argv less the model argument (and the flag naming it), whichever way it is passed."""
    at = argv.index(model)
    before = argv[at - 1] if at else ""
    start = at - 1 if before in ("--model", "--model-path") else at
    return argv[:start] + argv[at + 1 :]


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _drop(argv: list[str], name: str, count: int = 1) -> list[str]:
    at = argv.index(name)
    return argv[:at] + argv[at + 1 + count :]


@pytest.mark.parametrize("engine", SERVED)
def test_colocated_manifest_is_valid_kubernetes(colocated: ServingResult, engine: Engine) -> None:
    docs = _docs(deploy_files.manifest(colocated, engine))
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    for doc in docs:
        _valid(doc)
        assert DNS_1123.match(doc["metadata"]["name"]), doc["metadata"]["name"]
    deployment, service = docs
    pod = deployment["spec"]["template"]
    assert (
        deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    )
    assert service["spec"]["selector"] == pod["metadata"]["labels"]
    (container,) = pod["spec"]["containers"]
    port = {Engine.VLLM: 8000, Engine.SGLANG: 30000}[engine]
    assert container["ports"] == [{"name": "http", "containerPort": port}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert service["spec"]["ports"][0]["port"] == port
    (mount,) = container["volumeMounts"]
    (volume,) = pod["spec"]["volumes"]
    assert mount == {"name": volume["name"], "mountPath": "/dev/shm"}
    assert volume["emptyDir"]["medium"] == "Memory"
    assert container["env"] == [{"name": "MODEL_PATH", "value": deploy_files.MODEL_PLACEHOLDER}]


@pytest.mark.parametrize("engine", SERVED)
def test_the_container_runs_launch_flags_per_replica(
    colocated: ServingResult, engine: Engine
) -> None:
    row = _best(colocated)
    deployment = _docs(deploy_files.manifest(colocated, engine))[0]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    # the predicted replicas and GPUs, one pod per replica
    assert deployment["spec"]["replicas"] == int(row["replicas"]) == 2
    gpus = int(row["tp"]) * int(row["pp"])
    assert container["resources"]["limits"] == {"nvidia.com/gpu": gpus}
    # the flags launch_flags prints, the data-parallel size taken out into the pods
    (printed,) = _commands(launch_flags(colocated, engine))
    assert _flag(printed, DP_FLAG[engine]) == "2"
    expected = _without_model(_drop(printed, DP_FLAG[engine]), "MODEL_PATH")
    ran = container["command"] + _without_model(container["args"], "$(MODEL_PATH)")
    port = str(container["ports"][0]["containerPort"])
    assert ran == [*expected, "--host", "0.0.0.0", "--port", port]
    # SGLang's launcher takes the model only as --model-path
    model_flag = {Engine.VLLM: [], Engine.SGLANG: ["--model-path"]}[engine]
    assert container["args"][: len(model_flag) + 1] == [*model_flag, "$(MODEL_PATH)"]


def test_one_replica_needs_no_data_parallel_flag() -> None:
    """With one replica the container's flags are launch_flags' as printed, nothing taken out."""
    single = api.infer(
        **SMALL, gpus=1, input_len=1024, output_len=256, max_ttft_ms=1000, max_tpot_ms=50
    )
    assert int(_best(single)["replicas"]) == 1
    deployment = _docs(deploy_files.manifest(single, Engine.VLLM))[0]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (printed,) = _commands(launch_flags(single, Engine.VLLM))
    ran = container["command"] + _without_model(container["args"], "$(MODEL_PATH)")
    assert ran[:-4] == _without_model(printed, "MODEL_PATH")
    assert deployment["spec"]["replicas"] == 1


@pytest.mark.parametrize("engine", SERVED)
def test_disaggregated_winner_is_a_dynamo_graph(
    disaggregated: ServingResult, engine: Engine
) -> None:
    row = _best(disaggregated)
    (doc,) = _docs(deploy_files.manifest(disaggregated, engine))
    # No schema ships for the custom resource: the fields the operator reads, checked here.
    assert doc["apiVersion"] == "nvidia.com/v1beta1"
    assert doc["kind"] == "DynamoGraphDeployment"
    assert DNS_1123.match(doc["metadata"]["name"])
    components = {c["name"]: c for c in doc["spec"]["components"]}
    assert list(components) == ["Frontend", "prefill", "decode"]
    assert [c["type"] for c in components.values()] == ["frontend", "prefill", "decode"]
    for component in components.values():
        assert set(component) <= {"name", "type", "replicas", "podTemplate", "multinode"}
        # each pod template is a core one: checked against the Kubernetes schema
        template = component["podTemplate"]
        _valid(
            {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": "t"},
                "template": template,
            }
        )
        assert [c["name"] for c in template["spec"]["containers"]] == ["main"]  # Dynamo's
    assert components["Frontend"]["replicas"] == 1
    pools = {
        "prefill": (row["prefill_replicas"], row["prefill_tp"] * row["prefill_pp"]),
        "decode": (row["replicas"], row["tp"] * row["pp"]),
    }
    printed = dict(
        zip(("prefill", "decode"), _commands(launch_flags(disaggregated, engine)), strict=True)
    )
    text = launch_flags(disaggregated, engine)
    assert text.index("# prefill:") < text.index("# decode:")  # the order read above
    for role, (replicas, gpus) in pools.items():
        component = components[role]
        (container,) = component["podTemplate"]["spec"]["containers"]
        assert component["replicas"] == int(replicas)
        assert container["resources"]["limits"] == {"nvidia.com/gpu": int(gpus)}
        assert "multinode" not in component  # fits a node
        module = f"dynamo.{engine.value}"
        assert container["command"] == ["python3", "-m", module]
        flags = _without_model(container["args"], "$(MODEL_PATH)")
        expected = _without_model(printed[role], "MODEL_PATH")
        program = 2 if engine is Engine.VLLM else 3  # vllm serve | python -m sglang.launch_server
        assert flags[: len(expected) - program] == expected[program:]
        added = flags[len(expected) - program :]
        if engine is Engine.VLLM:  # the role, which launch_flags leaves to the router
            assert added == ["--disaggregation-mode", role]
        else:  # launch_flags names the role already; Dynamo's template adds the transfer
            assert _flag(expected, "--disaggregation-mode") == role
            assert added[:2] == ["--disaggregation-transfer-backend", "nixl"]


def test_a_worker_wider_than_a_node_spans_nodes(disaggregated: ServingResult) -> None:
    # The winner's decode server made two GPUs wide (tp 2), on nodes of one GPU each.
    table = disaggregated.table.copy()
    table.loc[table.index[0], "tp"] = 2
    narrow = dataclasses.replace(
        disaggregated,
        table=table,
        request=dataclasses.replace(disaggregated.request, gpus_per_node=1),
    )
    (doc,) = _docs(deploy_files.manifest(narrow, Engine.VLLM))
    decode = doc["spec"]["components"][2]
    gpus = int(_best(narrow)["tp"] * _best(narrow)["pp"])
    assert gpus == 2
    assert decode["multinode"] == {"nodeCount": 2}
    limits = decode["podTemplate"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": 1}


def _bench_argv(script: str, program: str) -> list[str]:
    """The benchmark command of bench.sh as the shell would run it, with HOST, PORT and
    MODEL_PATH left as written."""
    joined = script.replace("\\\n", " ")
    (line,) = [x for x in joined.splitlines() if x.startswith(program)]
    return shlex.split(line.split(" -- ")[0], posix=True)


@pytest.mark.parametrize("engine", SERVED)
def test_bench_sends_the_predicted_point(
    colocated: ServingResult, disaggregated: ServingResult, engine: Engine
) -> None:
    for result in (colocated, disaggregated):
        row = _best(result)
        script = deploy_files.bench_script(result, engine)
        argv = _bench_argv(script, "vllm bench serve")
        # no rate was asked for: the operating point is the goodput
        assert float(_flag(argv, "--request-rate")) == pytest.approx(
            float(row["goodput_rps"]), rel=1e-5
        )
        assert float(row["rate_rps"]) == pytest.approx(float(row["goodput_rps"]))
        assert int(_flag(argv, "--random-input-len")) == result.request.input_len
        assert int(_flag(argv, "--random-output-len")) == result.request.output_len
        assert float(_flag(argv, "--random-range-ratio")) == 0.0  # fixed lengths
        assert int(_flag(argv, "--num-prompts")) == 100
        assert _flag(argv, "--dataset-name") == "random"
        assert "--ignore-eos" in argv
        assert _flag(argv, "--percentile-metrics") == "ttft,tpot,e2el"
        assert "90" in _flag(argv, "--metric-percentiles").split(",")
        budget = result.request.budget
        slos = argv[argv.index("--goodput") + 1 : argv.index("--goodput") + 3]
        assert slos == [f"ttft:{budget.max_ttft_ms:g}", f"tpot:{budget.max_tpot_ms:g}"]
        # it targets what the manifest deploys
        docs = _docs(deploy_files.manifest(result, engine))
        if row["mode"] == "disaggregated":
            host, port = f"{docs[0]['metadata']['name']}-frontend", 8000
        else:
            host, port = docs[1]["metadata"]["name"], docs[1]["spec"]["ports"][0]["port"]
        assert f'HOST="${{HOST:-{host}}}"' in script and f'PORT="${{PORT:-{port}}}"' in script


def test_bench_at_a_requested_rate_and_uniform_lengths() -> None:
    result = api.infer(
        **SMALL, gpus=1, input_len="512:1536", output_len="128:384", max_ttft_ms=2000,
        max_tpot_ms=60, request_rate=2.0,
    )  # fmt: skip
    row = _best(result)
    assert float(row["rate_rps"]) == pytest.approx(2.0)
    argv = _bench_argv(deploy_files.bench_script(result, Engine.VLLM), "vllm bench serve")
    assert float(_flag(argv, "--request-rate")) == pytest.approx(2.0)
    assert (result.request.input_len, result.request.output_len) == (1024, 256)
    assert int(_flag(argv, "--random-input-len")) == 1024
    # uniform in [512, 1536] is 1024·(1 ± 0.5); outputs alike
    assert float(_flag(argv, "--random-range-ratio")) == 0.5
    genai = _bench_argv(deploy_files.bench_script(result, Engine.TRTLLM), "genai-perf profile")
    assert int(_flag(genai, "--synthetic-input-tokens-stddev")) == round(1024 / math.sqrt(12))
    assert int(_flag(genai, "--output-tokens-stddev")) == round(256 / math.sqrt(12))


def test_genai_perf_for_trtllm(colocated: ServingResult) -> None:
    row = _best(colocated)
    script = deploy_files.bench_script(colocated, Engine.TRTLLM)
    argv = _bench_argv(script, "genai-perf profile")
    assert float(_flag(argv, "--request-rate")) == pytest.approx(float(row["rate_rps"]), rel=1e-5)
    assert int(_flag(argv, "--synthetic-input-tokens-mean")) == 1024
    assert int(_flag(argv, "--output-tokens-mean")) == 256
    assert int(_flag(argv, "--synthetic-input-tokens-stddev")) == 0
    assert _flag(argv, "--endpoint-type") == "completions" and "--streaming" in argv
    # the simulation's first tenth warms up; the rest is measured
    assert int(_flag(argv, "--warmup-request-count")) + int(_flag(argv, "--request-count")) == 100
    assert "-- \\\n    --request-distribution=poisson" in script
    assert deploy_texts(colocated, Engine.TRTLLM).keys() == {"bench.sh"}  # no manifest


def _stand_in(folder: Path, name: str) -> None:
    """An executable `name` that records its arguments, one a line."""
    path = folder / name
    path.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "{folder}/{name}.args"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.TRTLLM])
def test_bench_script_runs(tmp_path: Path, colocated: ServingResult, engine: Engine) -> None:
    """bench.sh as a shell runs it: the tool gets the predicted rate, the model, the host."""
    (path,) = [p for p in write_deploy_files(colocated, engine, tmp_path) if p.name == "bench.sh"]
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("vllm", "genai-perf"):
        _stand_in(tools, tool)
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "MODEL_PATH": "org/model"}
    env.pop("HOST", None)
    done = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    tool = "vllm" if engine is Engine.VLLM else "genai-perf"
    got = (tools / f"{tool}.args").read_text().splitlines()
    rate = float(_best(colocated)["rate_rps"])
    assert float(_flag(got, "--request-rate")) == pytest.approx(rate, rel=1e-5)
    assert _flag(got, "--model") == "org/model"
    if engine is Engine.VLLM:
        service = _docs(deploy_files.manifest(colocated, engine))[1]["metadata"]["name"]
        assert got[:2] == ["bench", "serve"] and _flag(got, "--host") == service
    else:
        assert _flag(got, "--url") == "localhost:8000"
        assert got[-2:] == ["--", "--request-distribution=poisson"]
    # without MODEL_PATH it stops before sending anything
    env.pop("MODEL_PATH")
    bare = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True)
    assert bare.returncode != 0 and "MODEL_PATH" in bare.stderr


def test_write_deploy_files(tmp_path: Path, colocated: ServingResult) -> None:
    paths = write_deploy_files(colocated, Engine.SGLANG, tmp_path / "deploy")
    assert [p.name for p in paths] == ["k8s.yaml", "bench.sh"]
    texts = deploy_texts(colocated, Engine.SGLANG)
    for path in paths:
        assert path.read_text() == texts[path.name]
    assert os.access(paths[1], os.X_OK)
    note = f"value: REPLACE-WITH-MODEL-PATH  # the {colocated.model.name} checkpoint"
    assert note in texts["k8s.yaml"]
    # nothing meets the budget: nothing to deploy, as launch_flags prints nothing
    none = dataclasses.replace(colocated, feasible=0)
    assert (
        deploy_texts(none, Engine.VLLM) == {}
        and write_deploy_files(none, Engine.VLLM, tmp_path) == []
    )
    static = dataclasses.replace(
        colocated, request=dataclasses.replace(colocated.request, batching="static")
    )
    with pytest.raises(UserError, match="continuous-batching"):
        deploy_texts(static, Engine.VLLM)


def test_without_latency_limits_no_goodput_flag(colocated: ServingResult) -> None:
    throughput_only = dataclasses.replace(
        colocated,
        request=dataclasses.replace(colocated.request, budget=Budget(min_throughput=1.0)),
    )
    for engine in Engine:
        assert "--goodput" not in deploy_files.bench_args(throughput_only, engine)
        assert "--goodput" in deploy_files.bench_args(colocated, engine)


def test_infer_writes_the_deploy_files_beside_its_results(tmp_path: Path) -> None:
    """`infer --emit ENGINE --out DIR` writes k8s.yaml and bench.sh with the other results, and
    the manifest runs the flags it printed; without --emit it writes neither."""
    from tests.helpers import run_cli

    out = tmp_path / "served"
    args = ("infer", "--model", "llama3-8b", "--gpus", "8", "--gpu", "h100-sxm-80gb")
    done = run_cli(*args, "--requests", "200", "--emit", "vllm", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "k8s.yaml, bench.sh" in done.stderr
    manifest = (out / "k8s.yaml").read_text()
    for doc in _docs(manifest):
        _valid(doc)
    printed = done.stdout[done.stdout.index("# vllm:") :]
    assert "--max-num-seqs" in printed and "--max-num-seqs" in manifest
    assert os.access(out / "bench.sh", os.X_OK)
    plain = tmp_path / "plain"
    assert run_cli(*args, "--requests", "200", "--out", str(plain)).returncode == 0
    assert not (plain / "k8s.yaml").exists() and not (plain / "bench.sh").exists()
