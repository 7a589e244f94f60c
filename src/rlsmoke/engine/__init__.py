"""The built-in engine: one GRPO step on real libraries; torch is imported by the modules that need it."""

from rlsmoke.checkpoints.cache_paths import keep_compiled_kernels

# Before torch's compiler is imported: importing torch._inductor.config (megatron-core and transformers' GLM
# modeling do) fixes TORCHINDUCTOR_CACHE_DIR to a folder under /tmp, which a later choice cannot move.
keep_compiled_kernels()
