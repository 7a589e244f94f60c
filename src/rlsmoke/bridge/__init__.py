"""The HF <-> Megatron bridge: name tables (`tables`, no torch) and the moving functions (`convert`)."""
