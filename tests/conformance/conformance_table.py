"""The conformance table: cases rendered by rlsmoke, and what each real parser says about them.

`AGREE` rows are the claim of the conformance checks: rlsmoke's validator accepts a row iff every real parser of its
target does. Each row names the parsers that reject it and a piece of their message, so a rejection
for another reason (a renamed flag, a new check) fails the test instead of passing it by luck.
`STRICTER` rows are rules rlsmoke checks and no parser does at parse time; each says why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

PARSER_NAMES = ("miles", "sglang", "mcore")


def selected(name: str) -> bool:
    """Whether this run checks `name` (RLSMOKE_CONFORMANCE_PARSER; unset: every parser)."""
    chosen = os.environ.get("RLSMOKE_CONFORMANCE_PARSER", "")
    return not chosen or chosen == name


GLM5 = "glm5-744b-a40b-4layer"
GLM45 = "glm4.5-355b-a32b-4layer"
NEW = "sglang-0.5.23"  # the target whose SGLang is 0.5.23 (the --dsa-* dialect)

# Messages of the real code, as seen with the pinned versions (.ci/conformance-envs.sh).
SGLANG_BUNDLED_DP = "assert self.tp_size % self.dp_size == 0"  # vendored SGLang, under dp-attention
SGLANG_0523_DP = "assert cfg.tp_size % cfg.attn_dp_size == 0"
MILES_DP_ATTENTION = "assert args.sglang_enable_dp_attention"
EXPERTS_EP = "Number of experts should be a multiple of expert model parallel_size"
WORLD_MODEL = "is not divisible by total_model_size"
HEADS_TP = "must be a multiple of tensor_model_parallel_size"
GQA_TP = "must be a multiple or divisor of tensor_model_parallel_size"
SP_TP = "Cannot use sequence parallelism without tensor parallelism"
SGLANG_MODEL_BUILD = (
    "SGLang 0.5.23 asserts it when it builds the model's layers, after its start-up "
    "(layers/moe/fused_moe_triton/layer.py, models/deepseek_v2.py, glm4_moe.py): ServerArgs "
    "does not read the model's experts, widths or heads"
)


@dataclass(frozen=True)
class Row:
    id: str
    case: str
    platform: str
    num_gpus: int
    sets: tuple[str, ...] = ()
    mode: str | None = None
    target: str = "miles-0.0.2"
    rejected_by: dict[str, str] = field(default_factory=dict)  # parser -> a piece of its message
    rule: str = ""  # STRICTER rows: the rlsmoke rule that rejects
    why: str = ""  # STRICTER rows: why no parser rejects it

    @property
    def valid(self) -> bool:
        """The real verdict: no parser of the row's target rejects it (see rlsmoke.conformance.verdict)."""
        return not self.rejected_by


AGREE = (
    Row("nvidia8-new", GLM5, "nvidia", 8, target=NEW),  # --sglang-cuda-graph-max-bs-decode for 0.5.23
    Row("gqa-tp16", GLM45, "nvidia", 16, ("train.tp=16", "train.cp=1", "train.ep=16")),  # TP a multiple of groups
    Row("gqa-tp12", GLM45, "nvidia", 24, ("train.tp=12", "train.cp=1", "train.ep=8"), rejected_by={"mcore": GQA_TP}),
    # valid: the presets of every seed, both targets
    Row("seed004-review-rocm8", GLM5, "rocm", 8),  # 2 GPUs/engine, dp 2, ep 2, dp-attention
    Row("seed004-nvidia8", GLM5, "nvidia", 8),
    Row("glm5-nvidia2", GLM5, "nvidia", 2),
    Row("glm5-rocm2", GLM5, "rocm", 2),
    Row("glm5-rocm4", GLM5, "rocm", 4),
    Row("glm5-1gpu", "glm5-744b-a40b-4layer-1gpu", "nvidia", 1),
    Row("seed000-flash-nvidia32", "glm5.3-flash", "nvidia", 32),  # TP8 PP4 (11/11/11/12) EP8
    Row("seed003-glm45-nvidia64", "glm4.5-355b-a32b", "nvidia", 64),  # 32-GPU engines, dp 4
    Row("glm45-nvidia8", GLM45, "nvidia", 8),
    Row("glm45-tp8-ep8", GLM45, "nvidia", 8, ("train.tp=8", "train.cp=1", "train.ep=8")),
    Row("glm5-pp2", GLM5, "nvidia", 8, ("train.pp=2", "train.tp=2", "train.ep=4")),
    Row("glm5-nvidia8-dp4", GLM5, "nvidia", 8, ("rollout.dp=4",)),  # dp 4 divides 8 GPUs per engine
    Row("seed004-review-rocm8-new", GLM5, "rocm", 8, target=NEW),
    Row("glm5-rocm4-new", GLM5, "rocm", 4, target=NEW),
    # invalid: seed 004's review mirrors
    Row("seed004-dp4", GLM5, "rocm", 8, ("rollout.dp=4",), rejected_by={"miles": SGLANG_BUNDLED_DP}),
    Row("seed004-dp3", GLM5, "rocm", 8, ("rollout.dp=3",), rejected_by={"miles": SGLANG_BUNDLED_DP}),
    Row("seed004-ep3", GLM5, "rocm", 8, ("train.ep=3",), rejected_by={"miles": EXPERTS_EP}),
    Row("seed004-tp3", GLM5, "rocm", 8, ("train.tp=3",), rejected_by={"miles": WORLD_MODEL, "mcore": HEADS_TP}),
    Row("seed004-dp-no-dp-attention", GLM5, "rocm", 8, ("rollout.dp_attention=false",),
        rejected_by={"miles": MILES_DP_ATTENTION}),
    Row("seed004-dp4-new", GLM5, "rocm", 8, ("rollout.dp=4",), target=NEW, rejected_by={"sglang": SGLANG_0523_DP}),
    Row("seed004-dp3-new", GLM5, "rocm", 8, ("rollout.dp=3",), target=NEW, rejected_by={"sglang": SGLANG_0523_DP}),
    Row("seed004-tp3-new", GLM5, "rocm", 8, ("train.tp=3",), target=NEW, rejected_by={"mcore": HEADS_TP}),
    # invalid: the training grid
    Row("sp-without-tp", GLM5, "rocm", 8, ("train.sp=true",), rejected_by={"mcore": SP_TP}),
    Row("pp-stage-empty", GLM5, "nvidia", 8, ("train.pp=8", "train.tp=1", "train.cp=1", "train.ep=1"),
        rejected_by={"mcore": "num_layers_in_first_pipeline_stage must be larger than 0"}),
    Row("pp-layers-sum", GLM5, "nvidia", 8, ("train.pp=2", "train.tp=2", "train.ep=4", "train.pp_layers=2,3"),
        rejected_by={"mcore": "middle layers remaining"}),
    Row("world-tp-cp", GLM5, "nvidia", 8, ("train.cp=4",), rejected_by={"miles": WORLD_MODEL}),
    Row("nvidia-ep3", GLM5, "nvidia", 8, ("train.ep=3",), rejected_by={"miles": EXPERTS_EP}),
    Row("glm45-ep64", "glm4.5-355b-a32b-4layer", "nvidia", 64, ("train.ep=64",), rejected_by={"miles": EXPERTS_EP}),
    Row("nvidia-dp3", GLM5, "nvidia", 8, ("rollout.dp=3",), rejected_by={"miles": SGLANG_BUNDLED_DP}),
)  # fmt: skip

# rlsmoke rejects these; every real parser of the target accepts them at parse time.
STRICTER = (
    Row("ep-over-engine", GLM5, "rocm", 8, ("rollout.ep=4",), rule="sglang.ep_divides_engine_gpus",
        why="neither SGLang checks ep against the engine's GPUs; real-parsers.md and the seed 004 run say ep "
            "must divide them"),
    Row("nodes-whole", GLM5, "nvidia", 12, rule="nodes.whole",
        why="the parsers see --num-gpus-per-node, not how many GPUs the cluster has"),
    Row("async-overcommit", GLM5, "rocm", 8, ("actor_gpus=6", "rollout_gpus=4"), rule="async.fits_nodes",
        why="Miles does not know the node's GPU count; Ray fails at placement"),
    Row("async-odd", GLM5, "rocm", 3, mode="async", rule="async.even_split",
        why="an rlsmoke preset rule: the argv it renders for 3 GPUs is consistent in itself"),
    Row("colocate-split", GLM5, "nvidia", 8, ("rollout_gpus=4",), mode="colocate", rule="colocate.same_gpus",
        why="Miles derives the colocated rollout GPUs itself and ignores the split"),
    Row("engine-multiple", GLM5, "rocm", 8, ("rollout.gpus_per_engine=3", "rollout.dp=3", "rollout.ep=3"),
        rule="rollout.engine_multiple", why="Miles floors the engine count (4 // 3 = 1) and leaves a GPU idle"),
    Row("rollout-tp-set", GLM5, "nvidia", 8, ("rollout.tp=4",), rule="sglang.tp_is_engine_gpus",
        why="rollout.tp is not a flag: Miles sets SGLang's tp to the GPUs per engine, so the argv is unchanged"),
    Row("world-etp-ep", GLM5, "nvidia", 8, ("train.etp=2", "train.ep=8"), rule="megatron.world_etp_ep_pp",
        why="Megatron checks the expert grid in initialize_model_parallel (torch.distributed), not in a parser"),
    Row("sglang-ep-experts", GLM5, "nvidia", 6, ("rollout.gpus_per_engine=6",), target=NEW,
        rule="sglang.ep_divides_experts", why=SGLANG_MODEL_BUILD),
    Row("sglang-moe-tp", GLM5, "nvidia", 6, ("rollout.gpus_per_engine=6", "rollout.ep=2"), target=NEW,
        rule="sglang.moe_tp_divides_moe_ffn", why=SGLANG_MODEL_BUILD),
    Row("sglang-attn-tp-kv", GLM45, "nvidia", 6, ("rollout.gpus_per_engine=6", "rollout.dp=1",
        "rollout.dp_attention=false", "rollout.ep=2"), target=NEW, rule="sglang.attn_tp_divides_heads",
        why=SGLANG_MODEL_BUILD),
    Row("dp-no-dp-attention-new", GLM5, "rocm", 8, ("rollout.dp_attention=false",), target=NEW,
        rule="sglang.dp_needs_dp_attention",
        why="a Miles rule (sglang_validate_args); SGLang 0.5.23 alone runs dp without dp-attention as plain DP"),
)  # fmt: skip

# No open findings: the two the real parsers found (SGLang 0.5.23's split --cuda-graph-max-bs-decode, and
# TP a multiple of the GQA query groups) are fixed and live in AGREE as "nvidia8-new" and "gqa-tp16".
