"""TE's cuDNN fused attention on packed sequences (THD, causal), forward and backward, as Miles' GLM-4.5
step runs it: 96 query heads, 8 KV groups, head dim 128, bf16. Prints the cuDNN files this process mapped
and the version torch reads, so a run shows which build served it.
    python3 bench/te_attention_probe.py        exit 0: the backward ran; 1: it raised (the error printed)"""

import os
import sys

# the fused backend alone, as `--attention-backend fused` sets it: no fallback to another backend
os.environ.update(NVTE_FLASH_ATTN="0", NVTE_FUSED_ATTN="1", NVTE_UNFUSED_ATTN="0")

import torch  # noqa: E402
import transformer_engine.pytorch as te  # noqa: E402

HEADS, GROUPS, HEAD_DIM = 96, 8, 128
LENGTHS = (300, 700, 1048)  # three packed samples, 2048 tokens, as --max-tokens-per-gpu 2048


def mapped_cudnn() -> list[str]:
    with open("/proc/self/maps") as maps:
        return sorted({line.split()[-1] for line in maps if "libcudnn" in line})


def main() -> int:
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    tokens, longest = sum(LENGTHS), max(LENGTHS)
    attention = te.DotProductAttention(
        HEADS, HEAD_DIM, num_gqa_groups=GROUPS, qkv_format="thd", attn_mask_type="padding_causal"
    )

    def packed(heads):
        return torch.randn(tokens, heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    q, k, v = packed(HEADS), packed(GROUPS), packed(GROUPS)
    try:
        out = attention(
            q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest, max_seqlen_kv=longest
        )
        out.float().square().mean().backward()
        torch.cuda.synchronize()
        verdict = f"backward ran: |dq| {q.grad.float().norm():.4g}"
    except RuntimeError as error:
        verdict = f"backward raised: {str(error)[:400]}"
    print(f"mapped: {mapped_cudnn()}")
    print(verdict)
    try:  # torch refuses to read a cuDNN older than its own build's: that is worth printing, not raising
        print(f"torch reads cuDNN {torch.backends.cudnn.version()}")
    except RuntimeError as error:
        print(f"torch cannot read the cuDNN: {str(error)[:200]}")
    return 0 if verdict.startswith("backward ran") else 1


if __name__ == "__main__":
    sys.exit(main())
