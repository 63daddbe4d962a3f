"""MPI host files (``host``, ``host:slots``, ``host slots=N``; ``#`` comments), checked before
mpiexec: MPICH's hydra spins for ever on ``localhost:-2`` and fails silently on ``localhost:0``."""
import re
from typing import Dict, List, Tuple

from .. import numbers

_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
MAX_SLOTS = 1 << 16


class HostfileError(ValueError):
    """A host file MPI would misread: the message names the file, the line and the problem."""


def parse(path: str) -> List[Tuple[str, int]]:
    """The (host, slots) of each line of ``path``, in order; a bad line raises HostfileError."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise HostfileError(f"host file {path}: cannot be read ({err})") from None
    hosts: List[Tuple[str, int]] = []
    seen: Dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        host, slots = parse_line(text, f"host file {path}, line {number} ({line.strip()!r})")
        if host in seen:
            raise HostfileError(f"host file {path}, line {number}: host {host!r} is already on "
                                f"line {seen[host]}; give it once, as {host}:<slots>")
        seen[host] = number
        hosts.append((host, slots))
    if not hosts:
        raise HostfileError(f"host file {path}: names no host")
    return hosts


def parse_line(text: str, where: str) -> Tuple[str, int]:
    """``host``, ``host:slots`` or ``host slots=N``, with 1 <= slots <= MAX_SLOTS."""
    words = text.split()
    if len(words) == 2 and words[1].startswith("slots=") and ":" not in words[0]:
        host, sep, count = words[0], "=", words[1][len("slots="):]
    else:
        host, sep, count = text.partition(":")
    host = host.strip()
    if not _HOST.fullmatch(host):
        raise HostfileError(f"{where}: {host!r} is not a host name (want host or host:slots)")
    if not sep:
        return host, 1
    try:  # ASCII digits: MPICH's launcher dies of a floating-point exception on '٣'
        return host, numbers.count(count, "slots", lo=1, hi=MAX_SLOTS)
    except numbers.NumberError as err:
        raise HostfileError(f"{where}: {err}") from None
