"""Which array a Tensor's data is: needle's strided NDArray (``nd``) or a NumPy array (``np``).

The course's order: hw1 and hw2 run on NumPy arrays (the course's ``array_api`` is ``numpy``
until hw3 brings the NDArray), hw3 on. ``NEEDLE_BACKEND=np`` picks NumPy, so hw1's ops need
nothing from hw3; ``NEEDLE_BACKEND=nd`` (the default) picks the NDArray. Every op is written
once: in ``np`` mode a Tensor holds a ``backend_numpy.NumpyArray``, a real ``np.ndarray`` with
the few NDArray methods the ops call (``permute``, ``broadcast_to``, ``compact``, ...).

The two differ in one dtype rule: in ``np`` mode a Python list of floats is float64, as NumPy
reads it (hw1's era); in ``nd`` mode it is float32 (README, "Dtypes"). The grader computes each
graded test on its homework's backend (``course/exercises.py``: ``HOMEWORK_BACKEND``).
"""
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
