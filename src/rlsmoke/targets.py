"""The Miles / SGLang versions a plan renders its flags for."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    name: str
    miles: str
    sglang: str
    dsa_flag: str  # SGLang's sparse-attention flag stem: "nsa" (Miles 0.0.2's SGLang) or "dsa" (0.5.23)
    checkpoint_dialect: str  # config.json dialect the target's Miles accepts for GLM-5
    cuda_graph_bs_flag: str = "cuda-graph-max-bs"  # SGLang 0.5.23 split it into -decode / -prefill
    # Whose launcher the flags follow (rows of launch.substitutions name theirs).
    launcher: str = "seed-004"
    # the Megatron-LM the target's Miles runs with: a commit of its `miles-main` branch
    megatron: str = "bundled"

    @property
    def main(self) -> bool:
        return self.launcher == "main-2026-08"


_TARGETS = (
    # Miles main 31f1ca961 (2026-08-21) with Megatron-LM miles-main 2e64d788b and its SGLang 0.5.16 fork.
    Target(
        "miles-2026-08-21",
        "31f1ca961",
        "0.5.16",
        "nsa",
        "glm_moe_dsa",
        launcher="main-2026-08",
        megatron="2e64d788b",
    ),
    Target("miles-0.0.2", "0.0.2", "bundled", "nsa", "glm_moe_dsa"),
    Target("sglang-0.5.23", "main", "0.5.23", "dsa", "glm_moe_dsa", "cuda-graph-max-bs-decode"),
    # Seed 004's era: the older Miles that wanted a DeepseekV32 config.
    Target("miles-2026-05", "2026-05", "bundled", "nsa", "deepseek_v32"),
)
TARGETS = {t.name: t for t in _TARGETS}
DEFAULT_TARGET = "miles-2026-08-21"
