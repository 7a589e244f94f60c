"""Where an `rlsmoke run` process spends its seconds before the engine's clock starts, step by step, in
one fresh interpreter: the GPU query, the flags' checks of each suite case, and each import the engine
makes (torch, CUDA's context, transformers, the cases' modeling code, fla).

    python bench/process_profile.py [--platform nvidia] [CASE ...]

Each line is `seconds  step`; steps run in the order a `rlsmoke run` takes them, so an import already
paid by an earlier step shows as near zero.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import time

SUITE_CASES = ["glm5-744b-a40b-4layer-1gpu", "glm4.5-355b-a32b-4layer", "glm5.3-flash-4layer-1gpu"]


def timed(label: str, call) -> None:
    start = time.perf_counter()
    try:
        call()
        note = ""
    except Exception as exc:  # noqa: BLE001 - a profile reports what failed and goes on
        note = f"  ({type(exc).__name__}: {str(exc).splitlines()[0][:100]})"
    print(f"{time.perf_counter() - start:8.3f}  {label}{note}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--platform", default="nvidia")
    parser.add_argument("cases", nargs="*", default=SUITE_CASES)
    args = parser.parse_args()
    timed(
        "nvidia-smi --query-gpu=name",
        lambda: subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, check=False
        ),
    )
    timed("import rlsmoke.cli", lambda: importlib.import_module("rlsmoke.cli"))
    from rlsmoke import run_command as engine_cli
    from rlsmoke import run_flags

    parser_run = argparse.ArgumentParser()
    engine_cli.register(parser_run.add_subparsers())
    for case in args.cases:
        argv = ["run", case, "--platform", args.platform, "--num-gpus", "1", "--records-only"]
        timed(
            f"config_from_args {case}",
            lambda argv=argv: run_flags.config_from_args(parser_run.parse_args(argv)),
        )
    timed("import torch", lambda: importlib.import_module("torch"))
    import torch

    timed("torch.cuda.is_available", torch.cuda.is_available)
    timed(
        "CUDA context (a 1-element tensor)",
        lambda: torch.zeros(1, device="cuda") if torch.cuda.is_available() else None,
    )
    timed("import transformers", lambda: importlib.import_module("transformers"))
    timed("import rlsmoke.engine.run", lambda: importlib.import_module("rlsmoke.engine.run"))
    # tokenization_auto took 5.4 s on an H200 host (0.26 s on a 2-core CPU machine): what it pulls in first
    for module in (
        "tokenizers",
        "jinja2",
        "transformers.tokenization_utils_base",
        "transformers.models.auto.configuration_auto",
        "transformers.models.auto.modeling_auto",
    ):
        timed(f"import {module}", lambda module=module: importlib.import_module(module))
    timed("tokenization_auto", lambda: importlib.import_module("transformers.models.auto.tokenization_auto"))
    timed(
        "import fla", lambda: importlib.import_module("fla")
    )  # ahead of Flash's modeling module, which imports it
    from rlsmoke.cases import Case

    for case in args.cases:
        kind = Case(case, platform=args.platform, num_gpus=1).spec().hf_model_type
        timed(
            f"modeling_{kind}",
            lambda kind=kind: importlib.import_module(f"transformers.models.{kind}.modeling_{kind}"),
        )
    timed("import fla.ops.kda", lambda: importlib.import_module("fla.ops.kda"))
    timed("import megatron.core.models.gpt", lambda: importlib.import_module("megatron.core.models.gpt"))
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
