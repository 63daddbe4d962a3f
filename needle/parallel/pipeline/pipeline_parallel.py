"""Run one training step of a pipeline: microbatches flow through stages by a schedule.

Each rank is one stage (a list of v chunks for the interleaved schedule) and runs its actions
from ``schedules.py`` (GPipe, Huang et al. arXiv:1811.06965; 1F1B and interleaved 1F1B,
Narayanan et al. arXiv:2104.04473). Each microbatch's loss is divided by m, so the step equals
the serial model's full-batch step when the loss is a mean.

Every rank handles its sends, receives and computations in order of the schedule's simulated
timeline (``_timeline``): one order shared by both ends of every link, so no schedule can deadlock
even with synchronous sends.

Every stage must be handed the same batch (stage 0 uses its inputs, the last stage its
targets: different batches would train on mismatched pairs); ``_agree_batch`` checks it.
"""
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union, cast

import numpy as np

from ... import numbers
from ...autograd import Tensor, find_topo_sort
from ...backend_ndarray import BackendDevice, cpu
from ...nn.nn_module import Module
from ..comm.agree import agree
from ..comm.protocol import Comm
from ..input_agreement import agree_inputs, checksum
from ..inputs import check_indices, host_array, on_rank
from .pp_comms import ACTIVATION, GRADIENT, Links
from .schedules import SCHEDULES, interleaved_1f1b
from .simulator import simulate, virtual_stage

__all__ = ["PipelineParallel"]


def _graph_bytes(out: Tensor, params: set) -> int:
    """Bytes of the activations ``out``'s graph keeps alive (parameters excluded)."""
    total = 0
    for node in find_topo_sort([out]):
        if isinstance(node, Tensor) and id(node) not in params and node.cached_data is not None:
            total += int(np.prod(node.shape)) * np.dtype(node.dtype).itemsize
    return total


def _device_of(chunks: Sequence[Module]) -> BackendDevice:
    """The device of the stage's parameters (the CPU for a stage without any)."""
    for c in chunks:
        for q in c.parameters():
            return q.device
    return cpu()


class _Step:
    """What one ``train_step`` carries between actions: inputs, messages, graphs, sums."""

    def __init__(self, xs: List[np.ndarray], ys: List[np.ndarray], params: List[Tensor]) -> None:
        self.xs, self.ys, self.params = xs, ys, params
        self.pids = {id(q) for q in params}
        self.dtype = params[0].dtype if params else "float32"
        self.acc: Dict[int, np.ndarray] = {}
        self.inbox: Dict[Tuple[str, int, int], np.ndarray] = {}
        self.stored: Dict[Tuple[int, int], Tuple[Tensor, Any, int]] = {}  # (input, output, bytes)
        self.losses: List[float] = []
        self.live = 0


class PipelineParallel:
    """This rank's stage of a pipeline-parallel model, and the step that drives it."""

    def __init__(self, stage_module: Union[Module, Sequence[Module]], comm: Comm,
                 num_microbatches: int, schedule: str = "1f1b",
                 loss_fn: Optional[Callable[[Tensor, Tensor], Tensor]] = None,
                 device: Optional[BackendDevice] = None,
                 num_classes: Optional[int] = None) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {schedule!r}")
        num_microbatches = numbers.count_arg(num_microbatches, "PipelineParallel: "
                                             "num_microbatches", lo=1)  # nan: deep in range()
        chunks: List[Module] = (list(stage_module) if isinstance(stage_module, (list, tuple))
                                else [cast(Module, stage_module)])
        if schedule != "interleaved" and len(chunks) != 1:
            raise ValueError(f"schedule {schedule!r} runs one module per stage, got {len(chunks)}")
        agree(comm, "PipelineParallel", {"num_microbatches": num_microbatches,
                                         "schedule": schedule, "chunks_per_stage": len(chunks),
                                         "num_classes": num_classes})
        self.comm, self.chunks, self.schedule_name = comm, chunks, schedule
        self.num_stages, self.stage = comm.size, comm.rank
        self.num_microbatches, self.loss_fn = num_microbatches, loss_fn
        # where this stage's inputs, received activations and gradients go: the stage's own
        self.device = device if device is not None else _device_of(chunks)
        self.num_classes = num_classes  # when given, targets are class indices, checked
        p, m, v = self.num_stages, num_microbatches, len(chunks)
        self.num_virtual = p * v
        self.schedule = interleaved_1f1b(p, m, v) if schedule == "interleaved" else \
            SCHEDULES[schedule](p, m)
        self.links = Links(comm)
        self._order = self._timeline()
        self.timeline: List[Tuple[Tuple, float, float]] = []
        self.peak_activation_bytes = 0
        self._agreed: Set[Tuple] = set()  # batch shapes and dtypes the stages agreed on

    def parameters(self) -> List[Tensor]:
        """This stage's parameters (all its chunks), deduplicated by identity."""
        return list({id(p): p for c in self.chunks for p in c.parameters()}.values())

    def _timeline(self) -> List[Tuple[str, str, int, int]]:
        """This rank's computations and messages, in the simulated timeline's order."""
        p, nv = self.num_stages, self.num_virtual
        sim = simulate(self.schedule, num_virtual=nv)
        end = {(a[0], a[1], virtual_stage(s, a, p)): e
               for s, ev in enumerate(sim.events) for a, _, e in ev}
        items = []
        for act, start, stop in sim.events[self.stage]:
            kind, mb, k = act[0], act[1], virtual_stage(self.stage, act, p)
            if kind == "F" and k > 0:
                items.append(((end[("F", mb, k - 1)], 0, k - 1, mb), ("recv", "F", mb, k)))
            if kind == "B" and k < nv - 1:
                items.append(((end[("B", mb, k + 1)], 1, k + 1, mb), ("recv", "B", mb, k)))
            items.append(((start, 2, k, mb), ("run", kind, mb, k)))
            if kind == "F" and k < nv - 1:
                items.append(((stop, 0, k, mb), ("send", "F", mb, k)))
            if kind == "B" and k > 0:
                items.append(((stop, 1, k, mb), ("send", "B", mb, k)))
        items.sort(key=lambda it: it[0])
        return [it[1] for it in items]

    def train_step(self, x: Any, y: Any) -> float:
        """Forward and backward of the batch (x, y); leaves summed gradients in ``.grad``."""
        step = self._start_step(x, y)
        for what, kind, mb, k in self._order:
            if what == "run" and kind == "F":
                self._forward(step, mb, k)
            elif what == "run":
                self._backward(step, mb, k)
            else:
                self._message(step, what, kind, mb, k)
        self.links.wait_all()
        for q in step.params:
            q.grad = (Tensor(step.acc[id(q)], device=self.device, dtype=q.dtype,
                             requires_grad=False)
                      if id(q) in step.acc else None)
        total = np.array([sum(step.losses)], dtype=np.float64)
        if self.num_stages > 1:
            total = self.comm.broadcast(total, root=(self.num_virtual - 1) % self.num_stages,
                                        label="pp.loss")
        return float(total[0])

    def _start_step(self, x: Any, y: Any) -> "_Step":
        """Check the batch, cut it into microbatches and reset the step's records."""
        x, y = host_array(x), host_array(y)
        self._check_batch(x, y)
        self._agree_batch(x, y)
        self.timeline, self.peak_activation_bytes = [], 0
        m = self.num_microbatches
        return _Step(np.split(x, m), np.split(y, m), self.parameters())

    def _check_batch(self, x: np.ndarray, y: np.ndarray) -> None:
        """On every stage, before any message: what only the first or last stage would
        find (a batch that does not split, non-numbers, a class index out of range)."""
        m, where = self.num_microbatches, "PipelineParallel" + on_rank(self.comm)
        for name, a in (("inputs", x), ("targets", y)):
            if a.ndim == 0 or a.dtype.kind not in "biuf":
                raise TypeError(f"{where}: {name} must be a numeric batch, got dtype {a.dtype} "
                                f"and shape {a.shape}")
        if x.shape[0] % m or y.shape[0] != x.shape[0]:
            raise ValueError(f"{m} microbatches do not divide the batch of {x.shape[0]} "
                             f"(targets: {y.shape[0]}){on_rank(self.comm)}")
        if self.loss_fn is None and self.stage == (self.num_virtual - 1) % self.num_stages:
            raise ValueError("PipelineParallel: the last stage computes the loss, so it needs "
                             f"loss_fn (rank {self.stage})")
        if self.num_classes is not None:  # the serial SoftmaxLoss's label checks
            check_indices(y, self.num_classes, self.comm, "PipelineParallel targets")

    def _agree_batch(self, x: np.ndarray, y: np.ndarray) -> None:
        """On the first step of each batch shape: every stage holds the same batch (one
        allgather of three int64); later steps of that shape send nothing."""
        key = (x.shape, x.dtype.str, y.shape, y.dtype.str)
        if key not in self._agreed:
            agree_inputs(self.comm, "PipelineParallel.train_step", {
                "batch": x.shape[0], "inputs (CRC-32)": checksum(x),
                "targets (CRC-32)": checksum(y)}, "pp.agree")
            self._agreed.add(key)

    def _message(self, step: "_Step", what: str, kind: str, mb: int, k: int) -> None:
        """Receive or send virtual stage k's activation ("F") or input gradient ("B")."""
        p = self.num_stages
        if what == "recv" and kind == "F":
            step.inbox[(kind, mb, k)] = self.links.recv((k - 1) % p, ACTIVATION)
        elif what == "recv":
            step.inbox[(kind, mb, k)] = self.links.recv((k + 1) % p, GRADIENT)
        elif kind == "F":
            self.links.send(step.stored[(mb, k)][1].numpy(), (k + 1) % p, ACTIVATION)
        else:
            self.links.send(step.stored.pop((mb, k))[0].grad.numpy(), (k - 1) % p, GRADIENT)

    def _forward(self, step: "_Step", mb: int, k: int) -> None:
        """Forward of microbatch mb through virtual stage k (plus the loss on the last one)."""
        t0 = time.perf_counter()
        if k == 0:
            xb = step.xs[mb]  # token ids stay integers
            inp = Tensor(xb, dtype=xb.dtype.name if xb.dtype.kind in "iu" else step.dtype,
                         device=self.device, requires_grad=False)
        else:
            inp = Tensor(step.inbox.pop(("F", mb, k)), device=self.device, dtype=step.dtype,
                         requires_grad=True)
        out = self.chunks[k // self.num_stages](inp)
        if k == self.num_virtual - 1:
            assert self.loss_fn is not None  # _check_batch refused a last stage without one
            yb = step.ys[mb]
            out = self.loss_fn(out, Tensor(yb, device=self.device, dtype=yb.dtype.name,
                                           requires_grad=False)) * (
                1.0 / self.num_microbatches)
            step.losses.append(float(out.numpy()))
        nbytes = _graph_bytes(out, step.pids)
        step.stored[(mb, k)] = (inp, out, nbytes)
        step.live += nbytes
        self.peak_activation_bytes = max(self.peak_activation_bytes, step.live)
        self.timeline.append((("F", mb, k // self.num_stages), t0, time.perf_counter()))

    def _backward(self, step: "_Step", mb: int, k: int) -> None:
        """Backward of microbatch mb through virtual stage k; adds to the summed gradients."""
        t0 = time.perf_counter()
        chunk = self.chunks[k // self.num_stages]
        inp, out, nbytes = step.stored[(mb, k)]
        for q in chunk.parameters():
            q.grad = None
        if k == self.num_virtual - 1:
            out.backward(create_graph=False)
        else:
            g = Tensor(step.inbox.pop(("B", mb, k)), device=self.device, dtype=out.dtype,
                       requires_grad=False)
            out.backward(g, create_graph=False)
        for q in chunk.parameters():
            if q.grad is not None:
                grad = q.grad.numpy()
                step.acc[id(q)] = step.acc[id(q)] + grad if id(q) in step.acc else grad.copy()
        step.live -= nbytes
        if k > 0:
            step.stored[(mb, k)] = (inp, None, 0)   # keep the input's grad for the send
        else:
            del step.stored[(mb, k)]
        self.timeline.append((("B", mb, k // self.num_stages), t0, time.perf_counter()))

    def gather_timeline(self) -> List[List[Tuple[Tuple, float, float]]]:
        """Every stage's recorded timeline (seconds from the earliest start), on every rank."""
        rows = np.array([[0 if a[0] == "F" else 1, a[1], a[2], t0, t1]
                         for a, t0, t1 in self.timeline], dtype=np.float64)
        allrows = (self.comm.allgather(rows, label="pp.timeline") if self.num_stages > 1
                   else rows)
        origin = allrows[:, 3].min()
        n = len(rows)
        return [[((("F", "B")[int(r[0])], int(r[1]), int(r[2])), r[3] - origin, r[4] - origin)
                 for r in allrows[s * n:(s + 1) * n]] for s in range(self.num_stages)]
