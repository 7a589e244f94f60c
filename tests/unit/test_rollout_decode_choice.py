"""Which rollout decode a run takes (`--rollout-decode`, decided once in `rlsmoke.resolve`): `auto` follows
the decode the run's thresholds were calibrated from, an explicit choice is kept, an unknown one refused."""

import json

import pytest

from rlsmoke.cases import Case
from rlsmoke.platforms import Host
from rlsmoke.resolve import Session, resolve
from rlsmoke.shipped import FIXTURES


@pytest.mark.parametrize(("case", "platform", "device", "decided"), [
    ("glm5-744b-a40b-4layer-1gpu", "nvidia", "H200", "static"),  # its keys: calibrated from static seeds
    ("glm5.3-flash-4layer-1gpu", "nvidia", "H200", "static"),  # calibrated anew from static seeds
    ("glm5-744b-a40b-4layer", "nvidia", "H100", "static"),  # no key yet: the one its calibration will use
    ("glm5-744b-a40b-4layer", "cpu", "CPU", "generate"),
    ("glm5-744b-a40b-4layer", "rocm", "MI355X", "generate"),  # static never measured there
])  # fmt: skip
def test_auto_takes_the_decode_the_run_s_thresholds_were_calibrated_from(case, platform, device, decided):
    """`--rollout-decode auto` (the CLI's and the suite's default) is decided once, in `resolve`: the rollout's
    log-probs are the decode's, so a key calibrated from `generate` keeps `generate` until it is calibrated anew."""
    gpus = 1 if platform != "rocm" else 2
    session = Session(host=Host(platform, device, gpus), gated=False)
    tiny = not case.endswith("-1gpu")  # the tiny widths fit any host: the decision is the point
    assert Session().rollout_decode == "auto"
    assert resolve(Case(case, platform=platform, num_gpus=gpus, tiny=tiny), session).rollout_decode == decided


@pytest.mark.parametrize("calibrated_from", ["generate", "generate/static"])
def test_auto_keeps_generate_for_a_key_calibrated_from_it(monkeypatch, tmp_path, calibrated_from):
    """A key calibrated from `generate` keeps it until it is calibrated anew; so does one whose static calls
    fell back to `generate` (`generate/static`): its bounds hold `generate`'s numerics in part."""
    case = Case("glm5-744b-a40b-4layer-1gpu", platform="nvidia", num_gpus=1)
    session = Session(host=Host("nvidia", "H200", 1), gated=False)
    assert resolve(case, session).rollout_decode == "static"
    shipped = json.loads((FIXTURES / "thresholds" / "builtin.json").read_text())
    entry = next(e for e in shipped["entries"] if e["key"]["case"] == case.name and "trainer" not in e["key"])
    entry["provenance"]["rollout_decode"] = calibrated_from
    (tmp_path / "cluster.json").write_text(json.dumps(shipped | {"entries": [entry]}))
    monkeypatch.setenv("RLSMOKE_THRESHOLDS_DIR", str(tmp_path))
    assert resolve(case, session).rollout_decode == "generate"


def test_an_explicit_decode_is_kept_and_an_unknown_one_is_refused():
    from rlsmoke.engine.config import RunConfig
    from rlsmoke.engine.limits import longest_prompt
    from rlsmoke.errors import RlsmokeError

    case = "glm5-744b-a40b-4layer"
    chosen = resolve(Case(case, platform="cpu", tiny=True), Session(rollout_decode="static"))
    assert chosen.rollout_decode == "static"
    # resolve measures the prompt file once; the engine sizes the static cache from it
    assert chosen.longest_prompt == longest_prompt(chosen.prompt_data).tokens > 0
    with pytest.raises(RlsmokeError, match=r"rollout_decode='cuda-graphs' is unknown.*--rollout-decode"):
        RunConfig(case=case, tiny=True, rollout_decode="cuda-graphs").validate()
