"""Import-only stand-in for sgl_kernel (SGLang's CUDA kernels, 383 MB): sglang's modules import it at their
top on a CUDA host; no SGLang engine runs in the train-only step."""

from rlsmoke_standin import standin_package

standin_package(__name__)
