"""The emulator's runtime errors (module.py raises them; memcheck.py adds the memory errors)."""


class EmulatorError(RuntimeError):
    """Base class of the emulator's runtime errors."""


class EmulatorKernelError(EmulatorError):
    """A kernel broke CUDA's rules while running (divergent barrier, deadlock, bad mask)."""


class EmulatorMemoryError(EmulatorKernelError):
    """A kernel's memory access a GPU would not survive or compute garbage from: out of bounds,
    uninitialised shared memory, or a shared-memory race (a missing ``__syncthreads()``)."""
