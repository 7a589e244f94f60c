"""Imported first by the rank processes' fork server, before torch: asking NVML, not the CUDA driver, for
the device count keeps the server fork-safe. Each rank gets its driver's environment back."""

import os

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # torch: device counts through NVML
