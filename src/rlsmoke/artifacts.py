"""Where records go: a test's artifacts folder as the plugin hands it to a test, and the --out folder
of one run (`RunFolder`: held by a lock, each record written whole)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlsmoke.errors import RlsmokeError
from rlsmoke.paths import check_name
from rlsmoke.platforms import Host


@dataclass
class Artifacts:
    """A test's artifacts folder plus the session's launch choices. `os.fspath()` gives the folder."""

    path: Path
    launcher: str = "builtin"
    trainer: str = "fsdp"  # --trainer: the built-in engine's trainer (fsdp: HF modeling code; megatron)
    host: Host = Host("cpu", "CPU", 0)
    num_gpus: int | None = None  # --num-gpus / NUM_GPUS when given: replaces the module's NUM_GPUS
    miles_root: Path | None = None
    model_dir: Path | None = None
    lease: object | None = None  # processes.lease.GpuLease
    ports: object | None = None  # processes.lease.PortLease
    timeout: float | None = None
    update_golden: bool = False
    history: Path | None = None
    trusted: bool = False
    history_shadow: bool = False  # report the band (a warning, the summary) but never fail on it: PR runs
    commit: str = "unknown"
    record_property: Callable[[str, object], None] = field(default=lambda k, v: None, repr=False)

    def __fspath__(self) -> str:
        return str(self.path)

    def __truediv__(self, other) -> Path:
        return self.path / other


# --- a run's records ---------------------------------------------------------------------------

RECORDS = ("run.log", "metrics.jsonl", "summary.json")  # what a run writes into --out
LOCK_NAME = ".rlsmoke.lock"
STAGING_NAME = ".rlsmoke-new"  # an --overwrite run's records, inside --out until the run is complete
_PROBE = ".rlsmoke-write-probe"
_RECORD_NAME = re.compile(
    r"^(run\.log|metrics\.jsonl|summary\.json|\.(run\.log|metrics\.jsonl|summary\.json)\.\d+\.tmp"
    r"|\.rlsmoke-write-probe)$"
)


def no_room(exc: BaseException) -> bool:
    """Whether `exc` (or what it was raised from) says the disk had no room for a write: a full disk, a quota,
    a file-size limit. Each is the --out's, so bad input (exit 2)."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def disk_full(path: Path, exc: OSError | None = None) -> RlsmokeError:
    why = f" ({os.strerror(exc.errno)})" if isinstance(exc, OSError) and exc.errno else ""
    return RlsmokeError(f"no room to write the run's records in {path}{why}", rule="disk.full",
                        fix="free space on that disk, or pass --out on another")  # fmt: skip


def write_atomic(path: Path, text: str) -> None:
    """`path` holds `text` whole, or is as it was; the temporary file goes on any failure."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def try_lock(path: Path, flags: int = os.O_RDWR | os.O_CREAT) -> int | None:
    """An fd that holds `path`'s exclusive flock, or None while another process holds it."""
    fd = os.open(path, flags, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def default_out(case: str, runs: Path = Path("rlsmoke-runs")) -> Path:
    """A new folder per run, so that no run replaces an earlier one: rlsmoke-runs/CASE/YYYYmmdd-HHMMSS."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out, n = runs / case / stamp, 1
    while out.exists():
        n += 1
        out = runs / case / f"{stamp}-{n}"
    return out


class RunLog:
    """A run's run.log, a line at a time, each stamped with the seconds since `started` (perf_counter)."""

    def __init__(self, path: Path, started: float):
        self.path, self.started = path, started

    def __call__(self, text: str, *, block: str = "") -> None:
        stamp = f"[{time.perf_counter() - self.started:7.2f}s]"
        with self.path.open("a") as f:
            f.write(f"{stamp} {text}\n" + (block + "\n" if block else ""))


def earlier_records(out: Path, *, overwrite: bool) -> list[str]:
    """The records an earlier run left in `out`; `run.out_used` unless `overwrite` lets a run replace them."""
    if (earlier := [name for name in RECORDS if (Path(out) / name).exists()]) and not overwrite:
        raise RlsmokeError(f"--out {out} holds an earlier run's records ({', '.join(earlier)})",
                           rule="run.out_used", fix="pass a new --out, or --overwrite to replace them")  # fmt: skip
    return earlier


class RunFolder:
    """The --out of one run, held by a flock (`run.out_locked` for a second run). With `overwrite` the new
    records are staged in `DIR/.rlsmoke-new` and replace the earlier ones only at `commit`; inside DIR, so
    a rename reaches it even when DIR is a mount point."""

    def __init__(self, out: Path, *, overwrite: bool = False):
        self.out, self.overwrite = Path(out), overwrite
        self.staging = self.out / STAGING_NAME
        self.records = self.out  # where this run writes: the folder itself, or the staging sibling
        self._lock: int | None = None

    def __enter__(self) -> RunFolder:
        out = self.out
        fix = "pass --out a new or existing folder (default: a new ./rlsmoke-runs/CASE/TIME)"
        check_name(out, "--out")
        if out.exists() and not out.is_dir():
            raise RlsmokeError(f"--out {out} is a file, not a folder", rule="run.out", fix=fix)
        try:
            out.mkdir(parents=True, exist_ok=True)
            self._hold()
            if earlier_records(out, overwrite=self.overwrite):
                self._clear_staging()  # an earlier --overwrite's that did not finish
                self.staging.mkdir()
                self.records = self.staging
            probe = self.records / _PROBE
            probe.touch()
            probe.unlink()
        except OSError as exc:
            self.release()
            if no_room(exc):
                raise disk_full(out, exc) from None
            raise RlsmokeError(f"--out {out} cannot be written ({exc.strerror or exc})", rule="run.out",
                               fix="pass --out a folder you can write (default: a new ./rlsmoke-runs/CASE/TIME)") from None  # fmt: skip
        except BaseException:
            self.release()
            raise
        return self

    def _clear_staging(self) -> None:
        """An earlier --overwrite's staged records go; anything else there is not ours to delete."""
        if not self.staging.exists():
            return
        # a record, a record's temporary file (write_atomic's), or the write probe is ours
        foreign = [
            p.name
            for p in self.staging.iterdir()
            if not (p.is_file() and not p.is_symlink() and _RECORD_NAME.match(p.name))
        ]
        if foreign:  # __enter__ releases the lock
            raise RlsmokeError(f"--out {self.out} holds {STAGING_NAME}/ with files rlsmoke did not write "
                               f"({', '.join(sorted(foreign)[:3])})", rule="run.not_ours",
                               fix=f"move {self.staging} away, then run again")  # fmt: skip
        shutil.rmtree(self.staging)

    def _hold(self) -> None:
        """The folder's lock, or `run.out_locked` at once; the lock is checked to be the file's still."""
        path = self.out / LOCK_NAME
        while True:
            if (fd := try_lock(path)) is None:
                raise RlsmokeError(f"--out {self.out} is in use by another run", rule="run.out_locked",
                                   fix="wait for it to finish, or pass another --out")  # fmt: skip
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.write(fd, f"{os.getpid()}\n".encode())
                self._lock = fd
                return
            os.close(fd)

    def commit(self) -> None:
        """The staged records replace the earlier ones, then the staging folder goes."""
        if self.records == self.out:
            return
        summary = self.staging / "summary.json"
        if summary.is_file():  # the records name the folder they end up in
            doc = json.loads(summary.read_text())
            if doc.get("artifacts") == str(self.staging):
                write_atomic(summary, json.dumps(doc | {"artifacts": str(self.out)}, indent=2) + "\n")
        new = {name for name in RECORDS if (self.staging / name).exists()}
        interrupted = None
        while True:  # an interrupt (Ctrl-C, SIGTERM) waits until every record is moved: no two runs' mixed
            try:
                self._move(new)
                break
            except KeyboardInterrupt as exc:
                interrupted = exc
            except OSError as exc:
                raise (disk_full(self.out, exc) if no_room(exc) else exc) from None
        if interrupted is not None:
            raise interrupted
        shutil.rmtree(self.staging, ignore_errors=True)
        self.records = self.out

    def _move(self, new: set[str]) -> None:
        """Each new record over the earlier one; what a first try moved, a second finds moved."""
        for name in RECORDS:
            if name not in new:
                with contextlib.suppress(FileNotFoundError):
                    (self.out / name).unlink()
            elif (self.staging / name).exists():
                os.replace(self.staging / name, self.out / name)

    def discard(self) -> None:
        """An --overwrite run that did not complete: its staged records go, the earlier ones stay."""
        if self.records != self.out:
            shutil.rmtree(self.staging, ignore_errors=True)

    def release(self) -> None:
        if self._lock is not None:
            with contextlib.suppress(OSError):
                (self.out / LOCK_NAME).unlink()
            os.close(self._lock)
            self._lock = None

    def __exit__(self, *exc) -> None:
        self.release()
