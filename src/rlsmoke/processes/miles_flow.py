"""Miles' whole flow, run: convert (unless done), then Ray's head and the job (`ray job submit`).
The steps are rendered by `launch.flow`; this runs them."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from rlsmoke.errors import RunError
from rlsmoke.launch.flow import RECORD_DIR_VAR, RELEASE, TRACKER, convert_step, steps, torch_dist_done
from rlsmoke.launch.miles import Paths
from rlsmoke.metrics import CI_HISTORY
from rlsmoke.processes import preflight, runner


def convert(plan, paths: Paths, *, miles_root: Path, env: Mapping[str, str], artifacts: Path,
            timeout: float, extra: tuple[str, ...] = ()) -> runner.Result | None:  # fmt: skip
    """The convert step unless done (the tracker reads `release`); its Result when it ran and failed, else
    None. Logged in `artifacts/flow.log`, the converter's own output in `artifacts/convert.log`."""
    step = convert_step(plan, paths, extra)
    dst = Path(plan.launch.ref_load)
    with (artifacts / "flow.log").open("a", encoding="utf-8") as log:
        if torch_dist_done(dst):
            log.write(f"convert: skipped, {dst / TRACKER} reads {RELEASE}\n")
            return None
        log.write(f"convert: {step.shell()}\n")
    search = runner.path_before_callers(step.env["PYTHONPATH"])
    result = runner.run(step.command, env=runner.clean_env({**plan.launch.env, **env, "PYTHONPATH": search}),
                        cwd=miles_root, log=artifacts / "convert.log", timeout=timeout)  # fmt: skip
    if not result.ok:
        return result
    if not torch_dist_done(dst):
        raise RunError(f"the converter exited 0 but {dst / TRACKER} does not read {RELEASE}; see "
                       f"{result.log}", rule="miles.torch_dist")  # fmt: skip
    return None


def run(plan, paths: Paths, *, miles_root: Path, ports, env: Mapping[str, str], artifacts: Path,
        timeout: float) -> runner.Result:  # fmt: skip
    """The pre-flight, convert (unless done), then a Ray head of ours and the job under `miles_root`, `env`
    to every process; the first step that fails ends the flow and its Result is returned. The prepare
    step is the suite's (verified before this)."""
    started = time.monotonic()
    # the user's Miles parses the argv first: a refused flag costs seconds, not a conversion and a cluster
    preflight.check_flags(plan.launch, miles_root)
    failed = convert(plan, paths, miles_root=miles_root, env=env, artifacts=artifacts, timeout=timeout)
    if failed is not None:
        return failed
    *_, head, job = steps(plan, paths, record_dir=str(artifacts / CI_HISTORY), env=env)  # the plan's commands
    with (artifacts / "flow.log").open("a", encoding="utf-8") as log:
        log.write(f"submit: {RECORD_DIR_VAR}={job.env[RECORD_DIR_VAR]}\n")
    full_env = runner.clean_env({**plan.launch.env, **job.env, **runner.LOOPBACK_RAY})
    dashboard = ["--dashboard-host", "127.0.0.1", "--dashboard-port", str(ports.dashboard)]
    dashboard += ["--include-dashboard", "true", *_client_port(ports)]

    def submit() -> runner.Result:
        left = max(1.0, timeout - (time.monotonic() - started))
        argv = runner.job_submit_argv(job.command, ports.dashboard)
        return runner.run(argv, env=full_env, cwd=miles_root, log=artifacts / "run.log", timeout=left)

    left = max(1.0, timeout - (time.monotonic() - started))
    return runner.under_ray_head(head.command, ports, submit, env=full_env, cwd=miles_root,
                                 artifacts=artifacts, timeout=left, dashboard=dashboard)  # fmt: skip


def _client_port(ports) -> list[str]:
    """Ray starts a client server (default port 10001) only where `ray[client]` is installed; give it ours."""
    try:
        from ray._private.utils import get_ray_client_dependency_error
    except ImportError:
        return []
    if get_ray_client_dependency_error() is not None:
        return []
    return ["--ray-client-server-port", str(ports.client_server)]
