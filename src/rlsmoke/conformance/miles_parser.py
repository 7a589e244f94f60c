"""Miles' own parser (PyPI miles-rl 0.0.2) on a rendered plan, then its SGLang ServerArgs per engine, as
train.py and each rollout engine's start do. Runs in the Miles venv (.ci/conformance-envs.sh)."""

from __future__ import annotations

import sys
from unittest import mock

from rlsmoke.conformance import device_facts
from rlsmoke.conformance.hf_fixtures import checkpoint_for
from rlsmoke.conformance.verdict import Verdict, applies, plan_env, run_validator
from rlsmoke.engine.megatron.flags import flag_value

PARSER = "miles"
_MAX_ENGINES_CHECKED = 8  # every engine gets the same checks; only base_gpu_id differs by rank


def load() -> None:
    """Import the real parser under the import-only stubs. Raises ImportError when not installed."""
    device_facts.stub_torchvision()
    device_facts.stub_triton()
    import miles.backends.sglang_utils.sglang_engine  # noqa: F401
    import miles.utils.arguments  # noqa: F401


def with_checkpoint(argv: list[str], plan: dict) -> list[str]:
    """argv with `--hf-checkpoint` pointing at a folder that has the model's config.json."""
    rendered = flag_value(argv, "--hf-checkpoint")
    folder = checkpoint_for(plan["case"], rendered)
    if rendered is None:
        return [*argv, "--hf-checkpoint", folder]
    return [folder if i > 0 and argv[i - 1] == "--hf-checkpoint" else tok for i, tok in enumerate(argv)]


def check(plan: dict) -> Verdict:
    from miles.backends.sglang_utils.sglang_engine import _compute_server_args
    from miles.utils.arguments import parse_args
    from sglang.srt import server_args as sglang_server_args

    facts = device_facts.fake_device(plan["topology"]["platform"])
    sglang_server_args.get_device_memory_capacity = lambda device=None: facts.memory_mib
    argv = with_checkpoint(list(plan["argv"]), plan)
    script, flags = argv[1], argv[2:]
    in_scope = applies(PARSER, plan)
    parsed = {}

    def stage1() -> str:
        with mock.patch.object(sys, "argv", [script, *flags]):
            parsed["args"] = parse_args()
        return f"{script} parse_args accepted"

    with plan_env(plan):
        if not (verdict := run_validator(PARSER, stage1, applies=in_scope)).accepted:
            return verdict
        args = parsed["args"]
        per_engine = args.rollout_num_gpus_per_engine
        engines = max(1, (args.rollout_num_gpus or per_engine) // per_engine)
        checked = min(engines, _MAX_ENGINES_CHECKED)

        def stage2() -> str:
            loopback = {"dist_init_addr": "127.0.0.1:20000", "nccl_port": 20001, "host": "127.0.0.1"}
            for rank in range(checked):
                kwargs, _ = _compute_server_args(args, rank, port=30000 + rank, **loopback)
                kwargs["device"] = facts.device
                sglang_server_args.ServerArgs(**kwargs)
            return (
                f"{script} parse_args and SGLang ServerArgs of {checked}/{engines} engine(s) accepted "
                f"(tp={args.sglang_tp_size} dp={args.sglang_dp_size} ep={args.sglang_ep_size})"
            )

        return run_validator(PARSER, stage2, applies=in_scope)
