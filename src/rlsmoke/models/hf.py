"""HF configs from specs. Imports transformers, so it is kept out of the plan path."""

from __future__ import annotations

from rlsmoke.models.base import ModelSpec


def hf_config(spec: ModelSpec):
    """Build the transformers config through constructor kwargs (derived fields stay consistent)."""
    from transformers import AutoConfig

    text = spec.hf_text_kwargs()
    if spec.hf_model_type == "glm5_next":
        # Composite multimodal config: the text tower is what rlsmoke trains.
        text.pop("first_k_dense_replace")
        text["mlp_layer_types"] = ["dense"] * spec.first_k_dense + ["sparse"] * spec.num_moe_layers
        cfg = AutoConfig.for_model(
            "glm5_next", text_config=text, architectures=[spec.hf_architecture], **dict(spec.hf_outer)
        )
        return cfg
    return AutoConfig.for_model(spec.hf_model_type, architectures=[spec.hf_architecture], **text)


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
