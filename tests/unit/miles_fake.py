"""A fake Miles checkout for the launcher's tests: its scripts record their commands and print what Miles prints.

Like Miles' own `tests/fast/utils/command_recorder.py`, every command the flow runs in the checkout is
appended to `commands.jsonl` (its argv, the env it matters under, the torchrun rank). Unlike it, the
commands run for real: the converter under the real torchrun, `train.py` under a real `ray job submit`.

- `tools/convert_hf_to_torch_dist.py` checks `--hf-checkpoint`, then rank 0 writes `--save`, the
  `release` tracker last, as Miles' converter does.
- `train.py` refuses a missing or empty `--ref-load` (Miles asserts it), scores sampled tokens with the
  reward the argv names (`--custom-rm-path` imported from the job's PYTHONPATH; `--rm-type deepscaler`
  is Miles' 0/1 math check), takes GRPO advantages per group, and logs as Miles does: Python logging's
  `[time name] file:line - ` prefix under Ray's `(MegatronTrainRayActor pid=N) `, each step twice
  (`log_utils.py`, then `model.py`), and the five CI metrics as CiHistoryBackend's JSONL in
  `$MILES_CI_GATE_RECORD_DIR`, one file per logging process.

`fault` breaks one thing: "ci_history_missing" (no train/train_rollout_kl in the JSONL),
"ci_history_disagrees" (the JSONL's grad_norm is not the log's), "log_repeat" (the second step line differs).
"""

from __future__ import annotations

import json
from pathlib import Path

from fake_miles import write_fake_miles

FAULTS = (None, "ci_history_missing", "ci_history_disagrees", "log_repeat")

_RECORD = """
import json, os, sys

ENV = ("PYTHONPATH", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE", "https_proxy", "MILES_CI_GATE_RECORD_DIR")

def record(kind, argv, **more):
    line = {"kind": kind, "argv": argv, "cwd": os.getcwd(), "env": {k: os.environ.get(k) for k in ENV}, **more}
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), COMMANDS), "a") as f:
        f.write(json.dumps(line) + "\\n")  # one write of one line: ranks append whole lines
"""

CONVERT = """
import os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from recorder import record

argv = sys.argv[1:]
flag = lambda name: argv[argv.index(name) + 1]
record("convert", argv, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
assert os.path.isfile(os.path.join(flag("--hf-checkpoint"), "config.json")), "no HF checkpoint"
if os.environ["RANK"] == "0":
    save = flag("--save")
    os.makedirs(os.path.join(save, "release"), exist_ok=True)
    with open(os.path.join(save, "release", "common.pt"), "w") as f:
        f.write("shards")
    with open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("release")  # last: the marker of a finished conversion
"""

TRAIN = """
import asyncio, importlib, json, logging, math, os, random, re, sys, uuid
from recorder import record

FAULT = {fault!r}
argv = sys.argv[1:]
flag = lambda name, default=None: argv[argv.index(name) + 1] if name in argv else default
record("train", [os.path.basename(sys.argv[0]), *argv])
ref = flag("--ref-load")
assert os.path.isdir(ref) and os.listdir(ref), f"--ref-load {{ref}} must exist and not be empty"
if "--load-debug-rollout-data" in argv:  # Miles' train-only mode: no SGLang, the recorded rollout
    import train_only_fake
    sys.exit(0)

# Ray prefixes every line an actor prints with its class and pid; Miles' logging adds its own prefix.
logging.basicConfig(level=logging.INFO, stream=sys.stdout, datefmt="%Y-%m-%d %H:%M:%S",
                    format=f"(MegatronTrainRayActor pid={{os.getpid()}}) [%(asctime)s.%(msecs)03d miles] "
                    "%(filename)s:%(lineno)d - %(message)s")
log = logging.getLogger("miles")


class Sample:  # the fields of Miles' Sample a reward reads
    def __init__(self, tokens, response_length, response, label):
        self.tokens, self.response_length, self.response, self.label = tokens, response_length, response, label


def deepscaler(args, sample):  # 0/1: the last boxed answer equals the label
    found = re.findall(r"\\\\boxed\\{{([^{{}}]*)\\}}", sample.response)
    return float(bool(found) and found[-1].strip() == sample.label)


if flag("--custom-rm-path"):
    module, _, name = flag("--custom-rm-path").rpartition(".")
    reward_fn = getattr(importlib.import_module(module), name)  # from the job's PYTHONPATH, as Miles loads it
else:
    assert flag("--rm-type") == "deepscaler", argv
    async def reward_fn(args, sample):
        return deepscaler(args, sample)

n_prompts, n_samples = int(flag("--rollout-batch-size")), int(flag("--n-samples-per-prompt"))
rng = random.Random(0)
records = {{}}


def ci_log(metrics, step, process):  # CiHistoryBackend: the whole series, rewritten atomically
    if not os.environ.get("MILES_CI_GATE_RECORD_DIR"):
        return
    series = records.setdefault(process, {{}})
    for key in ("train/grad_norm", "train/ppo_kl", "train/train_rollout_logprob_abs_diff", "train/train_rollout_kl",
                "rollout/raw_reward"):
        if key in metrics and not (FAULT == "ci_history_missing" and key == "train/train_rollout_kl"):
            value = metrics[key] + (0.5 if FAULT == "ci_history_disagrees" and key == "train/grad_norm" else 0.0)
            series.setdefault(key, []).append([step, value if math.isfinite(value) else "NaN"])
    folder = os.environ["MILES_CI_GATE_RECORD_DIR"]
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{{os.getpid()}}-{{process}}.jsonl")
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps({{"metric": k, "series": v}}) + "\\n" for k, v in series.items())
    os.replace(path + ".tmp", path)


process_ids = {{"train": uuid.uuid4().hex, "rollout": uuid.uuid4().hex}}
for rollout_id in range(int(flag("--num-rollout"))):
    samples = []
    for _ in range(n_prompts * n_samples):
        tokens = [rng.randrange(1000) for _ in range(24)]
        samples.append(Sample(tokens, 16, "the answer is 7", "12"))
    rewards = [asyncio.run(reward_fn(None, s)) for s in samples]
    advantages = []
    for g in range(n_prompts):
        group = rewards[g * n_samples:(g + 1) * n_samples]
        mean = sum(group) / len(group)
        std = (sum((r - mean) ** 2 for r in group) / len(group)) ** 0.5
        advantages += [(r - mean) / (std + 1e-6) for r in group]
    rollout = {{"rollout/raw_reward": sum(rewards) / len(rewards), "rollout/log_probs": -0.51,
                "rollout/rollout_log_probs": -0.5, "rollout/entropy": 0.5}}
    log.info(f"rollout {{rollout_id}}: {{rollout}}")
    ci_log(rollout, rollout_id, process_ids["rollout"])
    step = {{"train/loss": 0.0, "train/pg_loss": 0.0, "train/ppo_kl": 0.0, "train/pg_clipfrac": 0.0,
             "train/train_rollout_logprob_abs_diff": 0.012, "train/train_rollout_kl": 0.0004,
             "train/grad_norm": 0.05 * math.sqrt(sum(a * a for a in advantages)), "train/step": rollout_id}}
    ci_log(step, rollout_id, process_ids["train"])
    log.info(f"step {{rollout_id}}: {{step}}")  # log_utils.py
    if FAULT == "log_repeat":
        step = {{**step, "train/grad_norm": step["train/grad_norm"] + 1.0}}
    log.info(f"step {{rollout_id}}: {{step}}")  # megatron_utils/model.py: the same dict again
"""

# Train-only (`--load-debug-rollout-data`): what Miles does with the file, on the HF checkpoint in fp32 on CPU.
# It joins the Ray head at RAY_ADDRESS (Miles' placement group does), reads the file as Miles' loader does
# (`status` mandatory, `Sample.validate`'s lengths), takes the train log-probs of the response tokens from a
# real forward at --rollout-temperature (logits / T, as Miles' logit processor), and logs Miles' metrics:
# the rollout line, the step line twice, the CI JSONL (from a worker of the head, as Miles' train actor). GRPO
# advantages per `group_index`, a real backward.
TRAIN_ONLY = """
import json, logging, math, os, sys, uuid
import torch
from transformers import AutoModelForCausalLM

FAULT = {fault!r}
argv = sys.argv[1:]
flag = lambda name: argv[argv.index(name) + 1]
import ray
ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)  # the head the flow started, or an error
logging.basicConfig(level=logging.INFO, stream=sys.stdout, datefmt="%Y-%m-%d %H:%M:%S",
                    format=f"(MegatronTrainRayActor pid={{os.getpid()}}) [%(asctime)s miles] %(filename)s:%(lineno)d - %(message)s")
log = logging.getLogger("miles")
T = float(flag("--rollout-temperature"))
model = AutoModelForCausalLM.from_pretrained(flag("--hf-checkpoint"), dtype=torch.float32)
model.train(False)


def train_logprobs(s):
    ids = torch.tensor([s["tokens"]])
    n = s["response_length"]
    logits = model(ids).logits[0, -n - 1:-1].float() / T
    return torch.log_softmax(logits, -1).gather(-1, ids[0, -n:, None])[:, 0]


def sample_mean(values):  # per sample over its loss mask, then across samples
    return sum((v * torch.tensor(s["loss_mask"])).sum() / max(1, sum(s["loss_mask"])) for v, s in zip(values, samples)) / len(samples)


series = {{}}
for rollout_id in range(int(flag("--num-rollout"))):  # Miles' train loop: rollout i from file i, then step i
    payload = torch.load(flag("--load-debug-rollout-data").format(rollout_id=rollout_id), weights_only=False)
    assert payload["rollout_id"] == rollout_id, payload["rollout_id"]
    samples = payload["samples"]
    for s in samples:
        s["status"]  # Sample.from_dict: KeyError without it
        n = s["response_length"]
        assert len(s["tokens"]) >= n and len(s["loss_mask"]) == n and len(s["rollout_log_probs"]) == n, s["index"]
    assert len(samples) == int(flag("--rollout-batch-size")) * int(flag("--n-samples-per-prompt")), len(samples)
    with torch.no_grad():
        old = [train_logprobs(s) for s in samples]
    rollout_lp = [torch.tensor(s["rollout_log_probs"]) for s in samples]
    diff = sample_mean([(o - r).abs() for o, r in zip(old, rollout_lp)]).item()
    ratio = [torch.clamp(o - r, -20, 20) for o, r in zip(old, rollout_lp)]
    kl = sample_mean([torch.clamp(torch.exp(r) - 1 - r, -10, 10) for r in ratio]).item()
    rewards = torch.tensor([float(s["reward"]) for s in samples])
    advantages = torch.zeros_like(rewards)
    for g in {{s["group_index"] for s in samples}}:
        rows = [i for i, s in enumerate(samples) if s["group_index"] == g]
        group = rewards[rows]
        advantages[rows] = (group - group.mean()) / (group.std() + 1e-6)
    model.zero_grad()
    new = [train_logprobs(s) for s in samples]
    loss = sample_mean([-a * torch.exp(n - o) for a, n, o in zip(advantages, new, old)])
    loss.backward()
    grad_norm = torch.sqrt(sum((p.grad.float() ** 2).sum() for p in model.parameters() if p.grad is not None)).item()
    ppo_kl = sample_mean([o - n.detach() for o, n in zip(old, new)]).item()
    rollout = {{"rollout/raw_reward": rewards.mean().item(), "rollout/rollout_log_probs": sample_mean(rollout_lp).item(),
                "rollout/log_probs": sample_mean(old).item()}}
    step = {{"train/loss": loss.item(), "train/pg_loss": loss.item(), "train/ppo_kl": ppo_kl, "train/pg_clipfrac": 0.0,
             "train/train_rollout_logprob_abs_diff": diff, "train/train_rollout_kl": kl, "train/grad_norm": grad_norm,
             "train/step": rollout_id}}
    log.info(f"rollout {{rollout_id}}: {{rollout}}")
    log.info(f"step {{rollout_id}}: {{step}}")
    log.info(f"step {{rollout_id}}: {{step}}")
    for k, v in {{**rollout, **step}}.items():
        if k in ("train/grad_norm", "train/ppo_kl", "train/train_rollout_logprob_abs_diff", "train/train_rollout_kl",
                 "rollout/raw_reward"):
            series.setdefault(k, []).append([rollout_id, v])


@ray.remote(num_cpus=0)
def ci_history(series):  # Miles' train actor is a worker of the head: CiHistoryBackend reads the head's env
    folder = os.environ.get("MILES_CI_GATE_RECORD_DIR")
    if folder:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{{os.getpid()}}-{{uuid.uuid4().hex}}.jsonl"), "w") as f:
            f.writelines(json.dumps({{"metric": k, "series": v}}) + "\\n" for k, v in series.items())


ray.get(ci_history.remote(series))
ray.shutdown()
if folder := os.environ.get("MILES_CI_GATE_RECORD_DIR"):  # the driver's own backend logs none: an empty record
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, f"{{os.getpid()}}-{{uuid.uuid4().hex}}.jsonl"), "w").close()
"""


def write_root(folder: Path, fault: str | None = None) -> Path:
    """A fake Miles checkout in `folder`; its commands are recorded in `folder/commands.jsonl`."""
    assert fault in FAULTS, fault
    write_fake_miles(folder)  # a parser that accepts the launch: the pre-flight's
    (folder / "tools").mkdir(exist_ok=True)
    (folder / "recorder.py").write_text(f"COMMANDS = 'commands.jsonl'\n{_RECORD}")
    (folder / "tools" / "convert_hf_to_torch_dist.py").write_text(CONVERT)
    train = TRAIN.format(fault=fault)
    (folder / "train.py").write_text(train)
    (folder / "train_only_fake.py").write_text(TRAIN_ONLY.format(fault=fault))
    (folder / "train_async.py").write_text(train)
    return folder


def commands(folder: Path) -> list[dict]:
    """What the fake checkout's scripts recorded, in order."""
    path = folder / "commands.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
