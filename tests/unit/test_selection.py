"""Which of the suite's tests run on a host, and the reason a skipped one gives (`rlsmoke.selection`)."""

import pytest

from rlsmoke.platforms import Host
from rlsmoke.selection import Decision, Requirement, decide, requirement

H200x1 = Host("nvidia", "H200", 1)
H200x8 = Host("nvidia", "H200", 8)
MI355x8 = Host("rocm", "MI355X", 8)
CPU = Host("cpu", "CPU", 0)

# (requirement, host, launcher, miles_root, expected reason; "" = runs)
DECISIONS = [
    (Requirement("rocm", 8), H200x1, "miles", "/m", "needs 8 ROCm GPUs; found 1 NVIDIA H200"),
    (Requirement("nvidia", 8), H200x1, "miles", "/m", "needs 8 NVIDIA GPUs; found 1 NVIDIA H200"),
    (Requirement("nvidia", 8), CPU, "miles", "/m", "needs 8 NVIDIA GPUs; found no GPU (CPU only)"),
    (Requirement("rocm", 16), MI355x8, "miles", "/m", "needs 16 ROCm GPUs; found 8 ROCm MI355X"),
    (Requirement("nvidia", 1), H200x8, "builtin", None, ""),
    (Requirement("nvidia", 8), H200x8, "builtin", None, ""),  # FSDP2 over the 8 GPUs
    (Requirement("rocm", 2), MI355x8, "builtin", None, ""),
    (Requirement("nvidia", 8), H200x8, "miles", "/m", ""),
    (Requirement("rocm", 8), MI355x8, "miles", "/m", ""),
    (Requirement("cpu", 0), CPU, "miles", None, ""),
]


@pytest.mark.parametrize(("req", "host", "launcher", "root", "reason"), DECISIONS)
def test_decide(req, host, launcher, root, reason):
    assert decide(req, host, launcher=launcher, miles_root=root) == Decision(not reason, reason)


def test_decide_miles_without_root_names_the_option():
    d = decide(Requirement("nvidia", 8), H200x8, launcher="miles", miles_root=None)
    assert not d.run and "--miles-root" in d.reason and "needs 8 NVIDIA GPUs" in d.reason


def test_decide_builtin_async_beyond_two_gpus_names_the_fix():
    d = decide(Requirement("rocm", 8), MI355x8, launcher="builtin")
    assert not d.run and "--launcher miles" in d.reason and "async" in d.reason


@pytest.mark.parametrize(
    ("markers", "gpus", "override", "expected"),
    [
        (["rocm", "gpus"], 8, None, Requirement("rocm", 8)),
        (["rocm", "gpus"], 8, 4, Requirement("rocm", 4)),  # --num-gpus / NUM_GPUS replaces the module's
        (["nvidia"], None, None, Requirement("nvidia", 1)),
        (["cpu", "slow"], None, 8, Requirement("cpu", 0)),
        (["slow"], None, None, None),
    ],
)
def test_requirement(markers, gpus, override, expected):
    assert requirement(markers, gpus, override) == expected


def test_requirement_rejects_two_vendors():
    with pytest.raises(ValueError, match="markers=.*nvidia.*rocm"):
        requirement(["nvidia", "rocm"], 8, None)
