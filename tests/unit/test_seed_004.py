"""Seed 004, flag for flag: the NVIDIA test and its ROCm port, rendered from (case, platform, 8)."""

from rlsmoke.cases import Case
from rlsmoke.launch.miles import flag_values
from rlsmoke.recipe import Recipe

MODEL = (
    "--spec miles_plugins.models.glm5.glm5 get_glm5_spec --moe-layer-freq [0]*3+[1]*1 --num-experts 256 "
    "--moe-router-topk 8 --moe-ffn-hidden-size 2048 --moe-shared-expert-intermediate-size 2048 "
    "--moe-grouped-gemm --moe-permute-fusion --moe-router-score-function sigmoid --moe-router-pre-softmax "
    "--moe-router-enable-expert-bias --moe-router-bias-update-rate 0 --moe-router-load-balancing-type "
    "seq_aux_loss --moe-router-topk-scaling-factor 2.5 --moe-aux-loss-coeff 0 --moe-router-dtype fp32 "
    "--make-vocab-size-divisible-by 16 --num-layers 4 --hidden-size 6144 --ffn-hidden-size 12288 "
    "--num-attention-heads 64 --disable-bias-linear --swiglu --untie-embeddings-and-output-weights "
    "--position-embedding-type rope --no-position-embedding --normalization RMSNorm --qk-layernorm "
    "--multi-latent-attention --q-lora-rank 2048 --kv-lora-rank 512 --qk-head-dim 192 --v-head-dim 256 "
    "--kv-channels 192 --qk-pos-emb-head-dim 64 --vocab-size 154880 --rotary-base 1000000 --enable-experimental"
)
COMMON = (
    "--save-interval 20 --input-key prompt --label-key label --apply-chat-template --rollout-shuffle "
    "--rm-type deepscaler --num-rollout 3 --rollout-batch-size 8 --n-samples-per-prompt 8 "
    "--rollout-max-response-len 100 --rollout-temperature 1 --global-batch-size 64 "
    "--pipeline-model-parallel-size 1 --expert-tensor-parallel-size 1 "
    "--use-dynamic-batch-size --max-tokens-per-gpu 2048 "
    "--advantage-estimator grpo --kl-loss-coef 0.00 --kl-loss-type low_var_kl --kl-coef 0.00 --entropy-coef 0.00 "
    "--eps-clip 0.2 --eps-clip-high 0.28 "
    "--optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98 "
    "--sglang-mem-fraction-static 0.70 --sglang-enable-dp-attention --sglang-attention-backend nsa "
    "--sglang-watchdog-timeout 3600 --ci-test --ci-disable-logprobs-checker "
    "--attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32 "
    "--attention-softmax-in-fp32 --update-weight-buffer-size 2147483648 --actor-num-nodes 1 --num-gpus-per-node 8"
)
NVIDIA = (
    "--tensor-model-parallel-size 4 --sequence-parallel --context-parallel-size 2 --expert-model-parallel-size 8 "
    "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
    "--data-pad-size-multiplier 4096 --log-probs-chunk-size 1024 "
    "--rollout-num-gpus-per-engine 8 --sglang-ep-size 8 --sglang-dp-size 8 --sglang-moe-dense-tp-size 1 "
    "--sglang-enable-dp-lm-head --sglang-page-size 64 --sglang-nsa-decode-backend flashmla_sparse "
    "--sglang-nsa-prefill-backend flashmla_sparse --sglang-cuda-graph-max-bs 256 "
    "--sglang-max-running-requests 512 --sglang-chunked-prefill-size 16384 "
    "--attention-backend flash --moe-enable-deepep --moe-token-dispatcher-type flex --allgather-cp "
    "--actor-num-gpus-per-node 8 --colocate --disable-weights-backuper"
)
ROCM = (
    "--tensor-model-parallel-size 1 --context-parallel-size 1 --expert-model-parallel-size 4 "
    "--optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer "
    "--rollout-num-gpus-per-engine 2 --sglang-ep-size 2 --sglang-dp-size 2 "
    "--sglang-nsa-decode-backend tilelang --sglang-nsa-prefill-backend tilelang --sglang-disable-custom-all-reduce "
    "--attention-backend fused --moe-token-dispatcher-type alltoall "
    "--actor-num-gpus-per-node 4 --rollout-num-gpus 4 --update-weights-interval 2"
)
PATH_FLAGS = {"--hf-checkpoint", "--ref-load", "--load", "--save", "--prompt-data", "--dump-details"}
NVIDIA_ENV = {"SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK": "256", "SGLANG_NSA_FORCE_MLA": "1",
              "INDEXER_ROPE_NEOX_STYLE": "0", "NVSHMEM_DISABLE_NCCL": "1"}  # fmt: skip
ROCM_ENV = {
    "NVTE_FUSED_ATTN": "1", "NVTE_FLASH_ATTN": "0", "NVTE_UNFUSED_ATTN": "0", "NVTE_USE_CUTLASS_GROUPED_GEMM": "1",
    "NVTE_CUTLASS_GROUPED_GEMM_WARN_FALLBACK": "1", "SGLANG_SET_CPU_AFFINITY": "0",
    "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
}  # fmt: skip


def _as_dict(tokens: list[str]) -> dict[str, tuple[str, ...]]:
    return {flag: tuple(values) for flag, values in flag_values(tokens)}


def _rendered(platform: str, mode: str | None = None):
    # Seed 004's Miles (the target before Miles main's launcher changed its flags; test_golden has both),
    # scored with Miles' deepscaler reward where rlsmoke's default is its dense target reward
    plan = Case("glm5-744b-a40b-4layer", platform=platform, num_gpus=8, mode=mode, target="miles-0.0.2").plan(
        recipe=Recipe(reward="deepscaler")
    )
    flags = _as_dict(plan.launch.argv[2:])
    return plan, {f: v for f, v in flags.items() if f not in PATH_FLAGS}, set(flags) & PATH_FLAGS


def test_nvidia_renders_seed_004_nvidia():
    plan, flags, paths = _rendered("nvidia")
    assert plan.launch.script == "train.py"
    assert flags == _as_dict(f"{MODEL} {COMMON} {NVIDIA}".split())
    assert paths == PATH_FLAGS
    assert NVIDIA_ENV.items() <= plan.launch.env.items()
    assert not set(ROCM_ENV) & set(plan.launch.env)


def test_rocm_renders_seed_004_rocm():
    plan, flags, paths = _rendered("rocm", "async")
    assert plan.launch.script == "train_async.py"
    assert flags == _as_dict(f"{MODEL} {COMMON} {ROCM}".split())
    assert ROCM_ENV.items() <= plan.launch.env.items()
    assert not set(NVIDIA_ENV) & set(plan.launch.env)


def test_moe_layer_freq_is_one_token():
    plan, _, _ = _rendered("nvidia")
    argv = plan.launch.argv
    assert argv[argv.index("--moe-layer-freq") + 1] == "[0]*3+[1]*1"
    assert "'[0]*3+[1]*1'" in "\n".join(plan.launch.script_lines())  # quoted: a shell would glob it


def test_no_gpu_count_is_a_literal():
    """Every count follows NUM_GPUS: render at 16 and nothing says 8 GPUs any more."""
    plan = Case("glm5-744b-a40b-4layer", platform="rocm", num_gpus=16, gpus_per_node=16).plan()
    flags = _as_dict(plan.launch.argv[2:])
    assert flags["--rollout-num-gpus"] == ("8",)
    assert flags["--actor-num-gpus-per-node"] == ("8",)
    assert flags["--num-gpus-per-node"] == ("16",)
    assert plan.launch.env["HIP_VISIBLE_DEVICES"] == ",".join(map(str, range(16)))
    assert plan.launch.ray_start()[plan.launch.ray_start().index("--num-gpus") + 1] == "16"
