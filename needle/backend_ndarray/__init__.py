"""needle's n-dimensional array: strided views in Python over swappable device backends."""
from .device import BackendDevice, all_devices, cpu, cpu_numpy, cuda, default_device
from .dtypes import to_numpy_dtype
from .functions import *  # its __all__: array, full, exp, stack, where, take_rows, ...
from .ndarray import NDArray, broadcast_shapes, prod
