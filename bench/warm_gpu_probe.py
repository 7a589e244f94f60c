"""Which of the warm server's imports initializes the GPU driver (a fork's child then cannot use CUDA).

Runs the server's own preload (`launch.warm._preload`: its imports, with device counts through NVML),
then imports what it leaves to the runs, and writes after each whether the driver is initialized and
how many threads the process has (a fork copies one), with the stack of every call that reaches
torch's device count or lazy init.
    python3 bench/warm_gpu_probe.py OUT_FILE
"""

import sys
import traceback

out = open(sys.argv[1], "w", buffering=1)  # noqa: SIM115 - line by line: a cut run keeps what it found

import torch  # noqa: E402

from rlsmoke.engine.procs import ASK_THE_DEVICE_WITH_FLA, gpu_driver_initialized  # noqa: E402


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


def threads() -> str:
    with open("/proc/self/status") as status:
        return next(line.split()[1] for line in status if line.startswith("Threads:"))


def report(module, seconds, missing):
    if missing is not None:
        out.write(f"{module}: not installed ({missing})\n")
    else:
        out.write(f"{module}: {seconds:.1f} s, driver initialized {gpu_driver_initialized()}, threads {threads()}\n")


warm._preload(report)  # what the server imports, as it imports them
out.write(f"load tables: driver initialized {gpu_driver_initialized()}, threads {threads()}\n")
warm.import_each(ASK_THE_DEVICE_WITH_FLA, report)  # what it leaves to the runs where fla is installed
