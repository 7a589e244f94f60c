"""GPU runs kept as goldens (fixtures/golden/gpu/*.json), re-judged on CPU by this checkout.

Each golden holds one H200 run's key, its metrics.jsonl lines, the command and commit that made it and
the verdict its gates must give: the clean runs pass on every seed, each fault twin fails its own gate.
A change of the shipped bounds or of the gates that would contradict a GPU measurement fails here. So
does a memory estimate that no longer meets a measured peak (within 15 %, never more than 5 % under).

A new golden from a run folder (the folder itself is not committed):

    python tests/unit/test_gpu_records.py RUN_DIR --name NAME --what "..." --command "rlsmoke run ..." \
        --commit SHA --machine "one NVIDIA H200" --date YYYY-MM-DD [--fails GATE] [--memory]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "fixtures" / "golden" / "gpu"
SCHEMA = "rlsmoke-gpu-golden/1"
KEY_FIELDS = ("case", "platform", "device", "launcher", "dtype", "width", "num_gpus", "seed", "mode", "trainer",
              "kda", "inject", "rollout_temperature", "repeat")  # fmt: skip
ESTIMATE_RULE = (-0.05, 0.15)  # (estimate - measured) / measured: never more than 5 % under, within 15 % over


def goldens() -> list[Path]:
    return sorted(p for p in GOLDEN.glob("*.json") if p.name != "schema.json")


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _verdicts(golden: dict, folder: Path) -> list[tuple[bool, list[str]]]:
    """Every seed of the run gated by this checkout's thresholds, as `rlsmoke run` and the suite gate it."""
    from rlsmoke.metrics import seed_records
    from rlsmoke.runkey import RunKey
    from rlsmoke.thresholds import lookup_gates

    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps(golden["summary"]))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in golden["metrics"]))
    records = seed_records(folder)
    gates = lookup_gates(RunKey.from_summary(records[0].meta))
    verdicts = [gates.check(record) for record in records]
    return [(v.passed, [r.gate.name for r in v.results if not r.passed]) for v in verdicts]


def test_every_golden_meets_its_schema():
    jsonschema = pytest.importorskip("jsonschema")
    schema = _load(GOLDEN / "schema.json")
    assert len(goldens()) >= 10
    for path in goldens():
        jsonschema.validate(_load(path), schema)


def test_a_golden_without_its_command_is_refused():
    """The schema's twin: a golden that cannot say how it was made is no golden."""
    jsonschema = pytest.importorskip("jsonschema")
    golden = _load(goldens()[0])
    del golden["command"]
    with pytest.raises(jsonschema.ValidationError, match="'command' is a required property"):
        jsonschema.validate(golden, _load(GOLDEN / "schema.json"))


@pytest.mark.parametrize("path", goldens(), ids=lambda p: p.stem)
def test_the_gates_give_each_gpu_run_its_verdict_on_every_seed(path, tmp_path):
    golden = _load(path)
    expect = golden["expect"]
    verdicts = _verdicts(golden, tmp_path / "run")
    assert len(verdicts) == expect["seeds"], verdicts
    if expect["verdict"] == "PASS":
        assert [failed for _, failed in verdicts if failed] == [], (
            f"{path.name}: a clean H200 run fails its gates"
        )
    else:
        missed = [
            (seed, failed) for seed, (_, failed) in enumerate(verdicts) if expect["fails"] not in failed
        ]
        assert missed == [], f"{path.name}: seeds whose {expect['fails']} gate no longer catches the fault"


MEASURED = [p for p in goldens() if "memory" in _load(p)]


@pytest.mark.parametrize("path", MEASURED, ids=lambda p: p.stem)
def test_the_memory_estimate_meets_each_measured_peak(path):
    from rlsmoke import memory
    from rlsmoke.models import model_spec

    golden = _load(path)
    plan = memory.Plan(**golden["memory"]["plan"])
    estimate = memory.estimate(model_spec(golden["summary"]["case"]), plan).peak / 2**30
    measured = golden["memory"]["measured_peak_gib"]
    error = (estimate - measured) / measured
    low, high = ESTIMATE_RULE
    assert low <= error <= high, (
        f"{path.stem}: estimate {estimate:.2f} GiB against {measured:.2f} measured ({error:+.1%})"
    )


def test_a_twin_and_its_clean_run_share_a_key():
    """A fault twin is judged by its clean run's key (the inject is no part of it): each model's twins
    have a clean golden with the same key, so the bounds that pass the one fail the other."""
    from rlsmoke.runkey import RunKey

    def key(golden):
        return RunKey.from_summary(golden["summary"])

    loaded = [_load(p) for p in goldens()]
    clean = {key(g) for g in loaded if g["expect"]["verdict"] == "PASS"}
    assert [g["what"] for g in loaded if g["expect"]["verdict"] == "FAIL" and key(g) not in clean] == []


def golden_from_run(run: Path, *, what: str, command: str, commit: str, machine: str, date: str,
                    fails: str | None, with_memory: bool) -> dict:  # fmt: skip
    """A golden of `run`: its key, its metrics lines, and (`with_memory`) the memory plan it ran."""
    summary = _load(run / "summary.json")
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    seeds = len({line.get("repeat", 0) for line in lines})
    golden = {"schema": SCHEMA, "what": what, "command": command, "commit": commit, "machine": machine, "date": date,
              "expect": {"verdict": "FAIL", "fails": fails, "seeds": seeds} if fails else
              {"verdict": "PASS", "seeds": seeds},
              "summary": {k: summary[k] for k in KEY_FIELDS if k in summary}}  # fmt: skip
    if with_memory:
        mem, shape, dtype = summary["memory"], summary.get("shape", {}), summary["dtype"]
        world = int(mem.get("world") or 1)
        plan = {"world": world, "mode": summary["mode"], "train_dtype": dtype["train"],
                "rollout_dtype": dtype["rollout"], "compute_dtype": dtype["compute"], "offload": mem["offload"],
                "offload_train": mem.get("offload_train", mem["offload"]),
                "compute_copy": summary.get("trainer", "fsdp") != "megatron" and dtype["compute"] != dtype["train"]
                and world == 1, "fused_adamw": world == 1,
                "n_prompts": shape.get("n_prompts", 8), "n_samples": shape.get("n_samples", 8),
                "response_len": shape.get("max_response_len", 100), "kda": summary.get("kda") or "fla",
                "initial_on_device": mem.get("initial_on_device", False)}  # fmt: skip
        golden["memory"] = {"plan": plan, "measured_peak_gib": max(mem["peak_gib_per_rank"])}
    golden["metrics"] = lines
    return golden


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Write a GPU run folder as a golden of fixtures/golden/gpu/.")
    ap.add_argument("run", type=Path)
    ap.add_argument("--name", required=True, help="the golden's file name, without .json")
    for flag in ("--what", "--command", "--commit", "--machine", "--date"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--fails", help="a fault twin: the gate every seed must fail")
    ap.add_argument("--memory", action="store_true", help="keep the run's memory plan and measured peak")
    args = ap.parse_args()
    golden = golden_from_run(args.run, what=args.what, command=args.command, commit=args.commit,
                             machine=args.machine, date=args.date, fails=args.fails, with_memory=args.memory)  # fmt: skip
    (GOLDEN / f"{args.name}.json").write_text(json.dumps(golden, indent=1) + "\n")
