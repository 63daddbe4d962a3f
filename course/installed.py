"""Whether needle and what its dev extra lists are installed: ``make grade`` runs ``make
install`` (pip, which needs the network) only when they are not, so grading needs no network
once ``make install`` has run.

    python -m course.installed     # exit status 0: installed; 1: not (the line says what lacks)
"""
import importlib.metadata as metadata
import re
import sys
from typing import List, Optional, Sequence

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _applies(marker: str, extra: str) -> bool:
    """Whether a requirement's environment marker holds here, with ``extra`` asked for."""
    try:
        from packaging.markers import Marker
    except ImportError:  # only the extra can be read without packaging
        return extra in re.findall(r"extra\s*==\s*['\"]([\w-]+)", marker)
    return Marker(marker).evaluate({"extra": extra})


def missing(dist: str = "needle", extra: str = "dev") -> List[str]:
    """The distributions ``dist`` (with ``extra``) needs that are not installed, ``dist``
    itself first; [] when all are."""
    try:
        requires = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        return [dist]
    out = []
    for req in requires:
        spec, _, marker = req.partition(";")
        if marker.strip() and not _applies(marker, extra):
            continue
        match = _NAME.match(spec.strip())
        if match is None:
            continue
        try:
            metadata.version(match[0])
        except metadata.PackageNotFoundError:
            out.append(match[0])
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Exit status 0 when installed, else 1 with a line naming what is missing."""
    lacking = missing()
    if lacking:
        print(f"not installed: {', '.join(lacking)}", file=sys.stderr)
    return 1 if lacking else 0


if __name__ == "__main__":
    sys.exit(main())
