"""Bad input to `rlsmoke run` is refused before anything loads: one `error:` line, exit 2, torch not
imported and the --out folder not even made. A crash is exit 3 with its cause, never exit 1 (a gate).
"""

import json
import os
import subprocess
import sys

import pytest

from rlsmoke.errors import ExitCode

CASE = "glm5-744b-a40b-4layer"
# `rlsmoke run` in a fresh interpreter that says, on stdout, which heavy modules it had imported
# when it returned: a refusal before loading imports none of them.
CLI = (
    "import sys; from rlsmoke.cli import main; rc = main(sys.argv[1:]); "
    "print('loaded:', sorted(m for m in ('torch', 'transformers', 'ray') if m in sys.modules)); sys.exit(rc)"
)


def refused(tmp_path, *argv: str, env: dict | None = None) -> str:
    """Runs `rlsmoke run CASE --platform cpu ARGV`; returns its one error line after checking how it ended."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", CLI, "run", CASE, "--platform", "cpu", "--out", str(out), *argv],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})  # fmt: skip
    err = proc.stderr.strip()
    assert proc.returncode == ExitCode.USAGE, (proc.returncode, err[-3000:])
    assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith("error: ["), err
    assert "loaded: []" in proc.stdout, proc.stdout  # refused before torch, transformers or Ray loaded
    assert not out.exists(), "a refused run must write nothing"
    return err


@pytest.mark.parametrize("flag, rule", [("--n-samples", "n_samples=0"), ("--n-prompts", "n_prompts"),
                                        ("--max-response-len", "max_response_len")])  # fmt: skip
def test_a_zero_batch_size_is_refused_not_replaced_by_the_default(tmp_path, flag, rule):
    err = refused(tmp_path, flag, "0")
    assert "[run.config]" in err and rule in err and flag in err, err


def test_prompt_data_that_is_not_jsonl_is_refused(tmp_path):
    text = tmp_path / "prompts.txt"
    text.write_text("What is 7 + 5?\nCompute 9 * 8.\n")
    err = refused(tmp_path, "--prompt-data", str(text))
    assert "[data.jsonl]" in err and f"{text}:1" in err and "JSON" in err, err


@pytest.mark.parametrize("rows, named", [([{"oops": 1}] * 8, ":1 has no prompt, label"),
                                         ([{"prompt": 7, "label": "1"}] * 8, ":1's prompt is not a string"),
                                         ([[1, 2]] * 8, ":1 is not an object")])  # fmt: skip
def test_prompt_rows_without_prompt_and_label_are_refused(tmp_path, rows, named):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    err = refused(tmp_path, "--prompt-data", str(data))
    assert "[data.rows]" in err and named in err and str(data) in err, err


def test_too_few_prompt_rows_are_refused(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"prompt": "What is 7 + 5?", "label": "12"}) + "\n")
    err = refused(tmp_path, "--prompt-data", str(data), "--n-prompts", "2")
    assert "[data.rows]" in err and "has 1 rows" in err and "--n-prompts" in err, err


def test_missing_prompt_data_is_refused(tmp_path):
    err = refused(tmp_path, "--prompt-data", str(tmp_path / "nowhere.jsonl"))
    assert "[data.exists]" in err, err


def test_a_thresholds_folder_with_malformed_json_is_refused(tmp_path):
    folder = tmp_path / "thresholds"
    folder.mkdir()
    (folder / "cluster.json").write_text('{"schema_version": 1, "entries": [')
    err = refused(tmp_path, env={"RLSMOKE_THRESHOLDS_DIR": str(folder)})
    assert "[thresholds.json]" in err and str(folder / "cluster.json") in err, err


def test_a_thresholds_gate_without_a_bound_is_refused(tmp_path):
    folder = tmp_path / "thresholds"
    folder.mkdir()
    entry = {"key": {"case": CASE}, "gates": [{"name": "kl", "metric": "train/train_rollout_kl", "op": "<="}]}
    (folder / "cluster.json").write_text(json.dumps({"schema_version": 1, "entries": [entry]}))
    err = refused(tmp_path, env={"RLSMOKE_THRESHOLDS_DIR": str(folder)})
    assert "[thresholds.schema]" in err and "bound" in err and "cluster.json" in err, err


def test_a_missing_thresholds_dir_is_refused(tmp_path):
    err = refused(tmp_path, env={"RLSMOKE_THRESHOLDS_DIR": str(tmp_path / "nonexistent")})
    assert "[thresholds.dir]" in err and "nonexistent" in err, err


def test_a_crash_is_exit_3_with_its_cause_never_exit_1(tmp_path, monkeypatch, capsys):
    """A bug in the engine (planted here: no shipped path should raise it) must not read as a failed gate."""
    import rlsmoke.engine.run
    from rlsmoke.cli import main

    def broken_engine(cfg, out, *, repeat=1, process_s=None):
        out.mkdir(parents=True, exist_ok=True)
        (out / "run.log").write_text("[   0.01s] config: ...\n")
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(rlsmoke.engine.run, "execute", broken_engine)
    out = tmp_path / "out"
    assert main(["run", CASE, "--platform", "cpu", "--out", str(out)]) == ExitCode.RUN_FAILED
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: [run.crashed]"), err
    assert "ZeroDivisionError: float division by zero" in err and str(out / "run.log") in err, err
    log = (out / "run.log").read_text()
    assert "Traceback" in log and log.rstrip().splitlines()[-1].endswith(
        "ZeroDivisionError: float division by zero"
    )


# --- 1. every input has a range, checked before torch loads ----------------------------------------


def long_prompt_file(tmp_path, words: int):
    data = tmp_path / "long.jsonl"
    rows = [{"prompt": "What is 7 + 5?", "label": "12"}] * 3 + [
        {"prompt": "add " * words + "1 + 1?", "label": "2"}
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


@pytest.mark.parametrize("argv, rule, named", [
    (["--n-samples", "100000"], "[memory.host]", ["100000 samples", "GiB of host memory", "--n-samples"]),
    (["--rollout-temperature", "nan"], "[run.finite]", ["--rollout-temperature=nan"]),
    (["--rollout-temperature", "inf"], "[run.finite]", ["--rollout-temperature=inf"]),
    (["--inject", "rollout-noise=inf"], "[run.finite]", ["--inject rollout-noise"]),
    (["--inject", "train-dropout=2"], "[inject.value]", ["train-dropout=2", "0 < P < 1"]),
    (["--seed", str(2**64)], "[run.seed]", [f"--seed={2**64}", "2**64-1"]),
    (["--seed", "-1"], "[run.seed]", ["--seed=-1 is negative"]),
    (["--num-rollout", "101"], "[run.range]", ["--num-rollout=101"]),
    (["--repeat", "1001"], "[run.range]", ["--repeat=1001"]),
    (["--max-response-len", "5000"], "[run.context]", ["max_position_embeddings=4096", "lower --max-response-len"]),
    (["--max-response-len", "3000"], "[run.context]", ["index_topk=2048", "lower --max-response-len to at most"]),
    (["--num-gpus", "99999999999999999999"], "[gpus.range]", ["65536"]),
    (["--num-gpus", "2", "--gpus-per-node", "0"], "[gpus.per_node]", ["gpus_per_node=0"]),
    (["--set", "train.pp=1000000000000"], "[set.range]", ["train.pp"]),
    # which side of the offload moves means nothing without one: on CPU it is off unless --offload
    (["--offload-train"], "[run.offload_train]", ["--offload-train", "offload off", "add --offload"]),
    (["--no-offload-train"], "[run.offload_train]", ["--no-offload-train", "add --offload"]),
    (["--offload", "--offload-train", "--mode", "async", "--num-gpus", "2"], "[run.offload_train]", ["mode=async"]),
])  # fmt: skip
def test_every_input_has_a_range_checked_before_torch_loads(tmp_path, argv, rule, named):
    err = refused(tmp_path, *argv)
    assert err.startswith(f"error: {rule}") and all(n in err for n in named), err


def test_a_prompt_past_the_context_names_the_prompt_files_line_not_the_cap(tmp_path):
    data = long_prompt_file(tmp_path, words=3000)
    err = refused(tmp_path, "--prompt-data", str(data))
    assert err.startswith("error: [run.context]") and f"shorten line 4 of {data}" in err, err
    assert "--max-response-len to" not in err.split("Fix:")[1], err


def plan(*argv: str) -> subprocess.CompletedProcess:
    # the timeout guards a hang (the plan is instant): a loop linear in NUM_GPUS would run for hours
    return subprocess.run([sys.executable, "-m", "rlsmoke.cli", "plan", CASE, "--platform", "nvidia", *argv],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


@pytest.mark.parametrize("argv, rule", [(["--num-gpus", "99999999999999999999"], "[gpus.range]"),
                                        (["--num-gpus", "8", "--gpus-per-node", "0"], "[gpus.per_node]"),
                                        (["--num-gpus", "8", "--set", "rollout.dp=10000000000"], "[set.range]")])  # fmt: skip
def test_every_topology_size_has_an_upper_bound(argv, rule):
    proc = plan(*argv)
    assert proc.returncode == ExitCode.USAGE and proc.stderr.startswith(f"error: {rule}"), proc.stderr


def test_the_largest_plan_finds_its_fixes_without_a_loop_over_every_gpu_count():
    from rlsmoke.models import model_spec
    from rlsmoke.overrides import MAX_NUM_GPUS
    from rlsmoke.topology import _candidates, plan_topology

    spec = model_spec(CASE)
    topo = plan_topology(spec, "rocm", MAX_NUM_GPUS, validate=False)
    found = _candidates(topo, spec)
    assert len(found) < 200 and {1, 2, 64, 256, MAX_NUM_GPUS} <= set(found), found


# --- 4. thresholds files are checked whole on load -------------------------------------------------


def thresholds_dir(tmp_path, *files: list[dict]):
    folder = tmp_path / "thresholds"
    folder.mkdir(exist_ok=True)
    for n, entries in enumerate(files):
        (folder / f"cluster{n}.json").write_text(json.dumps({"schema_version": 1, "entries": entries}))
    return folder


KL = {"name": "kl", "metric": "train/train_rollout_kl", "op": "<=", "bound": 0.01}
KEY = {"case": CASE, "platform": "cpu", "launcher": "builtin"}


@pytest.mark.parametrize("files, rule, named", [
    ([[{"key": KEY, "gates": [KL | {"bound": float("nan")}]}]], "[thresholds.bound]", ["bound=nan", "cluster0.json"]),
    ([[{"key": KEY, "gates": [KL | {"bound": float("inf")}]}]], "[thresholds.bound]", ["bound=inf"]),
    ([[{"key": KEY, "gates": [KL]}], [{"key": KEY, "gates": [KL | {"bound": 0.02}]}]], "[thresholds.duplicate_key]",
     ["cluster0.json entry 1", "cluster1.json entry 1"]),
    ([[{"key": KEY, "gates": [KL, KL | {"metric": "train/ppo_kl"}]}]], "[thresholds.gate_names]", ["kl twice"]),
    ([[{"key": {"case": CASE}, "gates": [KL | {"metric": "train/never_logged"}]}]], "[thresholds.metric_logged]",
     ["'train/never_logged'", "launcher=builtin never logs"]),
])  # fmt: skip
def test_thresholds_files_are_checked_whole_on_load(tmp_path, files, rule, named):
    err = refused(tmp_path, env={"RLSMOKE_THRESHOLDS_DIR": str(thresholds_dir(tmp_path, *files))})
    assert err.startswith(f"error: {rule}") and all(n in err for n in named), err


def test_a_clusters_entry_with_a_shipped_key_still_wins(tmp_path, monkeypatch):
    """The duplicate-key rule spares the override RLSMOKE_THRESHOLDS_DIR exists for."""
    from rlsmoke import thresholds
    from rlsmoke.engine.config import BUILTIN_METRICS
    from rlsmoke.runkey import RunKey

    shipped = next(e for _, e in thresholds.read_entries(thresholds.THRESHOLDS_DIR) if e["key"].get("case") == CASE
                   and e["key"].get("platform") == "cpu" and e["key"].get("launcher") == "builtin")  # fmt: skip
    folder = thresholds_dir(tmp_path, [{"key": shipped["key"], "gates": [KL]}])
    monkeypatch.setenv("RLSMOKE_THRESHOLDS_DIR", str(folder))
    key = RunKey(CASE, "cpu", "CPU", "builtin", "float32/float32", "tiny", "1")
    thresholds.check_thresholds(key, BUILTIN_METRICS)
    assert thresholds.lookup_gates(key).source == str(folder / "cluster0.json")


def test_the_builtin_metrics_are_what_a_run_logs(tmp_path, capsys):
    from rlsmoke.cli import main
    from rlsmoke.engine.config import BUILTIN_METRICS
    from rlsmoke.metrics import load_record

    out = tmp_path / "out"
    code = main(["run", CASE, "--platform", "cpu", "--num-gpus", "2", "--out", str(out), "--records-only"])
    assert code == ExitCode.OK, capsys.readouterr().err[-3000:]
    assert set(load_record(out).keys()) == BUILTIN_METRICS


def test_the_device_memory_check_budgets_the_prompt_files_longest_prompt():
    from rlsmoke import residency
    from rlsmoke.engine.config import RunConfig

    two = RunConfig(case=CASE, tiny=False, platform="nvidia", device="cuda", device_class="H200", num_gpus=2,
                    n_prompts=2, rollout_dtype="bfloat16")  # fmt: skip
    short = residency.check_run_fits(two, prompt_tokens=10)
    assert short.phases == residency.check_run_fits(two).phases  # the estimate's 64-token budget
    long = residency.check_run_fits(two, prompt_tokens=1000)
    assert long.phases["rollout"] > short.phases["rollout"] and long.phases["train"] >= short.phases["train"]


def test_the_context_check_counts_a_prompt_as_the_engine_encodes_it(tmp_path):
    """limits.longest_prompt renders the chat template without transformers (before torch loads); it must
    count what engine.data.encode gives the model, line by line, or run.context guards the wrong length."""
    from transformers import AutoTokenizer

    from rlsmoke.engine.data import Prompt, encode, prompt_rows
    from rlsmoke.engine.limits import longest_prompt
    from rlsmoke.shipped import FIXTURES

    prompts = FIXTURES / "data" / "math.jsonl"
    rows = prompt_rows(prompts, 1)
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "tokenizer")
    for number, row in enumerate(rows, 1):
        one = tmp_path / f"line{number}.jsonl"
        one.write_text(json.dumps(row) + "\n")
        assert longest_prompt(one).tokens == len(encode(tokenizer, Prompt(row["prompt"], "")).ids), row[
            "prompt"
        ]
