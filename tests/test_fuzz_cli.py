"""Random flags and values for every subcommand, run in-process (autoconfig.cli.app.execute):
the exit code is 0, 1 or 2, nothing raises past the CLI (no traceback), a refusal is one line,
and no figure printed on success is NaN, infinite or negative.

The draws mix values a user means (small counts, catalog names, real files) with the hostile
ones (0, negatives, 2^24+1, 2^53+1, 10^30, nan, inf, text, binary files, folders, /proc), so
most examples exercise a check and enough run the whole command."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
import time
from pathlib import Path

import pytest
import yaml
from helpers import fuzz_examples
from hypothesis import given, settings
from hypothesis import strategies as st

from autoconfig.cli.app import execute
from autoconfig.spec import catalog

# Each command's draws in the thorough Hypothesis profile ("dev"): together over 5,000
# invocations, about 20 minutes on 2 shared cores. The profile loaded (tests/conftest.py) scales
# them (helpers.fuzz_examples): "ci", the default, runs a share of them, drawn afresh for each
# commit, and replays the failures it has kept first.
EXAMPLES = {"estimate": 1600, "search": 1100, "infer": 1300, "train": 400, "catalog": 700}


def fuzz(command: str):
    """A test of `command` from `body`, with its share of draws under the loaded profile."""

    def made(body):
        return settings(max_examples=fuzz_examples(EXAMPLES[command]))(given(data=st.data())(body))

    return made


STATS = {"invocations": 0, "seconds": 0.0, "by_code": {0: 0, 1: 0, 2: 0}, "by_command": {}}

EDGE_INTS = ["0", "-1", "-5", "16777216", "16777217", "9007199254740993", "10" * 15]
BAD_NUMBERS = ["nan", "inf", "-inf", "1e400", "abc", "", " ", "0x10", "1_0", "1e3", "2.5", "٣"]
REFUSED_INTS = ["-1", "16777217", "9007199254740993", "10" * 15, "nan", "inf", "abc", "", "2.5"]
# A NaN, an infinity or a negative figure; a signed percentage ("vs 371 (-13%)") is a change.
NAN_OR_NEGATIVE = re.compile(r"(?i)(?<![\w.])(nan|-?inf)(?![\w])|(?<![\w.%+\-/])-\d(?![\d.,]*%)")


RUNS = "model,layers,hidden,heads,vocab,gpu,num_gpus,tp,pp,gbs,seq_len"
HF = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1000}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Inputs a fuzzed flag may point at: good and hostile files, a folder, /proc."""
    root = tmp_path_factory.mktemp("fuzz")
    made = {
        "runs.csv": f"{RUNS}\nllama3-8b,,,,,h100-sxm-80gb,8,1,1,64,2048\n"
        "tiny-llama,,,,,a100-sxm-80gb,4,2,1,8,128\n"
        "=cmd|' /C calc'!A0,2,256,4,1000,h100-sxm-80gb,8,1,1,8,128\n",
        "serve.csv": "model,layers,hidden,heads,vocab,gpu,num_gpus,tp,pp,batch_size,input_len,"
        "output_len\nllama3-8b,,,,,h100-sxm-80gb,1,1,1,8,128,128\n",
        "huge.csv": f"{RUNS}\nllama3-8b,,,,,h100-sxm-80gb,8,1,1,64,1e23\n",
        "space.yaml": "tp: [1, 2]\npp: [1]\nmbs: [1, 2]\n",
        "bad_space.yaml": "tp: [1, 2\n",
        "odd_space.yaml": "tp: [[1, 2]]\nwhat: 3\n",
        "config.json": json.dumps(HF | {"max_position_embeddings": 512}),
        "lots.json": json.dumps(HF | {"max_position_embeddings": "lots"}),
        "bool.json": json.dumps(HF | {"num_hidden_layers": True})[:-1]
        + ', "max_position_embeddings": 1e400}',
        "profile.yaml": yaml.safe_dump(catalog.get_gpu("a100-sxm-80gb").model_dump(mode="json")),
        "bad_profile.yaml": "name: x\n",
    }
    paths = {}
    for name, text in made.items():
        paths[name] = root / name
        paths[name].write_text(text)
    paths["binary"] = root / "binary.bin"
    paths["binary"].write_bytes(bytes(range(256)) * 8)
    paths["folder"] = root / "folder"
    paths["folder"].mkdir()
    paths["root"] = root
    return paths


_counter = itertools.count()


def _out_folder(files: dict[str, Path]) -> st.SearchStrategy[str]:
    fresh = st.builds(lambda: str(files["root"] / "out" / f"o{next(_counter)}"))
    return st.one_of(
        fresh,
        st.sampled_from([str(files["runs.csv"]), "/proc/autoconfig", str(files["folder"])]),
    )


def _out_file(files: dict[str, Path]) -> st.SearchStrategy[str]:
    fresh = st.builds(lambda: str(files["root"] / "csv" / f"p{next(_counter)}.csv"))
    return st.one_of(fresh, st.sampled_from([str(files["folder"]), "/proc/x.csv"]))


def mostly(good: st.SearchStrategy[str], bad: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A value a user means nine times in ten, else a hostile one: with several flags drawn,
    enough invocations pass every check to run the whole command."""
    # Hypothesis favours the low end of a range: 0 must be the common, good case.
    return st.integers(0, 9).flatmap(lambda k: bad if k == 9 else good)


def count(low: int = 1, high: int = 8, refused_only: bool = False) -> st.SearchStrategy[str]:
    """A count in [low, high], else an edge or garbage; with `refused_only` the hostile values
    are ones every check refuses (a real but huge count would train for real)."""
    if refused_only:
        hostile = st.one_of(st.sampled_from(REFUSED_INTS), st.integers(-(10**6), low - 1).map(str))
    else:
        hostile = st.one_of(
            st.sampled_from(EDGE_INTS + BAD_NUMBERS), st.integers(-(10**6), 10**6).map(str)
        )
    return mostly(st.integers(low, high).map(str), hostile)


def amount() -> st.SearchStrategy[str]:
    hostile = st.one_of(
        st.sampled_from([*BAD_NUMBERS, "-3", "0", "1e16"]),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
    )
    return mostly(st.floats(0.01, 1e4).map(lambda x: f"{x:.3g}"), hostile)


MODELS = ["tiny-llama", "tiny-gpt", "gpt3-126m", "llama3-8b", "mixtral-8x7b", "llama3-71b", ""]
GPUS = ["h100-sxm-80gb", "a100-sxm-80gb", "cpu-gloo", "H100-SXM-80GB ", "h900"]


def model(files: dict[str, Path]) -> st.SearchStrategy[str]:
    paths = [str(files[n]) for n in ("config.json", "lots.json", "bool.json", "binary", "folder")]
    return mostly(st.sampled_from(MODELS[:5] + paths[:1]), st.sampled_from(MODELS[5:] + paths[1:]))


def flags(data: st.DataObject, spec: dict[str, st.SearchStrategy[str]], keep: float) -> list[str]:
    """Each flag of `spec` with probability `keep`, in a random order."""
    chosen = [name for name in spec if data.draw(st.floats(0, 1)) < keep]
    order = data.draw(st.permutations(chosen))
    argv: list[str] = []
    for name in order:
        value = data.draw(spec[name])
        argv += [f"--{name}"] if value is None else [f"--{name}", value]
    return argv


def invoke(argv: list[str]) -> str:
    """Run the CLI in-process and check what every invocation must satisfy; returns what it
    printed (stdout and stderr)."""
    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = execute(argv)  # an exception here is a traceback a user would see
    STATS["seconds"] += time.perf_counter() - started
    STATS["invocations"] += 1
    STATS["by_code"][code] = STATS["by_code"].get(code, 0) + 1
    command = argv[0] if argv else ""
    n, spent = STATS["by_command"].get(command, (0, 0.0))
    STATS["by_command"][command] = (n + 1, spent + time.perf_counter() - started)
    said, printed = err.getvalue(), out.getvalue()
    assert code in (0, 1, 2), (argv, code, said[-500:])
    assert "Traceback" not in said + printed, argv
    if code == 2:
        errors = [line for line in said.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, (argv, said[-500:])
    else:
        bad = NAN_OR_NEGATIVE.search(printed)
        assert bad is None, (argv, printed[max(0, bad.start() - 200) : bad.end() + 100])
    return printed + said


def _fuzz_estimate(files, data) -> None:
    spec = {
        "gpu": st.sampled_from(GPUS),
        "tp": count(1, 8),
        "pp": count(1, 4),
        "vp": count(1, 2),
        "cp": count(1, 2),
        "ep": count(1, 2),
        "dp": count(1, 8),
        "mbs": count(1, 4),
        "gbs": count(1, 512),
        "seq-len": count(1, 8192),
        "recompute": mostly(st.sampled_from(["none", "selective", "full", "op"]), st.just("most")),
        "recompute-layers": count(0, 4),
        "zero": count(0, 3),
        "precision": mostly(st.sampled_from(["bf16", "fp8", "nvfp4"]), st.just("fp64")),
        "gpus-per-node": count(1, 8),
        "sp": st.none(),
        "no-flash": st.none(),
    }
    required = {"model": model(files), "gpus": count(1, 64)}
    argv = ["estimate", *flags(data, required, 0.95), *flags(data, spec, 0.3)]
    if data.draw(st.floats(0, 1)) < 0.15:
        runs = st.sampled_from(["runs.csv", "huge.csv", "serve.csv", "binary", "folder"])
        argv += ["--runs", str(files[data.draw(runs)])]
        if data.draw(st.booleans()):
            argv += ["--out", data.draw(_out_file(files))]
    invoke(argv)


def _fuzz_search(files, data) -> None:
    spec = {
        "gpu": st.sampled_from(GPUS),
        "seq-len": count(64, 2048),
        "gbs": count(1, 256),
        "precision": mostly(st.sampled_from(["bf16", "fp8"]), st.just("fp4")),
        "space": mostly(
            st.just("space.yaml"), st.sampled_from(["bad_space.yaml", "odd_space.yaml", "binary"])
        ).map(lambda n: str(files[n])),
        "profile": mostly(
            st.just("profile.yaml"), st.sampled_from(["binary", "bad_profile.yaml", "folder"])
        ).map(lambda n: str(files[n])),
        "fix": mostly(
            st.sampled_from(["tp=2", "pp=2,zero=1", "tp=3"]),
            st.sampled_from(["tp", "xx=1", "tp=1e30", "mbs=-1"]),
        ),
        "max-tp": count(1, 8),
        "max-pp": count(1, 8),
        "min-dp": count(1, 8),
        "max-memory-gib": amount(),
        "memory-headroom": mostly(
            st.sampled_from(["0", "0.1", "0.5"]), st.sampled_from(["1", "-0.1", "nan"])
        ),
        "gpus-per-node": count(1, 8),
        "top": count(0, 20),
        "tokens": amount(),
        "gpu-hour-usd": amount(),
        "emit": mostly(st.sampled_from(["megatron", "nemo", "torchtitan"]), st.just("deepspeed")),
        "out": _out_folder(files),
    }
    required = ["--model", data.draw(model(files)), "--gpus", data.draw(count(1, 16))]
    optional = flags(data, spec, 0.2)
    if "--profile" in optional and "--gpu" in optional and data.draw(st.floats(0, 1)) < 0.9:
        at = optional.index("--gpu")  # both at once is refused: mostly keep one
        del optional[at : at + 2]
    if "--out" in optional and data.draw(st.floats(0, 1)) < 0.8:  # the report is slow to write
        at = optional.index("--out")
        del optional[at : at + 2]
    invoke(["search", *required, *optional])


def _fuzz_infer(files, data) -> None:
    spec = {
        "gpu": st.sampled_from(GPUS),
        "max-ttft-ms": amount(),
        "max-tpot-ms": amount(),
        "max-latency-ms": amount(),
        "min-throughput": amount(),
        "objective": mostly(st.sampled_from(["throughput", "latency"]), st.just("cost")),
        "precision": mostly(st.sampled_from(["bf16", "fp8", "int4"]), st.just("int3")),
        "kv-precision": mostly(st.sampled_from(["auto", "fp8"]), st.just("fp4")),
        "max-batch": count(1, 256),
        "batch": count(1, 64),
        "gpus-per-node": count(1, 8),
        "top": count(0, 20),
    }
    required = {
        "model": model(files),
        "gpus": mostly(count(1, 16), st.just("1000000000000")),
        "input-len": count(1, 4096),
        "output-len": count(1, 1024),
    }
    argv = ["infer", *flags(data, required, 0.9), *flags(data, spec, 0.25)]
    if data.draw(st.floats(0, 1)) < 0.1:
        argv += ["--runs", str(files[data.draw(st.sampled_from(["serve.csv", "binary"]))])]
        if data.draw(st.booleans()):
            argv += ["--out", data.draw(_out_file(files))]
    invoke(argv)


def _fuzz_train(files, data) -> None:
    # Sizes that pass the checks stay tiny: a valid draw trains for real, in this process.
    small = {  # always given: the defaults (all layers, 10 steps) would take seconds a run
        "layers": count(1, 2, refused_only=True),
        "seq-len": count(8, 32, refused_only=True),
        "steps": count(1, 2, refused_only=True),
    }
    spec = {
        "tp": count(1, 1, refused_only=True),
        "pp": count(1, 1, refused_only=True),
        "mbs": count(1, 2, refused_only=True),
        "recompute": st.sampled_from(["none", "selective", "full", "op"]),
        "zero": count(0, 3, refused_only=True),
        "warmup": count(0, 1, refused_only=True),
        "seed": mostly(st.sampled_from(["0", "1"]), st.sampled_from(["-1", "4294967296", "x"])),
        "precision": mostly(st.sampled_from(["auto", "fp32", "bf16"]), st.just("fp8")),
    }
    tiny = mostly(
        st.sampled_from(["tiny-llama", "tiny-gpt"]),
        st.sampled_from(["llama3-71b", str(files["lots.json"])]),
    )
    argv = ["train", "--model", data.draw(tiny), "--device", "cpu", *flags(data, small, 1.0)]
    argv += flags(data, spec, 0.4)
    argv += ["--out", data.draw(_out_folder(files))]
    invoke(argv)


def _fuzz_catalog_commands_and_strays(files, data) -> None:
    storage = st.sampled_from(
        [
            "postgresql://fuzz:s3cr3t-pw@127.0.0.1:1/nothing",
            "sqlite:////proc/nope/study.db",
            "mysql://u:hunter2@nowhere/x",
            "not a url",
        ]
    )
    kind = data.draw(st.sampled_from(["models", "gpus", "calibrate", "stray"]))
    if kind in ("models", "gpus"):
        argv = [kind, *data.draw(st.lists(st.sampled_from(["--top", "x", "--help"]), max_size=2))]
    elif kind == "calibrate":
        run = data.draw(st.sampled_from(["folder", "runs.csv", "binary", "root"]))
        argv = ["calibrate", str(files[run])]
        argv += flags(data, {"write": _out_file(files), "storage": storage}, 0.5)
    else:  # unknown commands, flags before commands, empty arguments
        argv = data.draw(
            st.lists(
                st.sampled_from(["", "--", "-x", "serch", "--model", "search", "1"]), max_size=4
            )
        )
    said = invoke(argv)
    assert "s3cr3t-pw" not in said and "hunter2" not in said  # storage passwords are masked


test_fuzz_estimate = fuzz("estimate")(_fuzz_estimate)
test_fuzz_search = fuzz("search")(_fuzz_search)
test_fuzz_infer = fuzz("infer")(_fuzz_infer)
test_fuzz_train = fuzz("train")(_fuzz_train)
test_fuzz_catalog_commands_and_strays = fuzz("catalog")(_fuzz_catalog_commands_and_strays)


@pytest.fixture(scope="module", autouse=True)
def report_count():
    """After the module: how many invocations ran and how long they took (shown with -s)."""
    yield
    if STATS["invocations"]:
        per = 1000 * STATS["seconds"] / STATS["invocations"]
        print(
            f"\nCLI fuzz: {STATS['invocations']} invocations in {STATS['seconds']:.0f} s "
            f"({per:.0f} ms each); exit codes {STATS['by_code']}"
        )
        for command, (n, spent) in sorted(STATS["by_command"].items()):
            print(f"  {command or '(none)'}: {n} in {spent:.1f} s")
