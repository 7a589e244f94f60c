"""GLM-5 config dialects: older Miles (deepseek_v32) and native (glm_moe_dsa); idempotent; the problems
reported before a patch."""

import json

import pytest

from rlsmoke.checkpoints import patch, synthesize, verify
from rlsmoke.checkpoints.dialects import NATIVE, OLD_MILES, dialect_problems
from rlsmoke.errors import CheckpointError, UnknownNameError


@pytest.fixture(scope="module")
def glm5(tmp_path_factory):
    return synthesize("glm5-744b-a40b-4layer", tmp_path_factory.mktemp("p") / "g", tiny=True)


def test_round_trip_and_idempotence(glm5):
    native = (glm5 / "config.json").read_text()
    assert dialect_problems(json.loads(native), NATIVE) == []
    assert dialect_problems(json.loads(native), OLD_MILES)
    patch(glm5, OLD_MILES)
    old = json.loads((glm5 / "config.json").read_text())
    assert old["model_type"] == OLD_MILES and old["architectures"] == ["DeepseekV32ForCausalLM"]
    assert old["auto_map"]["AutoConfig"] == "configuration_deepseek_v32.DeepseekV32Config"
    assert old["rope_theta"] == old["rope_parameters"]["rope_theta"] == 1000000.0
    once = (glm5 / "config.json").read_text()
    assert patch(glm5, OLD_MILES) == [] and (glm5 / "config.json").read_text() == once
    verify(glm5)  # the older dialect still matches its tensors
    problems = dialect_problems(json.loads(once), NATIVE)
    assert any("auto_map" in p for p in problems) and any("architectures" in p for p in problems)
    with pytest.raises(CheckpointError, match="config.json: .*newer Miles"):
        verify(glm5, dialect=NATIVE)
    patch(glm5, NATIVE)
    assert json.loads((glm5 / "config.json").read_text()) == json.loads(native)


def test_dialects_are_for_glm5_only(tmp_path):
    ckpt = synthesize("glm4.5-355b-a32b-4layer", tmp_path / "g45", tiny=True)
    with pytest.raises(CheckpointError, match="not model_type='glm4_moe'"):
        patch(ckpt, OLD_MILES)
    with pytest.raises(UnknownNameError, match=r"dialect='v3' is unknown"):
        patch(ckpt, "v3")
