"""Every topology rule: one case that passes it and one that trips it (and only the rule named)."""

import pytest

from rlsmoke.errors import TopologyError
from rlsmoke.models import model_spec
from rlsmoke.topology import plan_topology, split_layers
from rlsmoke.topology_rules import RULES, violations

GLM5 = "glm5-744b-a40b-4layer"

# rule id -> (case, platform, num_gpus, mode, overrides) that trips it
TRIPS = {
    "nodes.whole": (GLM5, "nvidia", 12, None, {}),
    "async.even_split": (GLM5, "rocm", 3, "async", {}),
    "async.parts_positive": (GLM5, "rocm", 1, "async", {}),
    "async.fits_nodes": (GLM5, "rocm", 8, "async", {"actor_gpus": 6, "rollout_gpus": 4}),
    "colocate.same_gpus": (GLM5, "nvidia", 8, "colocate", {"rollout_gpus": 4}),
    "rollout.engine_multiple": (GLM5, "rocm", 8, "async", {"rollout.gpus_per_engine": 3, "rollout.dp": 3,
                                                            "rollout.ep": 3}),
    "sglang.tp_is_engine_gpus": (GLM5, "nvidia", 8, None, {"rollout.tp": 4}),
    "sglang.dp_needs_dp_attention": (GLM5, "rocm", 8, "async", {"rollout.dp_attention": False}),
    "sglang.dp_divides_engine_gpus": (GLM5, "rocm", 8, "async", {"rollout.dp": 4}),
    "sglang.ep_divides_engine_gpus": (GLM5, "rocm", 8, "async", {"rollout.ep": 4}),
    # what SGLang asserts when it builds the model: 256 experts over EP 6; MoE TP 6/2 = 3 over a width of
    # 2048; GLM-4.5's 8 KV heads over attention TP 6
    "sglang.ep_divides_experts": (GLM5, "nvidia", 6, None, {"rollout.gpus_per_engine": 6}),
    "sglang.moe_tp_divides_moe_ffn": (GLM5, "nvidia", 6, None, {"rollout.gpus_per_engine": 6, "rollout.ep": 2}),
    "sglang.attn_tp_divides_heads": ("glm4.5-355b-a32b-4layer", "nvidia", 6, None, {"rollout.gpus_per_engine": 6,
                                     "rollout.dp": 1, "rollout.dp_attention": False, "rollout.ep": 2}),
    "megatron.tp_divides_heads": ("glm4.5-355b-a32b-4layer", "nvidia", 24, None, {"train.tp": 12, "train.cp": 1}),
    "megatron.ep_divides_experts": ("glm4.5-355b-a32b-4layer", "nvidia", 64, None, {"train.ep": 64}),
    "megatron.sp_needs_tp": (GLM5, "rocm", 8, "async", {"train.sp": True}),
    "megatron.pp_stages_nonempty": (GLM5, "nvidia", 8, None, {"train.pp": 8, "train.tp": 1, "train.cp": 1,
                                                               "train.ep": 1}),
    "megatron.pp_layers_sum": (GLM5, "nvidia", 8, None, {"train.pp": 2, "train.tp": 2, "train.ep": 4,
                                                          "train.pp_layers": (2, 3)}),
    "megatron.world_tp_cp_pp": (GLM5, "nvidia", 8, None, {"train.cp": 4}),
    "megatron.world_etp_ep_pp": (GLM5, "nvidia", 8, None, {"train.etp": 2, "train.ep": 8}),
    "train.positive": (GLM5, "nvidia", 8, None, {"train.etp": 0}),
}  # fmt: skip

# rule id -> a case that passes it (the defaults pass them all; the interesting ones sit next to a trip)
PASSES = {
    "async.even_split": (GLM5, "rocm", 8, "async", {}),
    "sglang.dp_divides_engine_gpus": (GLM5, "rocm", 8, "async", {"rollout.dp": 2}),  # seed 004's review case
    "megatron.pp_stages_nonempty": ("glm5.3-flash", "nvidia", 32, None, {}),
    "megatron.pp_layers_sum": (GLM5, "nvidia", 8, None, {"train.pp": 2, "train.tp": 2, "train.ep": 4,
                                                          "train.pp_layers": (1, 3)}),
    # TP 16 over 8 query groups: a multiple of them, which megatron-core accepts (KV heads replicated)
    "megatron.tp_divides_heads": ("glm4.5-355b-a32b-4layer", "nvidia", 16, None, {"train.tp": 16, "train.cp": 1}),
}  # fmt: skip


def _violated(case, platform, n, mode, sets):
    spec = model_spec(case)
    return {
        rule for rule, _, _ in violations(plan_topology(spec, platform, n, mode, sets, validate=False), spec)
    }


def test_every_rule_has_a_trip_case():
    assert {r.id for r in RULES} == set(TRIPS)


@pytest.mark.parametrize("rule", sorted(TRIPS))
def test_rule_trips(rule):
    assert rule in _violated(*TRIPS[rule])


@pytest.mark.parametrize("rule", sorted(TRIPS))
def test_rule_passes(rule):
    assert rule not in _violated(*PASSES.get(rule, (GLM5, "nvidia", 8, None, {})))


def test_error_names_rule_values_and_fix():
    with pytest.raises(TopologyError) as err:
        plan_topology(model_spec(GLM5), "rocm", 8, "async", {"rollout.dp": 4})
    assert err.value.rule == "sglang.dp_divides_engine_gpus"
    assert "rollout.dp=4" in str(err.value) and "gpus_per_engine=2" in str(err.value)
    assert err.value.fix.startswith("Adjust rollout.dp")


def test_all_failures_reported_together():
    with pytest.raises(TopologyError) as err:
        plan_topology(model_spec(GLM5), "nvidia", 8, None, {"train.ep": 3})
    assert [v[0] for v in err.value.violations] == ["megatron.ep_divides_experts", "megatron.world_etp_ep_pp"]


@pytest.mark.parametrize("bad", [0, -8, "x", "", "2.5"])
def test_num_gpus_must_be_positive_integer(bad):
    with pytest.raises(ValueError, match=r"num_gpus=.* must be a positive integer"):
        plan_topology(model_spec(GLM5), "nvidia", bad)


def test_seed_004_nvidia_grid():
    t = plan_topology(model_spec(GLM5), "nvidia", 8, target="miles-0.0.2")
    assert (t.mode, t.train.tp, t.train.sp, t.train.pp, t.train.cp, t.train.ep, t.train.etp) == (
        "colocate", 4, True, 1, 2, 8, 1)  # fmt: skip
    assert (t.rollout.engines, t.rollout.gpus_per_engine, t.rollout.dp, t.rollout.ep) == (1, 8, 8, 8)
    assert (t.actor_gpus, t.rollout_gpus, t.ray_num_gpus) == (8, 8, 8)


def test_miles_main_nvidia_grid_is_its_launchers():
    """scripts/run_glm5_744b_a40b.py on one node: TP4+SP, PP1, CP1, EP = the node's GPUs; its 2-GPU test: TP2."""
    t = plan_topology(model_spec(GLM5), "nvidia", 8)
    assert (t.target.name, t.train.tp, t.train.sp, t.train.pp, t.train.cp, t.train.ep) == (
        "miles-2026-08-21", 4, True, 1, 1, 8)  # fmt: skip
    t2 = plan_topology(model_spec(GLM5), "nvidia", 2)
    assert (t2.train.tp, t2.train.cp, t2.train.ep) == (2, 1, 2)


def test_seed_004_rocm_grid_and_review_case():
    t = plan_topology(model_spec(GLM5), "rocm", 8)
    assert t.mode == "async"
    assert (t.train.tp, t.train.pp, t.train.cp, t.train.ep, t.train.etp, t.train.dp) == (1, 1, 1, 4, 1, 4)
    assert (t.rollout.engines, t.rollout.gpus_per_engine, t.rollout.tp, t.rollout.dp, t.rollout.ep) == (
        2,
        2,
        2,
        2,
        2,
    )
    assert t.rollout.dp_attention
    assert (t.actor_gpus, t.rollout_gpus, t.ray_num_gpus, t.visible_devices) == (4, 4, 8, tuple(range(8)))


def test_seed_000_flash_32_gpus():
    t = plan_topology(model_spec("glm5.3-flash"), "nvidia", 32)
    assert (t.train.tp, t.train.pp, t.train.ep, t.train.cp, t.train.sp) == (8, 4, 8, 1, True)
    assert t.train.pp_layers == (11, 11, 11, 12)
    assert (t.rollout.gpus_per_engine, t.rollout.tp, t.rollout.ep, t.num_nodes) == (8, 8, 8, 4)


@pytest.mark.parametrize(
    "n, grid",
    [(64, (8, 4, 2, 16, 1)), (32, (4, 1, 1, 4, 1)), (16, (4, 1, 1, 4, 1))],
)
def test_seed_003_glm45_rows(n, grid):
    t = plan_topology(model_spec("glm4.5-355b-a32b"), "nvidia", n)
    assert (t.train.tp, t.train.pp, t.train.cp, t.train.ep, t.train.etp) == grid


def test_seed_003_glm45_rollout_engines():
    t = plan_topology(model_spec("glm4.5-355b-a32b"), "nvidia", 64)
    assert (t.rollout.gpus_per_engine, t.rollout.dp, t.rollout.ep, t.rollout.dp_attention) == (
        32,
        4,
        32,
        True,
    )


DEFAULT_GRID = [
    (case, platform, n)
    for case in ("glm5-744b-a40b-4layer", "glm5.3-flash-4layer", "glm4.5-355b-a32b-4layer",
                 "glm5-744b-a40b", "glm5.3-flash", "glm4.5-355b-a32b")
    for platform in ("nvidia", "rocm")
    for n in (1, 2, 4, 8, 16, 32, 64)
    if not (platform == "rocm" and n == 1)  # async needs a GPU on each side: async.parts_positive
]  # fmt: skip


@pytest.mark.parametrize("case, platform, n", DEFAULT_GRID)
def test_defaults_are_valid_for_every_power_of_two(case, platform, n):
    t = plan_topology(model_spec(case), platform, n)
    assert t.actor_gpus == t.train.tp * t.train.cp * t.train.pp * t.train.dp


def test_derived_unless_set():
    t = plan_topology(model_spec(GLM5), "nvidia", 8, None, {"train.tp": 1})
    assert (t.train.sp, t.train.dp) == (False, 8)  # SP and DP follow the new TP (CP 1)


def test_split_layers():
    assert split_layers(45, 4) == (11, 11, 11, 12)
    assert split_layers(4, 1) == (4,)
    assert split_layers(92, 4) == (23, 23, 23, 23)
    assert min(split_layers(4, 8)) == 0  # an empty stage: the pp rule rejects it


@pytest.mark.parametrize("case", ["glm5-744b-a40b-4layer", "glm5.3-flash", "glm4.5-355b-a32b", "glm4.5-air"])
def test_every_gpu_count_of_a_node_derives_engines_sglang_can_build(case):
    """NUM_GPUS 1-8 and 16 on NVIDIA plan without an override: each engine takes the most GPUs (up to the
    family's) that SGLang can shard the model over. Before, 3, 5, 6 and 7 GPUs gave engines of EP 3-7
    over 256 experts, which SGLang refuses only once it builds the model."""
    spec = model_spec(case)
    for n in (*range(1, 9), 16):
        topo = plan_topology(spec, "nvidia", n)
        assert violations(topo, spec) == []
        assert topo.rollout.engines * topo.rollout.gpus_per_engine == topo.rollout_gpus


def test_six_gpus_of_glm5_are_three_engines_of_two():
    topo = plan_topology(model_spec(GLM5), "nvidia", 6)
    assert (topo.rollout.engines, topo.rollout.gpus_per_engine, topo.rollout.dp, topo.rollout.ep) == (
        3,
        2,
        2,
        2,
    )
    # the twin: engines of all six GPUs, as the family's size alone would give, are refused by name
    with pytest.raises(TopologyError) as err:
        plan_topology(model_spec(GLM5), "nvidia", 6, None, {"rollout.gpus_per_engine": 6})
    assert err.value.rule == "sglang.ep_divides_experts" and "rollout.gpus_per_engine=" in err.value.fix


def test_a_set_engine_size_takes_its_dp_and_ep_with_it():
    """Derived unless set: engines set to 4 GPUs get dp 4 and ep 4, not the 8 the defaults would have."""
    topo = plan_topology(model_spec(GLM5), "nvidia", 8, None, {"rollout.gpus_per_engine": 4})
    assert (topo.rollout.engines, topo.rollout.dp, topo.rollout.ep) == (2, 4, 4)
