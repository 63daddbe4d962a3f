"""A compiled program replayed as one CUDA graph (``needle.compile(fn, mode="reduce-overhead")``,
PyTorch's name for the same thing: ``torch.compile(mode="reduce-overhead")``).

The program already knows every buffer of a call, so it is run once more under a stream capture
(``backend_cuda/graphs.py``) into static buffers, and each later call is: copy the call's
arguments into the static input buffers, check embedding indices on the host (their range is
known where they were uploaded), one graph launch. Parameters and module state are read where
they are: an optimizer that updates them in place (needle's multi-tensor Adam / AdamW / SGD)
keeps the graph valid; one that gives them new arrays makes a new capture, and when that
happens twice in a row graph mode stops (plain replay) and ``explain()`` says why.

As in PyTorch, the results (the returned tensors, the gradients set on leaves) live in the
graph's static buffers and are overwritten by the next call: read or copy them before it.

The optimizer step can be a graph too, once the gradients sit in the graph's buffers and one
eager step has seen them (``backend_cuda/graphs.py``; replays count steps and check the
hyperparameters as eager steps do):

    step = ndl.compile(forward_and_backward, mode="reduce-overhead")
    for i, (x, y) in enumerate(batches):
        loss = step(x, y)             # from the 3rd call: one graph launch
        if i == 3:
            with graphs.graph(g):     # records opt.step(), runs nothing
                opt.step()
        g.replay() if i >= 3 else opt.step()
"""
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .replay import Program, check_index_ranges


class GraphReplay:
    """``program`` captured as a CUDA graph over static buffers; ``reason`` when it cannot be."""

    def __init__(self, program: Program, per_call: Sequence[bool],
                 state: Sequence[Tuple[int, int]] = ()) -> None:
        self.program = program
        self.per_call = list(per_call)  # per input: a call's argument (copied) or read in place
        # (input, output) positions of state the function replaces (BatchNorm's running
        # statistics): the graph copies the new value into the input buffer it reads
        self.state = list(state)
        self.reason: Optional[str] = None
        self.graph: Any = None
        self.static_in: List[Any] = []
        self.outputs: Dict[int, Any] = {}
        self.results: List[Any] = []
        self.captures = 0
        self._moved_last = False
        # (input position, or None for a constant; buffer; step; rows) of each index check
        self._checks = [(program.inputs.index(buf) if buf in program.inputs else None, buf,
                         name, rows) for buf, name, rows in program.checked]
        self._to_numpy, self._compact = program.lookup("to_numpy"), program.lookup("compact")
        for k, buf, name, _ in self._checks:
            if k is None and program.trace.internal[buf]:
                self.reason = (f"{name} reads indices computed inside the function: checking "
                               f"their range needs a host read, which a graph cannot make")
        if not getattr(program.device.mod, "GRAPHS", False):
            self.reason = f"the {program.device.name} device has no CUDA graphs"

    def run(self, inputs: Sequence[Any]) -> List[Any]:
        """This call's results: captured on the first call (and when parameters moved),
        else replayed (one graph launch)."""
        self._check_indices(inputs)
        if self.graph is None:
            return self._capture(inputs)
        state_out = {k: self.results[o] for k, o in self.state}
        moved = [k for k, (src, dst) in enumerate(zip(inputs, self.static_in))
                 if not self.per_call[k] and src is not dst and src is not state_out.get(k)]
        if moved:
            if self._moved_last:
                self.reason = ("the function's parameters or state get new arrays every call "
                               "(an optimizer that does not update in place): each call would "
                               "capture again")
                return self.program._run(inputs)
            self._moved_last = True
            return self._capture(inputs)
        self._moved_last = False
        self._copy_in(inputs)
        self.graph.replay()
        return self.results

    def _capture(self, inputs: Sequence[Any]) -> List[Any]:
        """Static buffers, a warm run into them (this call's results: a capture runs
        nothing), then the capture; on failure, plain replay from now on with the reason."""
        from ..backend_cuda import graphs
        program, dev = self.program, self.program.device
        self.static_in = [dev.Array(src.size, dtype=src.dtype) if per else src
                          for src, per in zip(inputs, self.per_call)]
        self._copy_in(inputs)
        self.outputs = {b: dev.Array(size, dtype=dtype) for b, size, dtype in program.fresh}
        with graphs.warm_up():  # this call's results; the pool then holds every buffer
            self.results = program._run(self.static_in, self.outputs, checked=False)  # needed
            self._carry_state()
        g = graphs.CUDAGraph()
        try:
            with graphs.graph(g, self.static_in[0].device_index if self.static_in else 0):
                program._run(self.static_in, self.outputs, checked=False)
                self._carry_state()
        except Exception as e:  # what CUDA (or the emulator) refuses during a capture
            self.reason = f"the capture failed: {type(e).__name__}: {e}"
            self.graph = None
            return self.results
        self.graph = g
        self.captures += 1
        return self.results

    def _copy_in(self, inputs: Sequence[Any]) -> None:
        """The call's arguments into the static input buffers (with their known range)."""
        for src, dst, per in zip(inputs, self.static_in, self.per_call):
            if per and src is not dst:
                self._compact(src, dst, (src.size,), (1,), 0)
                dst.known_range = src.known_range

    def _carry_state(self) -> None:
        """New state values into the buffers the next call reads them from."""
        for k, o in self.state:
            src, dst = self.results[o], self.static_in[k]
            self._compact(src, dst, (src.size,), (1,), 0)

    def _check_indices(self, inputs: Sequence[Any]) -> None:
        """Eager mode's index range checks, on the host: from the range an uploaded index
        buffer carries, else from a download (a constant's: once, before the capture)."""
        static, first = self.program.static, self.graph is None
        # a constant the function closed over is checked once, before the capture
        check_index_ranges([(inputs[k] if k is not None else static[buf], rows, name)
                            for k, buf, name, rows in self._checks if k is not None or first],
                           self._to_numpy)

    def explain(self) -> str:
        """One line: graph mode's state."""
        if self.reason is not None:
            return f"CUDA graph mode off ({self.reason}): plain replay"
        if self.graph is None:
            return "CUDA graph mode: captured on the next call"
        n = len(self.graph._graph) if hasattr(self.graph._graph, "__len__") else "?"
        return (f"CUDA graph mode: one graph launch per call ({n} captured calls, "
                f"{self.captures} capture(s)); results are overwritten by the next call")
