"""Standalone SGLang 0.5.23 on a rendered plan's rollout layout: `prepare_server_args` + `resolve_once()`.
Each `--sglang-X` flag is SGLang's `--X`, as Miles derives it: an unknown one shows drift (`--nsa-*`)."""

from __future__ import annotations

from rlsmoke.conformance import device_facts
from rlsmoke.conformance.hf_fixtures import checkpoint_for
from rlsmoke.conformance.verdict import Verdict, applies, plan_env, run_validator
from rlsmoke.engine.megatron.flags import flag_value
from rlsmoke.launch.miles import flag_values

PARSER = "sglang"
# `--sglang-*` flags that Miles defines for itself: they never reach the engine.
MILES_ONLY = ("--sglang-router-", "--sglang-server-concurrency", "--sglang-config")
_memory_mib = {"value": 0}


def load() -> None:
    """Fake the memory capacity before SGLang's arg hooks import it; stub torchvision; import."""
    from sglang.srt.utils import common

    common.get_device_memory_capacity = lambda device=None: _memory_mib["value"]
    device_facts.stub_torchvision()
    import sglang.srt.server_args  # noqa: F401


def engine_argv(plan: dict) -> list[str]:
    """SGLang's own command line for one rollout engine of the plan."""
    argv = list(plan["argv"])
    gpus_per_engine = flag_value(argv, "--rollout-num-gpus-per-engine") or "1"
    out = ["--model-path", checkpoint_for(plan["case"], flag_value(argv, "--hf-checkpoint")),
           "--trust-remote-code", "--tp-size", gpus_per_engine]  # fmt: skip
    for flag, values in flag_values(argv[2:]):
        if flag.startswith("--sglang-") and not flag.startswith(MILES_ONLY):
            out += ["--" + flag.removeprefix("--sglang-"), *values]
    return out


def check(plan: dict) -> Verdict:
    from sglang.srt.server_args import prepare_server_args

    facts = device_facts.fake_device(plan["topology"]["platform"])
    _memory_mib["value"] = facts.memory_mib
    argv = [*engine_argv(plan), "--device", facts.device]

    def resolve() -> str:
        server_args = prepare_server_args(argv)
        server_args.resolve_once()
        return f"ServerArgs.resolve_once accepted (tp={server_args.tp_size} dp={server_args.dp_size})"

    with plan_env(plan):
        return run_validator(PARSER, resolve, applies=applies(PARSER, plan))
