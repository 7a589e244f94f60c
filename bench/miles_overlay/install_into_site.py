"""Completes the sglang and sglang-router installs of a Miles site for the train-only step's imports.

    python3 bench/miles_overlay/install_into_site.py SITE

- sglang_router's Rust extension (92 MB) is left out of the site; its stand-in module gives an empty tool-call
  parser list, which sglang_router's argparse setup asks for while Miles' parser is built, and stand-ins for
  the rest (the router itself never starts).
- Three names of the sglang-miles fork that the registry's sglang 0.5.16 lacks, which Miles' p2p weight
  push imports at its top: ParallelismContext, RankParallelismConfig, ParameterMapper.
Each added name is an import-only stand-in (rlsmoke_standin); the files say so in their first line."""

import sys
from pathlib import Path

MARK = "# rlsmoke: import-only stand-ins for the train-only step (bench/miles_overlay)"

ROUTER_RS = f"""{MARK}
from rlsmoke_standin import StandIn


def get_available_tool_call_parsers():
    return []  # read while argparse is set up; the router does not start


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return StandIn(f"sglang_router.sglang_router_rs.{{name}}")
"""

FORK_NAMES = f"""

{MARK}
from rlsmoke_standin import StandIn as _StandIn

ParallelismContext = _StandIn("sglang.srt.distributed.parallel_state.ParallelismContext")
RankParallelismConfig = _StandIn("sglang.srt.distributed.parallel_state.RankParallelismConfig")
"""

PARAMETER_MAPPER = f"""{MARK}
from rlsmoke_standin import StandIn

ParameterMapper = StandIn("sglang.srt.model_loader.parameter_mapper.ParameterMapper")
"""


def install(site: Path) -> None:
    router = site / "sglang_router"
    if any(router.glob("sglang_router_rs*.so")):
        sys.exit(
            f"error: [overlay.real] {router} has the real Rust extension. Fix: remove it, or skip this step"
        )
    (router / "sglang_router_rs.py").write_text(ROUTER_RS)
    state = site / "sglang/srt/distributed/parallel_state.py"
    text = state.read_text()
    if "ParallelismContext" in text and MARK not in text:
        sys.exit(
            f"error: [overlay.real] {state} defines ParallelismContext. Fix: this is the fork; skip this step"
        )
    if MARK not in text:
        state.write_text(text + FORK_NAMES)
    mapper = site / "sglang/srt/model_loader/parameter_mapper.py"
    if mapper.exists() and MARK not in mapper.read_text():
        sys.exit(f"error: [overlay.real] {mapper} exists. Fix: this is the fork; skip this step")
    mapper.write_text(PARAMETER_MAPPER)


if __name__ == "__main__":
    install(Path(sys.argv[1]))
    print(f"overlay: stand-ins written into {sys.argv[1]}")
