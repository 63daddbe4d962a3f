"""Which array a Tensor's data is: needle's NDArray (``nd``, the default, hw3 on) or a NumPy
array (``NEEDLE_BACKEND=np``, hw1 and hw2). Ops are written once for both (README, "Dtypes")."""
import contextlib
import os
from typing import Iterator

BACKENDS = ("nd", "np")


def _checked(name: str, what: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"{what}={name!r}: the backends are 'nd' (needle's NDArray) and 'np' "
                         "(NumPy arrays)")
    return name


# read by Tensor construction and by Value._init on every op: a plain module attribute
BACKEND = _checked(os.environ.get("NEEDLE_BACKEND", "nd"), "NEEDLE_BACKEND")


def backend() -> str:
    """The backend new Tensors use: ``"nd"`` or ``"np"``."""
    return BACKEND


def set_backend(name: str) -> None:
    """Make new Tensors use backend ``name`` (``"nd"`` or ``"np"``) from now on."""
    global BACKEND
    BACKEND = _checked(name, "set_backend")


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Within the block, new Tensors use backend ``name``; the previous one is restored after."""
    before = BACKEND
    set_backend(name)
    try:
        yield
    finally:
        set_backend(before)
