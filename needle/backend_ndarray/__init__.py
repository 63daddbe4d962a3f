"""needle's n-dimensional array: strided views in Python over swappable device backends."""
from .device import BackendDevice, all_devices, cpu, cpu_numpy, cuda, default_device
from .dtypes import to_numpy_dtype
from .functions import (
    array,
    broadcast_to,
    empty,
    exp,
    flip,
    full,
    log,
    matmul,
    max,
    maximum,
    ones,
    reshape,
    scatter_add_rows,
    split,
    sqrt,
    stack,
    sum,
    take_rows,
    tanh,
    transpose,
    where,
    zeros,
)
from .ndarray import NDArray, broadcast_shapes, prod
