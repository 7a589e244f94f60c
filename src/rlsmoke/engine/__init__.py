"""The built-in engine: one GRPO step on real libraries; torch is imported by the modules that need it."""
