"""HF configs from specs. Imports transformers, so it is kept out of the plan path."""

from __future__ import annotations

from rlsmoke.models.base import ModelSpec


def hf_config(spec: ModelSpec):
    """Build the transformers config through constructor kwargs (derived fields stay consistent)."""
    from transformers import AutoConfig

    text = spec.hf_text_kwargs()
    if spec.hf_model_type != "glm5_next":
        return AutoConfig.for_model(spec.hf_model_type, architectures=[spec.hf_architecture], **text)
    # Composite multimodal config: the text tower is what rlsmoke trains.
    text.pop("first_k_dense_replace")
    text["mlp_layer_types"] = ["dense"] * spec.first_k_dense + ["sparse"] * spec.num_moe_layers
    return AutoConfig.for_model(
        "glm5_next", text_config=text, architectures=[spec.hf_architecture], **dict(spec.hf_outer)
    )
