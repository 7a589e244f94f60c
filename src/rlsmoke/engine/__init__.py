"""The built-in engine: one GRPO step on real libraries (transformers, torch, optionally Ray).

Each module is one concept: rollout, reward, grpo, train, sync, placement, run. Importing this
package is light; torch is imported by the modules that need it.
"""
