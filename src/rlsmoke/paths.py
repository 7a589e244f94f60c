"""The paths a user hands rlsmoke, checked where they are read: one `error: [path.*]` line each, with its
own rule id; `from_os_error` turns any OSError on a user's path into the same line."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from rlsmoke.errors import RlsmokeError

# errno -> (rule, what it means for the user): the OSError of a path the user chose is bad input.
_BY_ERRNO = {
    errno.ENAMETOOLONG: ("path.too_long", "has a name longer than the file system allows"),
    errno.ENOENT: ("path.missing", "does not exist"),
    errno.ENOTDIR: ("path.kind", "has a file where a folder is expected"),
    errno.EISDIR: ("path.kind", "is a folder where a file is expected"),
    errno.EEXIST: ("path.kind", "already exists"),
    errno.EACCES: ("path.denied", "cannot be accessed (permission denied)"),
    errno.EPERM: ("path.denied", "cannot be accessed (operation not permitted)"),
    errno.EROFS: ("path.read_only", "is on a read-only file system"),
    errno.ELOOP: ("path.loop", "has too many levels of symbolic links"),
    errno.ENOSPC: ("disk.full", "is on a disk with no room left"),
    errno.EDQUOT: ("disk.full", "is on a disk whose quota is used up"),
    errno.EFBIG: ("disk.full", "would grow past the file-size limit"),
    errno.EXDEV: ("path.cross_device", "cannot be renamed across file systems"),
}
# what a path of the wrong kind is, by its file type
_KINDS = {
    stat.S_IFDIR: "a folder",
    stat.S_IFREG: "a file",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
    stat.S_IFSOCK: "a socket",
}


def from_os_error(exc: OSError, what: str = "", path: Path | str | None = None) -> RlsmokeError:
    """The one-line error for an OSError on a user's path (its `filename` unless `path` is given)."""
    path = path if path is not None else exc.filename
    rule, meaning = _BY_ERRNO.get(exc.errno, ("path.unusable", f"cannot be used ({exc.strerror or exc})"))
    name = f"{what}={path}" if what else f"{path}"
    if exc.filename is not None and path is not None and str(exc.filename) != str(path):
        meaning += f" ({exc.filename})"
    return RlsmokeError(f"{name} {meaning}", rule=rule, fix=_fix(rule, what))


def _fix(rule: str, what: str) -> str:
    flag = what or "the path"
    return {
        "path.too_long": f"give {flag} a shorter name (a file system allows 255 bytes per name)",
        "path.missing": f"give {flag} a path that exists",
        "path.kind": f"give {flag} the kind it names (see --help)",
        "path.denied": f"give {flag} a path you can read and write, or change its permissions",
        "path.read_only": f"give {flag} a path on a writable file system",
        "disk.full": "free space on that disk, or choose a path on another",
    }.get(rule, f"give {flag} another path")


def _stat(path: Path, what: str) -> os.stat_result | None:
    """The path's stat, None when it does not exist; every other OSError is the path's one line."""
    try:
        return path.stat()
    except FileNotFoundError:
        if path.is_symlink():  # a dangling link: the name is taken, but nothing is behind it
            raise RlsmokeError(f"{what}={path} is a symbolic link to nothing ({os.readlink(path)})", rule="path.missing",
                               fix=f"give {what} a path that exists, or remove the dangling link") from None  # fmt: skip
        return None
    except OSError as exc:
        raise from_os_error(exc, what, path) from None


def _check_kind(path: Path, what: str, is_kind, noun: str, fix: str, must_exist: bool = True) -> Path:
    if (st := _stat(path, what)) is None and must_exist:
        raise RlsmokeError(f"{what}={path} does not exist", rule="path.missing",
                           fix=fix or _fix("path.missing", what))  # fmt: skip
    if st is not None and not is_kind(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a file or folder")
        raise RlsmokeError(f"{what}={path} is {kind}, not {noun}", rule="path.kind",
                           fix=fix or f"give {what} {noun}")  # fmt: skip
    return path


def check_file(path: Path | str, what: str, *, fix: str = "") -> Path:
    """`path` names a regular file that can be read: else path.missing, path.kind, path.too_long..."""
    return _check_kind(Path(path), what, stat.S_ISREG, "a regular file", fix)


def check_dir(path: Path | str, what: str, *, must_exist: bool = True, fix: str = "") -> Path:
    """`path` names a folder (or, unless `must_exist`, nothing yet, under a parent that can be a folder)."""
    return _check_kind(Path(path), what, stat.S_ISDIR, "a folder", fix, must_exist)


def check_name(path: Path | str, what: str) -> Path:
    """Only that the path can be named at all (each part within the file system's length): for a path
    that a command creates."""
    path = Path(path)
    _stat(path, what)
    return path


def cwd_exists(command: str) -> None:
    """A deleted working folder makes libraries fail without naming it: refused first."""
    try:
        os.getcwd()
    except FileNotFoundError:
        raise RlsmokeError(f"the working folder of `rlsmoke {command}` was deleted", rule="path.cwd_gone",
                           fix="cd to a folder that exists, then run the command again") from None  # fmt: skip
