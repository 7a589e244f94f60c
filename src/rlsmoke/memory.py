"""Device memory per GPU, estimated from the plan before anything loads. No torch here. The terms follow
what the built-in engine keeps resident in each phase; async takes the larger of its two devices."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field

from rlsmoke.facts import CPU_MAX_RESPONSE_LEN, CPU_N_PROMPTS, CPU_N_SAMPLES
from rlsmoke.models.params import kda_layers, parameter_count

GIB = 2**30
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PHASES = ("load", "rollout", "train", "sync")
# The longest fixture prompt is 47 tokens; the estimate budgets for this many.
PROMPT_TOKENS = 64
# CUDA context, NCCL buffers and fragmentation are not in `max_memory_allocated`, which this predicts.
USABLE_FRACTION = 0.92


@dataclass(frozen=True)
class Plan:
    """What decides the memory of a run: the sharding, the dtypes, the offload and the batch."""

    world: int = 1  # FSDP2 ranks of the trainer (colocate: every GPU)
    mode: str = "colocate"
    train_dtype: str = "float32"  # master weights, grads, AdamW moments
    rollout_dtype: str = "bfloat16"
    compute_dtype: str = "bfloat16"  # the trainer's autocast dtype (FSDP2's param dtype)
    offload: bool = True  # train state in host memory during rollout, rollout copy during the train step
    # with the offload: the train state does leave for the rollout (else only the copy)
    offload_train: bool = True
    # one device: a compute-dtype copy over the fp32 master weights (engine.precision)
    compute_copy: bool = False
    # The fused AdamW step (one CUDA device) needs no state-sized temporary; foreach (FSDP2, CPU) does.
    fused_adamw: bool = False
    n_prompts: int = CPU_N_PROMPTS
    n_samples: int = CPU_N_SAMPLES
    prompt_len: int = PROMPT_TOKENS
    response_len: int = CPU_MAX_RESPONSE_LEN
    kda: str = "fla"  # GLM-5.3-Flash's KDA: "fla" (Triton kernels) or "reference" (PyTorch, engine.kda)
    # --repeat / --variants: the initial weights kept on the device (engine.reuse)
    initial_on_device: bool = False

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch: one prompt's group of samples."""
        return self.n_samples * (self.prompt_len + self.response_len)


@dataclass(frozen=True)
class Estimate:
    """Bytes per GPU by phase, with the terms that make each."""

    phases: dict[str, int]
    terms: dict[str, dict[str, int]] = field(default_factory=dict)
    params: int = 0

    @property
    def peak(self) -> int:
        return max(self.phases.values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)

    def gib(self) -> dict[str, float]:
        """{phase: GiB} plus "peak", rounded for summary.json."""
        return {k: round(v / GIB, 2) for k, v in (self.phases | {"peak": self.peak}).items()}

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in self.terms.get(self.peak_phase, {}).items() if v)
        return f"{self.peak / GIB:.0f} GiB per GPU at {self.peak_phase} ({parts})"


# float32 (rows, heads, chunks, 64, 64, head_dim) tensors the reference chunked KDA keeps in one layer's
# backward, fitted to H200 peaks of 102.08 and 109.0 GiB (docs/benchmarks.md, GLM-5.3-Flash).
REFERENCE_KDA_TEMPORARIES = 11
KDA_CHUNK = 64


def _activations(spec, plan: Plan) -> int:
    """One micro-batch of the train step: the logits path dominates, plus per layer a few dozen values per
    token, GLM-5.3-Flash's hc_mult streams, and KDA's chunk temporaries."""
    n_resp = plan.n_samples * plan.response_len
    c = BYTES[plan.compute_dtype]
    logits = plan.tokens * spec.vocab_size * c + 4 * n_resp * spec.vocab_size * 4
    layers = plan.tokens * spec.hidden_size * 32 * c * spec.num_layers
    hc = dict(spec.hf_extra).get("hc_mult", 1) if spec.hf_model_type == "glm5_next" else 1
    streams = plan.tokens * spec.hidden_size * hc * (c + 2 * 4) * spec.num_layers if hc > 1 else 0
    return logits + layers + streams + _kda_backward(spec, plan)


def _kda_backward(spec, plan: Plan) -> int:
    if not kda_layers(spec):
        return 0
    x = dict(spec.hf_extra)
    heads, dim = x["linear_num_heads"], x["linear_head_dim"]
    chunks = -(-(plan.prompt_len + plan.response_len) // KDA_CHUNK)
    per_chunk = plan.n_samples * heads * chunks * dim * dim
    if plan.kda == "reference":
        return REFERENCE_KDA_TEMPORARIES * per_chunk * KDA_CHUNK * KDA_CHUNK // dim * 4
    return 2 * per_chunk * BYTES[plan.compute_dtype]  # the chunk states and their grads


def _kv_elements(spec) -> int:
    """Values the DynamicCache keeps per token and attention layer: MLA's expanded keys and values (plus the
    DSA indexer's key), GQA's key and value per group."""
    x = dict(spec.hf_extra)
    if "kv_lora_rank" in x:
        head = x["qk_nope_head_dim"] + x["qk_rope_head_dim"] + x["v_head_dim"]
        return spec.num_attention_heads * head + x.get("index_head_dim", 0)
    return 2 * spec.num_query_groups * x.get("head_dim", spec.hidden_size // spec.num_attention_heads)


def _kda_state(spec, r: int) -> int:
    """One row's KDA cache: the float32 recurrent state and the short convolution's last positions."""
    x = dict(spec.hf_extra)
    heads, dim = x["linear_num_heads"], x["linear_head_dim"]
    return heads * dim * dim * 4 + 3 * heads * dim * x.get("linear_conv_kernel_dim", 4) * r


def _rollout_working(spec, plan: Plan) -> int:
    """What sampling one group of n holds beside the rollout copy: the KV cache (and one layer's old one
    while `torch.cat` grows it), generate's `batched_mm` experts (a weight copy per token and expert, the
    largest term at n = 8), and the next-token logits' copies."""
    r = BYTES[plan.rollout_dtype]
    n, seq = plan.n_samples, plan.prompt_len + plan.response_len
    kv = n * seq * _kv_elements(spec) * r * (spec.num_layers - kda_layers(spec) + 1)  # attention layers + 1
    kv += n * _kda_state(spec, r) * kda_layers(spec) if kda_layers(spec) else 0
    expert = 3 * spec.moe_ffn_hidden_size * spec.hidden_size * r  # gate, up and down: 3 x I x h
    experts = n * spec.moe_topk * expert if spec.num_moe_layers else 0
    return kv + experts + n * spec.vocab_size * (r + 4 * 4)


def estimate(spec, plan: Plan) -> Estimate:
    """Peak device bytes per GPU for one GRPO step of `spec` under `plan`."""
    p = parameter_count(spec)
    if plan.mode == "async":
        train = estimate(spec, Plan(**{**plan.__dict__, "mode": "train-only"}))
        rollout = p.total * BYTES[plan.rollout_dtype] + _rollout_working(spec, plan)
        phases = {"load": max(train.phases["load"], rollout), "rollout": rollout, "train": train.phases["train"],
                  "sync": max(train.phases["sync"], rollout)}  # fmt: skip
        terms = {"train": train.terms["train"], "rollout": {"rollout copy": rollout}}
        return Estimate(phases, terms, p.total)
    w, t, r, c = plan.world, BYTES[plan.train_dtype], BYTES[plan.rollout_dtype], BYTES[plan.compute_dtype]
    has_rollout = plan.mode != "train-only"
    master = -(-p.total * t // w)  # ceil: FSDP2 pads the shards
    grads, moments, adam_tmp = master, 2 * master, 0 if plan.fused_adamw and w == 1 else master
    copy = p.total * r if has_rollout else 0
    act = _activations(spec, plan)
    compute = p.total * c if plan.compute_copy and w == 1 else 0
    if compute:
        # the compute copy is resident (below); its grads live until they are added to the master's
        unsharded = 0
        loading = {"master": master, "compute copy": compute}
    elif w == 1:
        # autocast saves a compute-dtype cast of every matmul weight for backward (the lookup stays fp32)
        unsharded = (p.total - p.embedding) * c if c != t else 0
        loading = {"master": master}
    else:
        # FSDP2: the root's gathered params stay; a block, its prefetched neighbour and its grads gather
        big = sorted(p.blocks, reverse=True)[:2]
        unsharded = p.root * c + sum(big) * c + big[0] * c
        loading = {"master": master, "block being sharded": max(p.blocks) * t}
    resident_copy = 0 if plan.offload else copy
    resident_state = not (plan.offload and plan.offload_train)
    terms = {
        "load": loading | {"rollout copy": copy},
        # with offload the train state waits in host memory; otherwise the step's state stays
        "rollout": {"rollout copy": copy, "rollout working set": _rollout_working(spec, plan) if has_rollout else 0}
        | ({"master": master, "compute copy": compute, "AdamW moments": moments} if resident_state else {}),
        "train": {"master": master, "compute copy": compute, "grads": grads, "AdamW moments": moments,
                  "AdamW temporary": adam_tmp, "rollout copy": resident_copy},
        # FSDP2 gathers each parameter in full (train dtype) and casts it; one device casts only
        "sync": {"master": master, "compute copy": compute, "rollout copy": copy,
                 "gathered tensor": p.largest_tensor * (r if w == 1 else t + r)}
        | ({"AdamW moments": moments} if resident_state else {}),
    }  # fmt: skip
    backward = {"master": master, "grads": grads, "unsharded weights": unsharded, "compute copy": compute,
                "compute grads": compute, "activations": act, "rollout copy": resident_copy}  # fmt: skip
    if sum(backward.values()) > sum(terms["train"].values()):
        terms["train"] = backward
    if plan.initial_on_device:
        # a bf16 checkpoint's fp32 master fits in bf16
        kept = {"initial weights": -(-p.total * min(t, r) // w)}
        terms = {phase: parts | kept for phase, parts in terms.items()}
    phases = {k: sum(v.values()) for k, v in terms.items()}
    return Estimate(phases, terms, p.total)


def plan_of_run(cfg) -> Plan:
    """The plan of an engine `RunConfig` (read by field name, so this module stays free of the engine)."""
    return Plan(world=cfg.num_gpus if cfg.mode == "colocate" else 1, mode=cfg.mode, train_dtype=cfg.train_dtype,
                rollout_dtype=cfg.rollout_dtype, compute_dtype=cfg.train_compute_dtype, offload=cfg.offload_active,
                offload_train=cfg.offload_train_active, initial_on_device=cfg.initial_on_device,
                n_prompts=cfg.n_prompts, n_samples=cfg.n_samples, response_len=cfg.max_response_len,
                kda="fla" if cfg.device.startswith("cuda") and importlib.util.find_spec("fla") is not None
                and os.environ.get("RLSMOKE_KDA", "").strip().lower() != "reference"
                else "reference",
                compute_copy=cfg.separate_compute_copy and cfg.trainer != "megatron"
                and (cfg.num_gpus == 1 or cfg.mode == "async"),
                fused_adamw=cfg.device.startswith("cuda") and (cfg.num_gpus == 1 or cfg.mode == "async"))  # fmt: skip
