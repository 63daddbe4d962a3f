"""What needle's commands share: bad input ends in one line on stderr and exit status 2, and an
unwritable output file is refused before any work starts; numeric options follow
``needle.numbers``' rule (``type=int`` takes ASCII digits only, ``type=float`` no nan or inf)."""
import argparse
import os
import sys
import tempfile
from typing import Any, Callable, NoReturn, Optional

from . import numbers

__all__ = ["Parser", "fail", "check_output_path", "check_output_dir", "launcher_rank",
           "count_type", "real_type", "positive_type"]


def launcher_rank() -> int:
    """This process's rank from the MPI launcher's environment (0 when not launched)."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        try:
            return numbers.count(os.environ[var], var)
        except (KeyError, numbers.NumberError):
            continue
    return 0


def fail(prog: str, message: str) -> NoReturn:
    """Print ``prog: error: message`` (on rank 0 of a launched job) and exit with status 2."""
    if launcher_rank() == 0:
        print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def _option_type(parse: Callable[..., Any], **rule: Any) -> Callable[[str], Any]:
    """An argparse ``type`` applying ``parse`` (a ``needle.numbers`` helper) with ``rule``;
    argparse names the option: ``argument --steps: '1.5' is not a whole number >= 1``."""
    def convert(text: str) -> Any:
        try:
            return parse(text, "", **rule)
        except numbers.NumberError as err:
            raise argparse.ArgumentTypeError(str(err).lstrip()) from None
    convert.__name__ = parse.__name__
    return convert


def count_type(lo: Optional[int] = None, hi: Optional[int] = None) -> Callable[[str], int]:
    """An argparse ``type``: a whole number in ASCII digits, in [lo, hi]."""
    return _option_type(numbers.count, lo=lo, hi=hi)


def real_type(lo: Optional[float] = None, hi: Optional[float] = None) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in [lo, hi]."""
    return _option_type(numbers.real, lo=lo, hi=hi)


def positive_type() -> Callable[[str], float]:
    """An argparse ``type``: a finite number > 0 (a rate, a timeout, a size)."""
    return _option_type(numbers.positive)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``--help`` still prints the usage) and
    whose ``type=int`` / ``type=float`` follow ``needle.numbers``' rule (the range is the
    command's own check: ``--staleness -1`` is named by the command, not by the parser)."""

    def add_argument(self, *args: Any, **kw: Any) -> Any:
        """``argparse``'s, with ``int`` and ``float`` replaced by the strict parsers."""
        if kw.get("type") is int:
            kw["type"] = count_type()
        elif kw.get("type") is float:
            kw["type"] = real_type()
        return super().add_argument(*args, **kw)

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


def check_output_dir(path: str, flag: str) -> Optional[str]:
    """Why the folder ``path`` could not be made (or written in), or None when it can: a file
    in its place, or a nearest existing folder above it that is read-only or takes no new
    folder (``/proc``, even for root: tried with a folder made and removed). Leaves nothing."""
    if not path:
        return None
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{flag} {path} is a file, not a folder"
    existing = os.path.abspath(path)
    while not os.path.exists(existing):  # makedirs would create the folders up to here
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{flag} {path}: {existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{flag} {path} cannot be written ({existing}: permission denied)"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".needle-check-", dir=existing))
    except OSError as err:
        return f"{flag} {path} cannot be made ({existing}: {err.strerror or err})"
    return None
