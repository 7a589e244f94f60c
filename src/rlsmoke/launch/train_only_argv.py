"""The train-only launch: Miles' rendered launch made Miles' trainer alone on a rollout file, no SGLang
(`train.py --debug-train-only`), and the Ray head it joins."""

from __future__ import annotations

from rlsmoke.errors import RlsmokeError
from rlsmoke.launch.miles import Launch, flag_values

# What a train-only launch drops from the rendered one, and why: no SGLang engine is started, so none of
# its flags; one GPU that trains only, so nothing to colocate with (and --colocate forces
# torch_memory_saver's LD_PRELOAD); no checkpoint written after the step (a one-step smoke resumes
# nothing, and its optimizer state would not fit the disk); without --load Miles loads --ref-load as a
# fresh run does (no_load_optim, finetune); no --dump-details, which would save the rollout file it was
# given once more, with a parquet sidecar through polars, which Miles' site on the H200 has only as a stand-in.
TRAIN_ONLY_DROPPED = ("--colocate", "--rematerialize-param-from-master-weight", "--moe-enable-deepep",
                      "--load", "--save", "--save-interval", "--dump-details")  # fmt: skip
# What it sets instead: TE's cuDNN fused attention (flash-attn has no binary wheel), the all-to-all MoE
# dispatcher (DeepEP's flex dispatcher needs deep_ep).
TRAIN_ONLY_SET = {"--attention-backend": ("fused",), "--moe-token-dispatcher-type": ("alltoall",)}
# GLM-5's DSA top-k takes 2048 tokens of a packed micro-batch
DSA_PAD = ("--data-pad-size-multiplier", "4096")


def train_only(
    launch: Launch, *, rollout_template: str, prompt_data: str, miles_root: str, uses_dsa: bool
) -> Launch:
    """`launch` as Miles' trainer alone: `train.py --debug-train-only --load-debug-rollout-data TEMPLATE`
    on the one GPU of the plan, the rollout's prompts as --prompt-data (Miles' data source still reads it),
    the checkout on PYTHONPATH (Ray's workers import `miles` from it)."""
    if launch.ray_num_gpus != 1 or launch.num_nodes != 1:
        raise RlsmokeError(f"a train-only launch on {launch.ray_num_gpus} GPUs: it trains on one", rule="miles.train_only",
                           fix="pass --num-gpus 1")  # fmt: skip
    groups: dict[str, list[str]] = {}
    for group, toks in launch.groups.items():
        out: list[str] = []
        for flag, values in flag_values(toks) if group != "sglang" else []:
            if flag in TRAIN_ONLY_DROPPED:
                continue
            values = list(TRAIN_ONLY_SET.get(flag, values))
            out += [flag, *([prompt_data] if flag == "--prompt-data" else values)]
        groups[group] = out
    present = {flag for toks in groups.values() for flag, _ in flag_values(toks)}
    groups["misc"] += [
        tok for flag, values in TRAIN_ONLY_SET.items() if flag not in present for tok in (flag, *values)
    ]
    if uses_dsa and DSA_PAD[0] not in present:
        groups["perf"] += list(DSA_PAD)
    groups["rollout"] += ["--debug-train-only", "--load-debug-rollout-data", rollout_template]
    env = dict(launch.env)
    env["PYTHONPATH"] = ":".join([miles_root, env["PYTHONPATH"]])
    return Launch("train.py", groups, env, 1, launch.master_addr, 1, launch.target)


def ray_head_train_only(launch: Launch) -> list[str]:
    """Ray's head for a train-only run: no dashboard and no job submission, which only Miles' launcher uses."""
    return [*launch.ray_start(), "--include-dashboard=false"]
