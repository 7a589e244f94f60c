"""Imported first by the rank processes' fork server (`rlsmoke.engine.procs`), before torch.

torch asks the CUDA driver for the device count when a module checks `torch.cuda.is_available()`,
and a process forked after that cannot use CUDA. Asking NVML instead leaves the server fork-safe.
Each rank gets its driver's environment back before it runs, so this setting stays in the server.
"""

import os

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # torch: device counts through NVML
