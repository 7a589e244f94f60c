"""The Ray cluster of an async run: started so that it can be ended whole, at any moment.

`ray.init(address="local")` in the run's process installs Ray's SIGTERM handler while it starts, and an
interrupt midway left its agents running. So a child in a session of its own starts the cluster, the run
connects as a driver, and stopping kills every process of that session by pid.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlsmoke.engine import signals
from rlsmoke.errors import RunError
from rlsmoke.processes import runner

# The cluster's own process: dies with the run (parent-death signal), reports the GCS address, sleeps.
_HEAD = """
import json, sys, time
from rlsmoke.engine.signals import in_child
in_child(int(sys.argv[1]))
import ray
ray.init(**json.loads(sys.argv[2]))
print(json.dumps({"address": ray.get_runtime_context().gcs_address}), flush=True)
while True:
    time.sleep(3600)
"""


class LocalCluster:
    """A one-node Ray cluster on loopback, in its own session; `address` is what `ray.init` connects to."""

    def __init__(self, *, num_cpus: int, num_gpus: int, timeout: float = 120):
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rlsmoke-ray-"))
        self.proc: subprocess.Popen | None = None
        options = {"address": "local", "num_cpus": num_cpus, "num_gpus": num_gpus, "include_dashboard": False,
                   "_node_ip_address": "127.0.0.1", "_temp_dir": str(self.temp_dir), "log_to_driver": False,
                   "configure_logging": False}  # fmt: skip
        log = (self.temp_dir / "head.log").open("w")
        try:
            with signals.held():  # an interrupt now would leave a child that no one stops
                self.proc = subprocess.Popen(
                    [sys.executable, "-c", _HEAD, str(os.getpid()), json.dumps(options)],
                    stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
                    # the driver's mode (unset means disabled to a driver given an address)
                    env={**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")},
                )  # fmt: skip
            deadline = time.monotonic() + timeout
            line = ""
            while not line:  # the head prints one line once its cluster is up, or exits
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = (self.temp_dir / "head.log").read_text(errors="replace").strip().splitlines()[-5:]
                    raise RunError(f"the local Ray cluster did not start: {' | '.join(tail) or 'no output'}",
                                   rule="engine.ray_start")  # fmt: skip
                if select.select([self.proc.stdout], [], [], 0.2)[0]:
                    line = self.proc.stdout.readline()
            self.address = json.loads(line)["address"]
        except BaseException:
            self.stop()
            raise
        finally:
            log.close()

    def stop(self) -> None:
        """Kill every process of the cluster's session at once (Ray's drain is slow); remove its temp folder."""
        if self.proc is not None:
            # by session only: the run token this process inherited marks the whole run, not the cluster
            runner.stop_tree(self.proc, None, grace=0)
            self.proc.wait()
            self.proc.stdout.close()
            self.proc = None
        shutil.rmtree(self.temp_dir, ignore_errors=True)
