"""rlsmoke: one-step end-to-end tests for GRPO post-training of large MoE models."""

__version__ = "0.1.0"
