"""The Miles launcher's flow as steps, the way Miles' own CI test runs a model: prepare the HF checkpoint,
convert it to torch_dist with the user's Miles tool (skipped once the tracker reads `release`, written
last), start Ray's head, submit the job with `MILES_CI_GATE_RECORD_DIR` set; `processes.miles_flow` runs
them. No torch here.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rlsmoke.checkpoints.dialects import DIALECTS
from rlsmoke.errors import RlsmokeError
from rlsmoke.launch.miles import Paths
from rlsmoke.metrics import CI_HISTORY

RECORD_DIR_VAR = "MILES_CI_GATE_RECORD_DIR"  # Miles' CiHistoryBackend writes only when this is set
TRACKER = "latest_checkpointed_iteration.txt"
RELEASE = "release"  # what the converter writes into TRACKER once every shard is saved
CONVERT_TOOL = "tools/convert_hf_to_torch_dist.py"
SMALL_MODEL_LAYERS = 4  # Miles converts models of <= 4 layers on one node, at most 4 ranks, no parallelism
SMALL_MODEL_RANKS = 4


@dataclass(frozen=True)
class Step:
    name: str  # prepare | convert | ray-head | submit
    what: str
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)  # on top of the launch's env
    skip_when: str = ""  # a shell test: the step is skipped where it holds

    def shell(self) -> str:
        return "".join(f"{k}={shlex.quote(v)} " for k, v in self.env.items()) + shlex.join(self.command)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def convert_step(plan, paths: Paths, extra: tuple[str, ...] = ()) -> Step:
    """Miles' `_prepare_megatron_ckpt`: <= 4 layers on min(4, node GPUs) ranks, larger on a node's GPUs."""
    hf, dst = plan.launch.hf_checkpoint, plan.launch.ref_load
    ranks = plan.topology.gpus_per_node
    parallel = ["--tensor-model-parallel-size", "1", "--expert-tensor-parallel-size", "1"]
    if plan.spec.num_layers <= SMALL_MODEL_LAYERS:
        ranks = min(SMALL_MODEL_RANKS, ranks)
        parallel += ["--pipeline-model-parallel-size", "1", "--expert-model-parallel-size", "1"]
    argv = ("torchrun", "--nproc-per-node", str(ranks), f"{paths.miles_root}/{CONVERT_TOOL}",
            *plan.spec.megatron_args(), "--hf-checkpoint", hf, "--save", dst, *parallel, *extra)  # fmt: skip
    return Step("convert", "HF -> torch_dist with Miles' converter", argv,
                {"PYTHONPATH": f"{paths.miles_root}:{paths.megatron_root}"},
                skip_when=f'[ "$(cat {shlex.quote(f"{dst}/{TRACKER}")} 2>/dev/null)" = {RELEASE} ]')  # fmt: skip


def checkpoint_dialect(plan) -> str | None:
    """GLM-5: the config dialect the target's Miles reads; None for a model of one dialect."""
    return plan.topology.target.checkpoint_dialect if plan.spec.hf_model_type in DIALECTS else None


def prepare_step(plan, what: str, *, tiny: bool = False) -> Step:
    """`rlsmoke prepare` into the launch's HF folder, unless it is there."""
    hf = plan.launch.hf_checkpoint
    argv = ("rlsmoke", "prepare", plan.case.name, "--out", hf, *(["--tiny"] if tiny else []))
    if dialect := checkpoint_dialect(plan):
        argv += ("--dialect", dialect)
    return Step("prepare", what, argv, skip_when=f"[ -e {shlex.quote(hf)} ]")


def steps(plan, paths: Paths, *, record_dir: str = "", env: Mapping[str, str] | None = None) -> list[Step]:
    """Every command of the flow, in order. Miles records to `record_dir` (default
    `<output_dir>/<case>/ci_history`); `env` (a run's lease) joins the launch's in the job's environment."""
    launch = plan.launch
    submit_env = {
        **(env or {}),
        RECORD_DIR_VAR: record_dir or f"{paths.output_dir}/{plan.case.name}/{CI_HISTORY}",
    }
    submit = tuple(launch.job_submit(json.dumps({"env_vars": {**launch.env, **submit_env}})))
    return [
        prepare_step(plan, "the HF checkpoint, full width"),
        convert_step(plan, paths),
        Step("ray-head", "Ray's head with the plan's GPUs", tuple(launch.ray_start())),
        Step("submit", "the job: one GRPO step under Miles", submit, submit_env),
    ]


def torch_dist_done(dst: Path) -> bool:
    """Converted; nothing yet; or files without a `release` tracker: half-done, refused."""
    if (tracker := dst / TRACKER).is_file() and tracker.read_text().strip() == RELEASE:
        return True
    if dst.is_dir() and any(dst.iterdir()):
        got = f"reads {tracker.read_text().strip()[:20]!r}" if tracker.is_file() else "is missing"
        raise RlsmokeError(f"torch_dist={dst} has files but its {TRACKER} {got}: a conversion that did not finish",
                           rule="miles.torch_dist", fix=f"remove {dst} and run again: the flow converts it anew")  # fmt: skip
    return False


def check(plan) -> None:
    """No HF checkpoint, or a half-written torch_dist folder, is refused before anything starts."""
    hf = plan.launch.hf_checkpoint
    if not Path(hf).is_dir():
        raise RlsmokeError(f"hf_checkpoint={hf} does not exist: Miles converts and loads it", rule="checkpoint.missing",
                           fix=f"prepare it with `rlsmoke prepare {plan.case.name} --out {hf}`, or pass --model-dir "
                           "with the folder that holds it")  # fmt: skip
    torch_dist_done(Path(plan.launch.ref_load))
