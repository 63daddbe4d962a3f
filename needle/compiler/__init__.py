"""Graph compilation: ``needle.compile(fn)`` and ``with needle.lazy():``.

``compile(fn)`` turns a function of tensors (a forward pass, or a loss and its ``backward``)
into a cached plan, as ``torch.compile`` or a CUDA graph does: **trace** every device
primitive it runs (``capture.py``), **check** that the recording can be replayed
(``checks.py``), **fuse** elementwise chains into one kernel each (``fusion.py``), and
**replay** the plan on later calls with the same input signature (``replay.py``). Results
behave as eager ones: those that require a gradient hang from one node whose gradient is a
compiled backward plan (``autograd_node.py``). ``compile(module)`` returns a
``CompiledModule``; ``lazy()`` (``lazy.py``) defers primitives and runs them, fused, when data
is read or the block ends.
"""
from .capture import DataDependentError
from .compiled_function import CompiledFunction, compile
from .compiled_module import CompiledModule
from .lazy import LazyBlock, lazy
from .replay import Plan

__all__ = ["compile", "lazy", "CompiledFunction", "CompiledModule", "DataDependentError",
           "LazyBlock", "Plan"]
