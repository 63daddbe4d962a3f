"""Graph compilation: ``needle.compile(fn)`` and ``with needle.lazy():``.

``compile(fn)`` turns a function of tensors (a forward pass, or a whole loss + ``backward``)
into a cached plan, in the way ``torch.compile`` or a CUDA graph does, in four steps:

1. **trace** (``capture.py``): call ``fn`` eagerly while recording every device primitive it
   runs: forward, backward, the masks gradients compute, the broadcast copies;
2. **check** (``checks.py``): the trace must not have read tensor data into Python (then
   control flow may depend on it: the function runs eagerly from then on, or
   ``fallback=False`` raises), two
   recordings must agree (no fresh random numbers or counters baked in), and no array the
   function computed may stay referenced by something other than its results (state kept
   in Python, e.g. BatchNorm's running statistics, cannot be replayed);
3. **fuse** (``fusion.py``): maximal elementwise chains, and a chain feeding a reduction,
   become one ``fused_elementwise`` kernel each, so their intermediates are never written;
4. **replay** (``plan.py``): later calls with the same input shapes/dtypes/devices (the guard)
   run the plan on the new inputs, with no autograd graph and no Python op dispatch; a new
   shape compiles again (``compiles`` counts it; ``debug=True`` prints why).

Results behave as eager ones. A function that calls ``backward`` itself sets the ``.grad``
of the leaf tensors its backward reached, replay after replay, and returns results without a
graph. Otherwise, with grad mode on, results that require a gradient carry a graph: one node
whose gradient is a compiled backward plan (``autograd_node.py``), so ``compiled(x).backward()``
gives eager's gradients. ``compile(module)`` returns a ``CompiledModule``
(``compiled_module.py``), called like the module and trained like it.
``lazy()`` (``lazy.py``) defers primitives instead and runs them, fused, when data is read or
the block ends. ``CompiledFunction`` (``compiled_function.py``) holds the plan cache.
"""
from .capture import DataDependentError
from .compiled_function import CompiledFunction, compile
from .compiled_module import CompiledModule
from .lazy import LazyBlock, lazy
from .replay import Plan

__all__ = ["compile", "lazy", "CompiledFunction", "CompiledModule", "DataDependentError",
           "LazyBlock", "Plan"]
