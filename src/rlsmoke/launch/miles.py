"""Render a topology into the argv and env of Miles' `train.py` (colocate) or `train_async.py` (async).

argv is `python3 <script>` and the groups in `GROUP_ORDER`; a later group's flag replaces an earlier
one's. Every GPU count is read off the topology. `master_addr` goes to the env, never to argv.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from rlsmoke.launch.substitutions import SUBSTITUTIONS
from rlsmoke.models import ModelSpec
from rlsmoke.platforms import get_platform
from rlsmoke.recipe import Recipe
from rlsmoke.topology import Topology

# `rlsmoke_reward.py`'s folder, Miles' `--custom-rm-path`: needs no rlsmoke where the job runs.
REWARD_DIR = Path(__file__).resolve().parents[1] / "engine" / "miles_reward"
REWARD_FLAGS = {
    "target": ["--custom-rm-path", "rlsmoke_reward.target"],
    "deepscaler": ["--rm-type", "deepscaler"],
}

GROUP_ORDER = ("model", "ckpt", "rollout", "perf", "grpo", "optimizer", "sglang", "ci", "misc")


@dataclass(frozen=True)
class Paths:
    """Where the cluster keeps things. Upstream's defaults; golden files use placeholders."""

    model_dir: str = "/root/models"
    data_dir: str = "/root/datasets"
    output_dir: str = "/root/shared_data"
    megatron_root: str = "/root/Megatron-LM"
    miles_root: str = "/root/miles"
    reward_dir: str = str(REWARD_DIR)  # where the job imports `rlsmoke_reward` from


LOOPBACK = "127.0.0.1"
HEAD_PLACEHOLDER = "<HEAD_ADDR>"
RAY_GCS_PORT = 6379  # `ray start --head`'s default, which the joining nodes dial


def head_addr(topo: Topology, recipe: Recipe) -> str:
    """MASTER_ADDR and Ray's head: the recipe's, else loopback on one node, else the placeholder."""
    return recipe.master_addr or (LOOPBACK if topo.num_nodes == 1 else HEAD_PLACEHOLDER)


def is_loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr in ("localhost", "::1")


def _num(x: float) -> str:
    """A number as the seeds write it: 1e-6, not 1e-06; 0.2, not 0.20."""
    return re.sub(r"e([-+])0+(\d)", r"e\1\2", f"{x:g}")


@dataclass(frozen=True)
class Launch:
    script: str  # "train.py" | "train_async.py"
    groups: dict[str, list[str]]
    env: dict[str, str]
    ray_num_gpus: int
    master_addr: str = LOOPBACK
    num_nodes: int = 1
    target: str = ""  # the target whose flags these are (targets.TARGETS)
    hf_checkpoint: str = ""  # the folders the ckpt group names: the flow prepares and converts them
    ref_load: str = ""  # the torch_dist folder

    @property
    def argv(self) -> list[str]:
        return ["python3", self.script, *(tok for g in GROUP_ORDER for tok in self.groups.get(g, []))]

    def ray_start(self) -> list[str]:
        return ["ray", "start", "--head", "--node-ip-address", self.master_addr, "--num-gpus", str(self.ray_num_gpus),
                "--disable-usage-stats"]  # fmt: skip

    def ray_join(self) -> list[str]:
        """`ray start` on a node other than the head: join its cluster and stay up."""
        return ["ray", "start", "--address", f"{self.master_addr}:{RAY_GCS_PORT}", "--num-gpus",
                str(self.ray_num_gpus), "--disable-usage-stats", "--block"]  # fmt: skip

    def nodes(self) -> list[dict]:
        """Each node's command, by rank: the head starts the cluster (and then runs argv), the others join."""
        return [{"rank": i, "role": "head" if i == 0 else "worker", "command": self.ray_start() if i == 0
                 else self.ray_join()} for i in range(self.num_nodes)]  # fmt: skip

    def job_submit(self, runtime_env_json: str) -> list[str]:
        return ["ray", "job", "submit", "--address", f"http://{self.master_addr}:8265",
                "--runtime-env-json", runtime_env_json, "--", *self.argv]  # fmt: skip

    def script_lines(self) -> list[str]:
        """argv as a shell script writes it: the command, then each group on a continued line."""
        body = [shlex.join(toks) for toks in self.groups.values() if toks]
        return [shlex.join(self.argv[:2]) + " \\", *(f"  {line} \\" for line in body[:-1]), f"  {body[-1]}"]


def flag_values(tokens: list[str]) -> list[tuple[str, list[str]]]:
    items: list[tuple[str, list[str]]] = []
    for tok in tokens:
        if tok.startswith("--"):
            items.append((tok, []))
        else:
            items[-1][1].append(tok)
    return items


def _dedupe(groups: dict[str, list[str]]) -> dict[str, list[str]]:
    """A flag set by a later group replaces the same flag set by an earlier one."""
    last_group = {f: g for g in GROUP_ORDER for f, _ in flag_values(groups.get(g, []))}
    out: dict[str, list[str]] = {g: [] for g in GROUP_ORDER}
    seen = set()
    for g in GROUP_ORDER:
        for f, v in flag_values(groups.get(g, [])):
            if last_group[f] == g and f not in seen:  # within one group, the first setting stands
                seen.add(f)
                out[g] += [f, *v]
    return out


def _rows(topo: Topology, uses_dsa: bool):
    """The substitution rows that hold for the plan's launcher, mode, model and actor size."""
    return [r for r in SUBSTITUTIONS if r.holds(topo.target.launcher, topo.mode, uses_dsa, topo.actor_gpus)]


def _substituted(platform: str, group: str, topo: Topology, uses_dsa: bool) -> list[str]:
    """The substitution rows of `group`, with the target's flag stems and the plan's counts filled in."""
    target, chunked = topo.target, 2048 * topo.rollout.gpus_per_engine
    return [f.format(dsa=target.dsa_flag, cuda_graph_bs=target.cuda_graph_bs_flag, chunked_prefill=chunked)
            for row in _rows(topo, uses_dsa) if row.group == group for f in row.flags(platform)]  # fmt: skip


def render(
    spec: ModelSpec, topo: Topology, paths: Paths | None = None, recipe: Recipe | None = None
) -> Launch:
    paths, recipe = paths or Paths(), recipe or Recipe()
    plat = topo.platform if topo.platform != "cpu" else "nvidia"  # CPU plans render the NVIDIA launch
    t, r = topo.train, topo.rollout
    uses_dsa = "index_topk" in spec.hf_extra  # DSA-indexer models run SGLang's nsa/dsa attention
    hf_dir = f"{paths.model_dir}/{topo.case}"
    ckpt_dir = f"{paths.output_dir}/{topo.case}/checkpoints"

    perf = [
        "--tensor-model-parallel-size", str(t.tp), *(["--sequence-parallel"] if t.sp else []),
        "--pipeline-model-parallel-size", str(t.pp),
        # Megatron's first/last stage sizes, when the split is not even (e.g. 11/11/11/12)
        *(["--decoder-first-pipeline-num-layers", str(t.pp_layers[0]),
           "--decoder-last-pipeline-num-layers", str(t.pp_layers[-1])] if len(set(t.pp_layers)) > 1 else []),
        "--context-parallel-size", str(t.cp),
        "--expert-model-parallel-size", str(t.ep),
        "--expert-tensor-parallel-size", str(t.etp),
    ]  # fmt: skip
    if plat == "nvidia":
        # Seed 004 NVIDIA: full recompute and padded, chunked log-probs; the ROCm port drops them.
        perf += ["--recompute-granularity", "full", "--recompute-method", "uniform"]
        perf += ["--recompute-num-layers", "1"]
    perf += ["--use-dynamic-batch-size", "--max-tokens-per-gpu", str(recipe.max_tokens_per_gpu)]
    if plat == "nvidia":
        perf += ["--data-pad-size-multiplier", "4096", "--log-probs-chunk-size", "1024"]

    sglang = ["--rollout-num-gpus-per-engine", str(r.gpus_per_engine),
              "--sglang-mem-fraction-static", f"{recipe.sglang_mem_fraction:.2f}"]  # fmt: skip
    if r.dp_attention:
        sglang.append("--sglang-enable-dp-attention")
    if r.ep > 1:
        sglang += ["--sglang-ep-size", str(r.ep)]
    if r.dp > 1 or r.dp_attention:
        sglang += ["--sglang-dp-size", str(r.dp)]
    if r.dense_tp_lm_head:
        sglang += ["--sglang-moe-dense-tp-size", "1", "--sglang-enable-dp-lm-head"]
    sglang += _substituted(plat, "sglang", topo, uses_dsa)
    if uses_dsa:
        sglang += ["--sglang-attention-backend", "nsa"]
    sglang += ["--sglang-watchdog-timeout", "3600"]

    placement = [
        "--actor-num-nodes", str(topo.actor_num_nodes),
        "--actor-num-gpus-per-node", str(topo.actor_gpus_per_node),
        "--num-gpus-per-node", str(topo.gpus_per_node),
    ]  # fmt: skip
    if topo.mode == "colocate":
        placement.append("--colocate")
    else:
        placement += ["--rollout-num-gpus", str(topo.rollout_gpus),
                      "--update-weights-interval", str(recipe.update_weights_interval)]  # fmt: skip
    misc = [
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
        "--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32",
    ]  # fmt: skip
    misc += _substituted(plat, "misc", topo, uses_dsa)
    if t.cp > 1:
        misc.append("--allgather-cp")
    misc += ["--update-weight-buffer-size", str(2 * 1024**3), *placement,
             "--dump-details", f"{paths.output_dir}/{topo.case}/dump"]  # fmt: skip

    groups = {
        "model": spec.megatron_args(),
        "ckpt": ["--hf-checkpoint", hf_dir, "--ref-load", f"{hf_dir}_torch_dist", "--load", ckpt_dir,
                 "--save", ckpt_dir, "--save-interval", "20"],
        "rollout": [
            "--prompt-data", f"{paths.data_dir}/{recipe.prompt_file}", "--input-key", "prompt",
            "--label-key", "label", "--apply-chat-template", "--rollout-shuffle", *REWARD_FLAGS[recipe.reward],
            "--num-rollout", str(recipe.num_rollout), "--rollout-batch-size", str(recipe.rollout_batch_size),
            "--n-samples-per-prompt", str(recipe.n_samples_per_prompt),
            "--rollout-max-response-len", str(recipe.rollout_max_response_len),
            "--rollout-temperature", f"{recipe.rollout_temperature:g}",
            "--global-batch-size", str(recipe.global_batch_size),
        ],
        "perf": perf,
        "grpo": ["--advantage-estimator", "grpo", "--kl-loss-coef", f"{recipe.kl_coef:.2f}",
                 "--kl-loss-type", "low_var_kl", "--kl-coef", f"{recipe.kl_coef:.2f}",
                 "--entropy-coef", f"{recipe.entropy_coef:.2f}", "--eps-clip", _num(recipe.eps_clip),
                 "--eps-clip-high", _num(recipe.eps_clip_high)],
        "optimizer": ["--optimizer", "adam", "--lr", _num(recipe.lr), "--lr-decay-style", "constant",
                      "--weight-decay", _num(recipe.weight_decay), "--adam-beta1", _num(recipe.adam_betas[0]),
                      "--adam-beta2", _num(recipe.adam_betas[1]),
                      *_substituted(plat, "optimizer", topo, uses_dsa)],
        "sglang": sglang,
        "ci": ["--ci-test", "--ci-disable-logprobs-checker"],
        "misc": misc,
    }  # fmt: skip
    return Launch(
        script="train.py" if topo.mode == "colocate" else "train_async.py",
        groups=_dedupe(groups),
        env=render_env(topo, plat, paths, recipe, uses_dsa),
        ray_num_gpus=topo.ray_num_gpus,
        master_addr=head_addr(topo, recipe),
        num_nodes=topo.num_nodes,
        target=topo.target.name,
        hf_checkpoint=hf_dir,
        ref_load=f"{hf_dir}_torch_dist",
    )


def render_env(topo: Topology, plat: str, paths: Paths, recipe: Recipe, uses_dsa: bool) -> dict[str, str]:
    head = head_addr(topo, recipe)
    env = {
        "PYTHONUNBUFFERED": "1",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "NCCL_NVLS_ENABLE": "0",  # NVLink multicast off: required where GPUs are shared
        "no_proxy": ",".join(dict.fromkeys((LOOPBACK, head))),  # the head once, on one node
        "MASTER_ADDR": head,
        "PYTHONPATH": paths.megatron_root + (f":{paths.reward_dir}" if recipe.reward == "target" else ""),
    }
    for row in _rows(topo, uses_dsa):
        env.update(row.env(plat))
    if plat == "rocm":
        env[get_platform(plat).visible_devices_var] = ",".join(str(i) for i in topo.visible_devices)
    return env
