"""The rendered launches against golden snapshots (one token per line, paths as placeholders), one folder per target.

Rewrite them with `pytest tests/unit/test_golden.py --update-golden` and review the diff.
"""

from pathlib import Path

import pytest

from rlsmoke.cases import Case
from rlsmoke.launch.miles import Paths

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "golden"
GOLDEN_TARGETS = (
    "miles-2026-08-21",
    "miles-0.0.2",
)  # the targets with a recorded flag table (test_miles_flags)
RENDERS = [("glm5-744b-a40b-4layer", platform, n) for platform in ("nvidia", "rocm") for n in (2, 4, 8)] + [
    ("glm5.3-flash", "nvidia", 32),
    ("glm4.5-355b-a32b", "nvidia", 64),
]
PLACEHOLDERS = Paths(*(f"<{name}>" for name in ("MODEL_DIR", "DATA_DIR", "OUTPUT_DIR", "MEGATRON_ROOT", "MILES_ROOT",
                                                  "RLSMOKE_REWARD_DIR")))  # fmt: skip


def golden_path(target: str, case: str, platform: str, n: int) -> Path:
    return GOLDEN / target / f"{case}__{platform}__{n}.txt"


def snapshot(case: str, platform: str, n: int, target: str) -> str:
    plan = Case(case, platform=platform, num_gpus=n, target=target).plan(paths=PLACEHOLDERS)
    lines = [f"# rlsmoke plan {case} --platform {platform} --num-gpus {n} --target {target}  "
             f"(mode {plan.topology.mode})"]  # fmt: skip
    lines += [f"env {k}={v}" for k, v in plan.launch.env.items()]
    if plan.launch.num_nodes > 1:  # across nodes: each node's Ray command, the head's address a placeholder
        lines += [f"node {n['rank']} {' '.join(n['command'])}" for n in plan.launch.nodes()]
    lines += plan.launch.argv
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("target", GOLDEN_TARGETS)
@pytest.mark.parametrize("case, platform, n", RENDERS)
def test_golden(case, platform, n, target, request):
    path = golden_path(target, case, platform, n)
    got = snapshot(case, platform, n, target)
    if request.config.getoption("--update-golden", default=False):
        path.parent.mkdir(exist_ok=True)
        path.write_text(got)
    assert path.exists(), f"no golden file {path.name}: run pytest {__file__} --update-golden"
    assert got == path.read_text(), f"{path.name} differs from the render: review, then --update-golden"
