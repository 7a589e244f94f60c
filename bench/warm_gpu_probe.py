"""Which of the warm server's imports initializes the GPU driver (a fork's child then cannot use CUDA).

Imports `launch.warm.PRELOAD` less what `engine.procs.preloadable` leaves to the runs, in order, as the
server does, then what it leaves to them, and writes after each whether the driver is initialized,
with the stack of every call that reaches torch's device count or lazy init.
    python3 bench/warm_gpu_probe.py OUT_FILE
"""

import importlib
import sys
import time
import traceback

out = open(sys.argv[1], "w", buffering=1)  # noqa: SIM115 - line by line: a cut run keeps what it found

import torch  # noqa: E402

from rlsmoke.engine.procs import ASK_THE_DEVICE_WITH_FLA, gpu_driver_initialized, preloadable  # noqa: E402


def spy(name, fn):
    def called(*args, **kwargs):
        out.write(f"--- {name} called from:\n{''.join(traceback.format_stack(limit=30)[:-1])}\n")
        return fn(*args, **kwargs)

    return called


out.write(f"import torch: driver initialized {gpu_driver_initialized()}\n")
for name in ("_cuda_getDeviceCount", "_cuda_init"):
    if hasattr(torch._C, name):
        setattr(torch._C, name, spy(name, getattr(torch._C, name)))
torch.cuda._lazy_init = spy("torch.cuda._lazy_init", torch.cuda._lazy_init)

from rlsmoke.launch import warm  # noqa: E402

# what the server imports, then what it leaves to the runs where fla is installed
for module in (*preloadable(warm.PRELOAD), *ASK_THE_DEVICE_WITH_FLA):
    t0 = time.perf_counter()
    try:
        importlib.import_module(module)
    except ImportError as exc:
        out.write(f"{module}: not installed ({exc})\n")
        continue
    out.write(f"{module}: {time.perf_counter() - t0:.1f} s, driver initialized {gpu_driver_initialized()}\n")
warm._build_load_tables()
out.write(f"load tables: driver initialized {gpu_driver_initialized()}\n")
