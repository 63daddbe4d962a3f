"""What needle's commands share: bad input ends in one line on stderr and exit status 2, and an
unwritable output file is refused before any work starts."""
import argparse
import os
import sys
import tempfile
from typing import NoReturn, Optional

__all__ = ["Parser", "fail", "check_output_path", "launcher_rank"]


def launcher_rank() -> int:
    """This process's rank from the MPI launcher's environment (0 when not launched)."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return 0


def fail(prog: str, message: str) -> NoReturn:
    """Print ``prog: error: message`` (on rank 0 of a launched job) and exit with status 2."""
    if launcher_rank() == 0:
        print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``--help`` still prints the usage)."""

    def error(self, message: str) -> NoReturn:
        """One line naming the problem, exit status 2 (argparse's own status)."""
        syntax = message.startswith(("argument ", "the following", "unrecognized"))
        fail(self.prog, message + (" (--help lists the options)" if syntax else ""))


def check_output_path(path: str, flag: str) -> Optional[str]:
    """Why ``path`` could not be written (a missing or read-only folder, a folder in its
    place), or None when it can. Tried with a temporary file beside it, so that ranks checking
    the same path at once do not race, and the path itself is never created or removed."""
    if not path:
        return None
    if os.path.isdir(path):
        return f"{flag} {path} is a folder, not a file"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"{flag} {path}: the folder {folder} does not exist"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"{flag} {path} cannot be written (permission denied)"
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        return f"{flag} {path} cannot be written ({err.strerror})"
    return None
