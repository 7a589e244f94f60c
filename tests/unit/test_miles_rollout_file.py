"""Miles' debug-rollout file as rlsmoke writes it, against the schema recorded from Miles' own `Sample` and writer.

CI has no Miles checkout: the recorded schema (fixtures/miles_rollout/schema.json) is the gate. Where one
is (MILES_ROOT), the file also goes through Miles' own loader and `convert_samples_to_train_data`.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlsmoke.conformance.rollout_schema import record_schema
from rlsmoke.launch import rollout_file
from rlsmoke.launch.rollout_file import RolloutSample, mismatches, recorded_schema, schema_of
from rlsmoke.targets import TARGETS

MILES_ROOT = os.environ.get("MILES_ROOT")
needs_miles = pytest.mark.skipif(
    not (MILES_ROOT and Path(MILES_ROOT, "miles", "utils", "types.py").is_file()),
    reason="needs a Miles checkout in MILES_ROOT (CI has none: the schema test gates)",
)


def _samples(n_groups=2, n=3) -> list[RolloutSample]:
    out = []
    for g in range(n_groups):
        for j in range(n):
            resp = tuple(range(10 + j, 14 + j))
            out.append(RolloutSample(group_index=g, index=len(out), prompt=f"p{g}", label="12", prompt_tokens=(1, 2, 3),
                                     response_tokens=resp, response_text="x", reward=0.25 * j,
                                     rollout_log_probs=tuple(-0.5 for _ in resp), truncated=j == 0))  # fmt: skip
    return out


def _written(tmp_path) -> Path:
    return rollout_file.write(rollout_file.path_for(f"{tmp_path}/rollout_data/{{rollout_id}}.pt"), _samples())


def test_the_file_has_miles_layout_field_for_field(tmp_path):
    payload = rollout_file.load(_written(tmp_path))
    assert mismatches(payload) == []
    assert schema_of(payload) == {k: v for k, v in recorded_schema().items() if k != "provenance"}
    first = payload["samples"][0]
    assert first["tokens"][-first["response_length"] :] == list(range(10, 14))  # the response is the tail
    assert [s["status"] for s in payload["samples"][:2]] == ["truncated", "completed"]
    assert (
        len({s["index"] for s in payload["samples"]}) == 6
    )  # each its own: siblings of an index share a reward


@pytest.mark.parametrize(("edit", "named"), [
    (lambda s: s.__setitem__("rollout_logprobs", s.pop("rollout_log_probs")), "'rollout_log_probs' is missing"),
    (lambda s: s.pop("status"), "'status' is missing"),
    (lambda s: s.__setitem__("reward", "0.5"), "'reward' is str, Miles writes float"),
    (lambda s: s.__setitem__("loss_mask", s["loss_mask"][:-1]), "loss_mask has 3 entries, response_length 4"),
])  # fmt: skip
def test_a_renamed_or_retyped_field_is_named(tmp_path, edit, named):
    """The twin: one field of the file changed as a drifted writer would; the schema check names it."""
    payload = rollout_file.load(_written(tmp_path))
    for s in payload["samples"]:
        edit(s)
    assert any(named in line for line in mismatches(payload)), mismatches(payload)


def test_the_schema_names_its_miles_commit_and_command():
    prov = recorded_schema()["provenance"]
    assert prov["miles"].startswith(TARGETS["miles-2026-08-21"].miles)
    assert prov["command"].startswith("python -m rlsmoke.conformance.rollout_schema --record-schema")


def test_a_template_miles_would_misread_is_refused():
    from rlsmoke.errors import RlsmokeError

    rollout_file.check_template("/runs/a/rollout_data/{rollout_id}.pt")
    with pytest.raises(RlsmokeError) as err:
        rollout_file.check_template("/runs/{case}/rollout_data/{rollout_id}.pt")
    assert err.value.rule == "miles.rollout_file"


_ROUND_TRIP = """
import argparse, json, sys
for blocked in ("sglang", "megatron"):
    sys.modules[blocked] = None  # the reader needs neither
from miles.ray.rollout.debug_data import load_debug_rollout_data
args = argparse.Namespace(load_debug_rollout_data=sys.argv[1], load_debug_rollout_data_subsample=None, reward_key=None,
                          n_samples_per_prompt=3, rollout_batch_size=2, advantage_estimator="grpo",
                          rewards_normalization=True, grpo_std_normalization=True, use_dynamic_global_batch_size=False)
samples, metadata = load_debug_rollout_data(args, 0)
for s in samples:
    s.validate()
out = {"statuses": [s.status.value for s in samples], "groups": [s.group_index for s in samples]}
try:
    from miles.ray.rollout.train_data_conversion import convert_samples_to_train_data
except ImportError as exc:  # it imports ray and httpx besides torch and numpy
    out["convert"] = f"skipped: {exc}"
else:
    data = convert_samples_to_train_data(args, samples, metadata, None, None)
    out["convert"] = {k: data[k] for k in ("raw_reward", "rewards", "response_lengths", "loss_masks", "rollout_log_probs")}
print(json.dumps(out))
"""


@needs_miles
def test_miles_own_loader_and_conversion_read_the_file(tmp_path):
    path = _written(tmp_path)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [MILES_ROOT, os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.run([sys.executable, "-c", _ROUND_TRIP, str(path).replace("/0.pt", "/{rollout_id}.pt")],
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["statuses"][:2] == ["truncated", "completed"] and got["groups"] == [0, 0, 0, 1, 1, 1]
    if isinstance(got["convert"], str):
        pytest.skip(f"Miles' loader read the file; convert_samples_to_train_data {got['convert']}")
    data = got["convert"]
    assert data["raw_reward"] == [0.0, 0.25, 0.5] * 2 and data["response_lengths"] == [4] * 6
    assert data["loss_masks"] == [[1] * 4] * 6 and data["rollout_log_probs"][0] == [-0.5] * 4
    assert (
        abs(sum(data["rewards"][:3])) < 1e-6 and data["rewards"][2] > 0
    )  # GRPO-normalised within each group


@needs_miles
def test_the_recorded_schema_is_what_that_miles_writes(tmp_path):
    schema = record_schema(Path(MILES_ROOT), commit="x")
    assert {k: v for k, v in schema.items() if k != "provenance"} == {
        k: v for k, v in recorded_schema().items() if k != "provenance"
    }
