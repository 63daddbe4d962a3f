"""Write a file atomically: readers see the old file or the whole new one, never a part.

The bytes go to a temporary file beside the target, are fsynced, and the temporary file is
renamed over the target (``os.replace`` is atomic on POSIX). Three details a plain
``mkstemp`` + ``replace`` gets wrong, and this module does not:

* the target keeps its permission bits (``mkstemp`` creates 0600; a new file gets the usual
  ``0666 & ~umask``);
* a symlink is written through (its target is replaced; the link stays a link);
* a save killed mid-write (SIGKILL, power loss) leaves its temporary file behind. The name says
  whose it is (``.<name>.<host>.<pid>.<random>.ndltmp``), so the next save to the same target
  removes those of this host whose process is gone.
"""
import contextlib
import errno
import os
import socket
import tempfile
from typing import BinaryIO, Callable

SUFFIX = ".ndltmp"


def write_atomic(path: str, write: Callable[[BinaryIO], None]) -> None:
    """Run ``write`` on a temporary file beside ``path``, then rename it over ``path``."""
    target = os.path.realpath(path)  # through symlinks: replace what the link points at
    directory, base = os.path.split(target)
    _check_target(path, target, directory)
    remove_stale(directory, base)
    try:
        fd, tmp = tempfile.mkstemp(prefix=_prefix(base) + f"{os.getpid()}.", suffix=SUFFIX,
                                   dir=directory)
    except OSError as err:  # name the file asked for, not the temporary one
        raise type(err)(err.errno, f"cannot write {path} in {directory}: {err.strerror}") \
            from None
    try:
        os.fchmod(fd, _mode_for(target))
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_dir(directory)


def _check_target(path: str, target: str, directory: str) -> None:
    """A missing folder, a file where the folder should be, or a folder where the file should
    be: an OSError naming ``path`` and the folder (not the temporary file's name)."""
    if not os.path.isdir(directory):
        if os.path.exists(directory):
            raise NotADirectoryError(errno.ENOTDIR, f"cannot write {path}: {directory} is not "
                                     "a folder")
        raise FileNotFoundError(errno.ENOENT, f"cannot write {path}: the folder {directory} "
                                "does not exist")
    if os.path.isdir(target):
        raise IsADirectoryError(errno.EISDIR, f"cannot write {path}: it is a folder")


def _prefix(base: str) -> str:
    """The start of every temporary file name this host uses for target ``base``."""
    return f".{base}.{socket.gethostname()}."


def _mode_for(target: str) -> int:
    """The existing file's permission bits, else what ``open()`` would give a new file."""
    try:
        return os.stat(target).st_mode & 0o7777
    except FileNotFoundError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process umask (read from /proc where possible: setting it is not thread-safe)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def remove_stale(directory: str, base: str) -> None:
    """Remove temporary files for ``base`` left by dead processes of this host."""
    prefix = _prefix(base)
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not (name.startswith(prefix) and name.endswith(SUFFIX)):
            continue
        pid = name[len(prefix):].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(OSError):  # another saver may have removed it first
                os.remove(os.path.join(directory, name))


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: not ours to judge
    return True


def _fsync_dir(directory: str) -> None:
    """Persist the rename itself (POSIX); a no-op where directories cannot be opened."""
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    with contextlib.suppress(OSError):
        os.fsync(dfd)
    os.close(dfd)
