"""Model specs against transformers' own config classes and models.md's Megatron args."""

import pytest

from rlsmoke.models import MODEL_NAMES, model_spec
from rlsmoke.models.base import ModelSpec
from rlsmoke.models.hf import hf_config

# Read by the modeling code through getattr() with a fallback, so not a declared config field.
MODELING_GETATTR_FIELDS = {"glm4_moe": {"head_dim"}}


def unknown_fields(spec: ModelSpec) -> list[str]:
    """Kwargs of the spec that transformers' own config class does not define."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(spec.hf_model_type)
    if spec.hf_model_type == "glm5_next":
        known = set(default.text_config.to_dict())
        known.discard("mlp_layer_types")
        return sorted(k for k in spec.hf_text_kwargs() if k not in known and k != "first_k_dense_replace")
    known = set(default.to_dict()) | MODELING_GETATTR_FIELDS.get(spec.hf_model_type, set())
    return sorted(k for k in spec.hf_text_kwargs() if k not in known)


@pytest.mark.parametrize("tiny", [False, True], ids=["full", "tiny"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_hf_config_fields_exist_in_transformers(name, tiny):
    spec = model_spec(name, tiny=tiny)
    assert unknown_fields(spec) == []
    cfg = hf_config(spec)
    text = getattr(cfg, "text_config", cfg)
    assert text.num_hidden_layers == spec.num_layers
    assert text.hidden_size == spec.hidden_size and text.n_routed_experts == spec.num_experts
    if hasattr(text, "mlp_layer_types"):
        assert list(text.mlp_layer_types) == ["dense"] * spec.first_k_dense + ["sparse"] * spec.num_moe_layers
    else:  # glm4_moe marks dense layers by count only
        assert text.first_k_dense_replace == spec.first_k_dense


def test_unknown_field_is_caught():
    spec = model_spec("glm5-744b-a40b-4layer")
    bad = spec.replace(hf_extra={**spec.hf_extra, "q_lora_rnak": 2048})
    assert unknown_fields(bad) == ["q_lora_rnak"]


def test_glm5_full_shape_and_size():
    spec = model_spec("glm5-744b-a40b")
    assert (spec.num_layers, spec.first_k_dense, spec.num_experts, spec.vocab_size) == (78, 3, 256, 154880)
    assert 735e9 < spec.parameter_count() < 755e9  # "744B"
    four = model_spec("glm5-744b-a40b-4layer")
    assert 12.5e9 < four.parameter_count() < 13.5e9  # models.md: about 13 B


def test_glm5_megatron_args_match_models_md():
    args = " ".join(model_spec("glm5-744b-a40b-4layer").megatron_args())
    for expected in (
        "--moe-layer-freq [0]*3+[1]*1", "--num-experts 256 --moe-router-topk 8 --moe-ffn-hidden-size 2048 "
        "--moe-shared-expert-intermediate-size 2048", "--moe-router-topk-scaling-factor 2.5",
        "--num-layers 4 --hidden-size 6144 --ffn-hidden-size 12288 --num-attention-heads 64",
        "--q-lora-rank 2048 --kv-lora-rank 512", "--qk-head-dim 192 --v-head-dim 256 --kv-channels 192 "
        "--qk-pos-emb-head-dim 64", "--vocab-size 154880 --rotary-base 1000000 --enable-experimental",
    ):  # fmt: skip
        assert expected in args


def test_glm45_megatron_args():
    args = " ".join(model_spec("glm4.5-355b-a32b").megatron_args())
    assert "--num-attention-heads 96 --num-query-groups 8 --kv-channels 128 --num-layers 92" in args
    assert "--moe-layer-freq [0]*3+[1]*89" in args and "--num-experts 160" in args
    assert "--rotary-percent 0.5" in args and "--add-qkv-bias" in args


@pytest.mark.parametrize("name", ["glm5-744b-a40b-4layer", "glm5.3-flash-4layer", "glm4.5-355b-a32b-4layer"])
def test_4layer_is_3_dense_1_moe_at_full_width(name):
    full = model_spec(name.removesuffix("-4layer"))
    four = model_spec(name)
    assert (four.num_layers, four.first_k_dense) == (4, 3)
    assert (four.hidden_size, four.num_experts) == (full.hidden_size, full.num_experts)


def test_tiny_keeps_the_layer_structure():
    tiny, full = model_spec("glm5-744b-a40b-4layer", tiny=True), model_spec("glm5-744b-a40b-4layer")
    assert (tiny.num_layers, tiny.first_k_dense, tiny.attention) == (
        full.num_layers,
        full.first_k_dense,
        "mla",
    )
    assert tiny.hidden_size < full.hidden_size and tiny.width == "tiny"


def test_1gpu_case_cuts_only_the_experts():
    one, four = model_spec("glm5-744b-a40b-4layer-1gpu"), model_spec("glm5-744b-a40b-4layer")
    assert one.num_experts == 64
    assert one.replace(num_experts=256, reduction=four.reduction, name=four.name) == four


def test_reduction_beyond_the_model_is_refused():
    from rlsmoke.models import reduce_layers

    with pytest.raises(ValueError, match="exceeds glm4.5-air") as err:
        reduce_layers(model_spec("glm4.5-air"), dense=3, moe=1)
    assert err.value.rule == "model.reduction"
