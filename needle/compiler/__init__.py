"""Graph compilation: ``needle.compile(fn)`` and ``with needle.lazy():``.

``compile(fn)`` turns a function of tensors (a forward pass, or a loss and its ``backward``)
into a cached program, as ``torch.compile`` or a CUDA graph does: **trace** every device
primitive it runs (``capture.py``), **check** that the recording can be replayed
(``checks.py``), **fuse** elementwise chains into one kernel each (``fusion.py``), and
**replay** the program on later calls with the same input signature (``replay.py``). Results
behave as eager ones: those that require a gradient hang from one node whose gradient is a
compiled backward program (``autograd_node.py``). ``compile(module)`` returns a
``CompiledModule``; ``lazy()`` (``lazy.py``) defers primitives and runs them, fused, when data
is read or the block ends.
"""
from .capture import DataDependentError
from .compiled_function import CompiledFunction, compile
from .compiled_module import CompiledModule
from .lazy import LazyBlock, lazy
from .replay import Program

__all__ = ["compile", "lazy", "CompiledFunction", "CompiledModule", "DataDependentError",
           "LazyBlock", "Program"]
