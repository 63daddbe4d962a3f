"""Start a script on several ranks: ``python -m needle.parallel.launch -n 4 script.py [args]``.

A thin wrapper over ``mpiexec``: prefixes output lines with the rank, runs under ``python -m
mpi4py`` (an uncaught exception aborts the job), passes ``-f hostfile`` on. mpiexec reports a
dead rank with a bare exit code, so each rank runs under a *supervisor* that records how its
child ended (code or signal, time, stderr) in a folder shared with the launcher, which then
prints which rank ended first and how. ``main(argv, wrap=...)`` lets a tool rewrite the command.
"""
import argparse
import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, List, NoReturn, Optional

from ..cli import Parser
from . import hostfile, mpiexec
from .faults import (
    CONSEQUENCES,
    install_abort_hook,
    rank_from_env,
    remove_exit_guard,
    write_status,
)
from .faults import REPORT_DIR_ENV as DIR_ENV

SUPERVISE = "--rank-supervise"  # internal: how mpiexec starts each rank
CHILD = "--rank-child"  # internal: the rank itself, under its supervisor
TAIL_LINES = 12
Wrap = Callable[[List[str]], List[str]]  # mpiexec's command line -> the one to run


def build_command(argv: Optional[List[str]] = None, wrap: Optional[Wrap] = None) -> List[str]:
    """The mpiexec command line for the launcher's arguments (``wrap`` rewrites mpiexec's part)."""
    parser = Parser(prog="python -m needle.parallel.launch",
                    description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--nproc", type=int, default=2, help="number of ranks")
    parser.add_argument("-f", "--hostfile", help="MPI host file for multi-host runs")
    parser.add_argument("--no-prefix", action="store_true", help="do not prefix output lines")
    parser.add_argument("-m", dest="module", help="run a module instead of a script")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="script and its arguments")
    own, module_args = _split_module(sys.argv[1:] if argv is None else list(argv))
    args = parser.parse_args(own)
    args.rest = module_args + args.rest
    if args.module is None and not args.rest:
        parser.error("give a script (or -m module) to run")
    if args.nproc < 1:  # mpiexec -n 0 (or -3) quietly runs one rank
        parser.error(f"-n must be at least 1, not {args.nproc}")
    if args.hostfile and not Path(args.hostfile).is_file():  # not mpiexec's five-line trace
        parser.error(f"-f {args.hostfile}: no such host file")
    if args.hostfile:
        try:
            hostfile.parse(args.hostfile)
        except hostfile.HostfileError as err:
            _refuse(parser, str(err))
    if args.module is None and not Path(args.rest[0]).is_file():  # not a traceback per rank
        _refuse(parser, f"no such script: {args.rest[0]}")
    cmd = mpiexec.command(args.nproc, args.hostfile)
    if wrap is not None:
        cmd = wrap(cmd)
    shim = ["-m", "needle.parallel.launch", SUPERVISE, "0" if args.no_prefix else "1"]
    target = ["-m", args.module] if args.module else []
    return cmd + [sys.executable] + shim + target + args.rest


def _refuse(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """Exit with status 2 and one line on stderr (argparse's error adds the usage line)."""
    sys.stderr.write(f"{parser.prog}: error: {message}\n")
    raise SystemExit(2)


def _split_module(argv: List[str]) -> "tuple[List[str], List[str]]":
    """(the launcher's arguments, the module's): as with ``python -m``, everything after
    ``-m MODULE`` belongs to the module (``--strategy ddp`` is not a launcher option)."""
    for i, a in enumerate(argv):
        if a == "-m" and i + 1 < len(argv):
            return argv[:i + 2], argv[i + 2:]
        if not a.startswith("-") and (i == 0 or argv[i - 1] not in ("-n", "--nproc", "-f",
                                                                      "--hostfile")):
            break  # a script path: the rest is its own
    return argv, []


class _Prefixed:
    """A text stream wrapper writing ``prefix`` at the start of every line."""

    def __init__(self, stream: Any, prefix: str) -> None:
        self._stream, self._prefix, self._partial = stream, prefix, ""

    def write(self, text: str) -> int:
        # Whole lines only, in one write each, so lines of different ranks never interleave.
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        if lines:
            self._stream.write("".join(self._prefix + line + "\n" for line in lines))
            self._stream.flush()
        return len(text)

    def flush(self) -> None:
        if self._partial:
            self._stream.write(self._prefix + self._partial)
            self._partial = ""
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def run_as_rank(prefix: bool, rest: List[str]) -> None:
    """Inside one rank: prefix its output with the rank, then ``python -m mpi4py rest...``."""
    if prefix:
        sys.stdout = _Prefixed(sys.stdout, f"[{rank_from_env()}] ")
        sys.stderr = _Prefixed(sys.stderr, f"[{rank_from_env()}] ")
    from mpi4py.run import main as mpi4py_main

    install_abort_hook()  # records the exception for the launcher, then MPI_Abort
    atexit.register(_mark_clean_exit)  # os._exit skips it: how the supervisor tells
    sys.argv = ["mpi4py"] + rest
    try:
        mpi4py_main()
    except SystemExit as stop:  # mpi4py aborts the job at exit: record it before it does
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if code:
            write_status({"returncode": code, "time": time.time()})
        raise


def _mark_clean_exit() -> None:
    """In the rank, at a normal interpreter exit: leave a mark for the supervisor."""
    folder = os.environ.get(DIR_ENV)
    if folder:
        (Path(folder) / f"rank{rank_from_env()}.exit").touch()


def _die_with_parent() -> None:
    """In the rank (child): get SIGKILL if the supervisor dies (Linux), never an orphan."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def supervise(prefix: str, rest: List[str]) -> int:
    """Run the rank as a child; record how it ended if it ended badly; return its status."""
    remove_exit_guard()  # this process is no rank: it must not join MPI start-up at exit
    report = os.environ.get(DIR_ENV)
    cmd = [sys.executable, "-m", "needle.parallel.launch", CHILD, prefix] + rest
    # close_fds=False: the rank inherits mpiexec's PMI connection (PMI_FD).
    child = subprocess.Popen(cmd, stderr=subprocess.PIPE, close_fds=False,
                             preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    err_file = open(Path(report) / f"rank{rank_from_env()}.err", "ab") if report else None
    copier = threading.Thread(target=_copy_stderr, args=(child.stderr, err_file), daemon=True)
    copier.start()
    # The time of death, not of observation: the stderr pipe may stay open long after the
    # rank died (a process it started holds it), by which time the ranks that waited for it
    # have timed out and would be reported as failing first.
    code, died = child.wait(), time.time()
    copier.join(STDERR_GRACE)
    if report:  # exit code 0 too: a rank that ends cleanly mid-job stalls the others
        status = {"returncode": code, "time": died}
        if code == 0 and not (Path(report) / f"rank{rank_from_env()}.exit").exists():
            status["no_exit"] = True  # os._exit(0): MPI never finalised, the job is torn down
            code = 1
        write_status(status)
    if code < 0:  # killed by a signal: die the same way so mpiexec sees it
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


STDERR_GRACE = 1.0  # seconds to finish copying a dead rank's stderr


def _copy_stderr(stream: Any, err_file: Any) -> None:
    """Copy the rank's stderr to ours, keeping a copy in ``err_file`` for the report."""
    out = sys.stderr.buffer
    for line in iter(stream.readline, b""):
        out.write(line)
        out.flush()
        if err_file:
            err_file.write(line)
            err_file.flush()


def _how(status: dict) -> str:
    """How a rank ended, in words."""
    if "exception" in status:
        return f"raised {status['exception']}"
    if status.get("no_exit"):
        return "exited with code 0 mid-job, skipping Python's exit (os._exit?)"
    if status["returncode"] < 0:
        sig = -status["returncode"]
        return f"was killed by signal {sig} ({signal.Signals(sig).name})"
    return f"exited with code {status['returncode']}"


def _reports(folder: Path) -> list:
    """(time, rank, status) of every rank that left a readable status, earliest first."""
    reports = []
    for path in folder.glob("rank*.status"):
        try:
            status = json.loads(path.read_text())
            reports.append((float(status["time"]), path.stem[4:], status))
        except (OSError, ValueError, KeyError):
            continue  # half-written as the job was torn down: the others still tell
    return sorted(reports, key=lambda r: r[0])


def consequence(status: dict) -> bool:
    """Whether a rank's end is what another rank's failure causes (it waited for it in vain)."""
    return bool(status.get("consequence")) or \
        str(status.get("exception", "")).startswith(CONSEQUENCES)


def first_failure(folder: Path) -> Optional[str]:
    """The report on the rank that failed first, and on ranks that exited cleanly before it."""
    reports = _reports(folder)
    failed = [r for r in reports if "exception" in r[2] or r[2]["returncode"] != 0
              or r[2].get("no_exit")]
    if not failed:
        return None
    # A timeout is the consequence of another rank's failure when there is one: it is reported
    # ahead of it only by a clock (under heavy load, a rank's death can be seen seconds late).
    failed.sort(key=lambda r: (consequence(r[2]), r[0]))
    when, rank, status = failed[0]
    early = [(t, q) for t, q, st in reports if t < when and st.get("returncode") == 0]
    err = folder / f"rank{rank}.err"
    tail = err.read_bytes().decode(errors="replace").splitlines()[-TAIL_LINES:] \
        if err.exists() else []
    lines = [f"needle.parallel.launch: rank {q} exited with code 0 mid-job, {when - t:.1f} s "
             "before the first failure, while other ranks still waited for it." for t, q in early]
    first = "failed first" if early else "ended first"
    lines.append(f"needle.parallel.launch: rank {rank} {first}: it {_how(status)}.")
    if consequence(status):  # nobody else recorded a failure: the ranks it waited for are
        lines.append("needle.parallel.launch: no rank it waited for recorded how it ended "
                     "(stuck without communicating, or killed with the job).")
    if "host" in status:
        lines.append(f"needle.parallel.launch: rank {rank} ran on host {status['host']}.")
    if tail:
        lines.append(f"needle.parallel.launch: last {len(tail)} lines of rank {rank}'s stderr:")
        lines += [f"    {line}" for line in tail]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None, wrap: Optional[Wrap] = None) -> int:
    """Run the job, name the rank that ended first if it failed, return the job's status."""
    with tempfile.TemporaryDirectory(prefix="needle-launch-") as folder:
        env = dict(os.environ, **{DIR_ENV: folder})
        code = subprocess.call(build_command(argv, wrap), env=env)
        report = first_failure(Path(folder))
        if report:
            code = code or 1  # mpiexec says 0 when a rank's os._exit(0) tore the job down
            sys.stderr.write(report + "\n")
            sys.stderr.flush()
    return code


if __name__ == "__main__":
    if sys.argv[1:2] == [SUPERVISE]:
        sys.exit(supervise(sys.argv[2], sys.argv[3:]))
    elif sys.argv[1:2] == [CHILD]:
        run_as_rank(sys.argv[2] == "1", sys.argv[3:])
    else:
        sys.exit(main())
