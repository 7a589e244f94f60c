"""The run key: one class builds it from a summary.json, a record's meta or a case; the device is given."""

import pytest

from rlsmoke.cases import Case
from rlsmoke.errors import RlsmokeError
from rlsmoke.runkey import FIELDS, RunKey


def test_the_engines_summary_and_the_suites_meta_give_the_same_key():
    engine = {"case": "c", "platform": "nvidia", "device": "H200", "launcher": "builtin", "width": "full",
              "dtype": {"rollout": "bfloat16", "train": "float32", "compute": "bfloat16"}}  # fmt: skip
    engine["num_gpus"] = 8
    suite = {**engine, "dtype": "bfloat16/float32", "num_gpus": "8"}
    assert (
        RunKey.from_summary(engine)
        == RunKey.from_summary(suite)
        == RunKey("c", "nvidia", "H200", num_gpus="8")
    )
    # a summary that names no GPU count matches only entries that name none
    assert RunKey.from_summary({k: v for k, v in engine.items() if k != "num_gpus"}).num_gpus == "*"
    assert list(RunKey.from_summary(engine).to_json()) == list(FIELDS)


def test_defaults_follow_the_platform():
    assert RunKey("c").to_json() == {"case": "c", "platform": "cpu", "device": "CPU", "launcher": "builtin",
                                     "dtype": "float32/float32", "width": "tiny", "num_gpus": "*"}  # fmt: skip
    gpu = RunKey.of_case(Case("glm5-744b-a40b-4layer", platform="rocm", num_gpus=8), device="MI355X")
    assert (gpu.dtype, gpu.width, gpu.series()) == (
        "bfloat16/float32",
        "full",
        ("glm5-744b-a40b-4layer", "rocm", "MI355X", "builtin"),
    )


def test_a_gpu_summary_without_a_device_is_named_not_detected():
    with pytest.raises(RlsmokeError, match="names no device") as err:
        RunKey.from_summary({"case": "c", "platform": "nvidia"})
    assert err.value.rule == "runkey.fields"
    assert RunKey.from_summary({"case": "c", "platform": "nvidia"}, device="H100").device == "H100"
