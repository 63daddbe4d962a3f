"""Run one training step of a pipeline: microbatches flow through stages by a schedule.

Each rank of ``comm`` is one stage and holds its layers (``stage_module``; a list of v chunks for
the interleaved schedule). ``train_step(x, y)`` cuts the batch into m microbatches and runs this
stage's actions from ``schedules.py``: a forward receives the previous stage's activation and
sends its output on; a backward receives the gradient of its output and sends the gradient of
its input back (GPipe, Huang et al. arXiv:1811.06965; 1F1B and interleaved 1F1B, Narayanan et
al. arXiv:2104.04473). Parameter gradients are summed over microbatches and the loss is each
microbatch's loss / m, so the step equals the full-batch step of the serial model when the loss
is a mean. The loss is returned on every rank.

Messages are ordered by the schedule's simulated timeline (``_plan``): every rank handles its
sends, receives and computations in increasing simulated time, a single order shared by both
ends of every link, so no schedule can deadlock, even if every send were synchronous (they are
nonblocking here, ``p2p.py``).
The real start and end of each computation is recorded in ``timeline``.
"""
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ...autograd import Tensor, find_topo_sort
from ...nn.nn_module import Module
from ..comm.agree import agree
from .p2p import ACTIVATION, GRADIENT, Links
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


class _StepState:
    """One ``train_step``'s working state: microbatches, messages received, graphs kept."""

    def __init__(self, xs: List[np.ndarray], ys: List[np.ndarray], params: List[Tensor]) -> None:
        self.xs, self.ys = xs, ys
        self.pids = {id(q) for q in params}
        self.dtype = params[0].dtype if params else "float32"
        self.acc: Dict[int, np.ndarray] = {}
        self.inbox: Dict[Tuple[str, int, int], np.ndarray] = {}
        self.stored: Dict[Tuple[int, int], Tuple[Tensor, Any, int]] = {}  # out: None once used
        self.losses: List[float] = []
        self.live = 0


class PipelineParallel:
    """This rank's stage of a pipeline-parallel model, and the step that drives it."""

    def __init__(self, stage_module: Union[Module, Sequence[Module]], comm: Any,
                 num_microbatches: int, schedule: str = "1f1b",
                 loss_fn: Optional[Callable[[Tensor, Tensor], Tensor]] = None) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {schedule!r}")
        chunks = list(stage_module) if isinstance(stage_module, (list, tuple)) else [stage_module]
        if schedule != "interleaved" and len(chunks) != 1:
            raise ValueError(f"schedule {schedule!r} runs one module per stage, got {len(chunks)}")
        agree(comm, "PipelineParallel", {"num_microbatches": num_microbatches,
                                         "schedule": schedule, "chunks_per_stage": len(chunks)})
        self.comm, self.chunks, self.schedule_name = comm, chunks, schedule
        self.num_stages, self.stage = comm.size, comm.rank
        self.num_microbatches, self.loss_fn = num_microbatches, loss_fn
        p, m, v = self.num_stages, num_microbatches, len(chunks)
        self.num_virtual = p * v
        if schedule == "interleaved":
            self.schedule = interleaved_1f1b(p, m, v)
        else:
            self.schedule = SCHEDULES[schedule](p, m)
        self.links = Links(comm)
        self._plan_items = self._plan()
        self.timeline: List[Tuple[Tuple, float, float]] = []
        self.peak_activation_bytes = 0

    def parameters(self) -> List[Tensor]:
        """This stage's parameters (all its chunks), deduplicated by identity."""
        seen, out = set(), []
        for c in self.chunks:
            for p in c.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def _plan(self) -> List[Tuple[str, Tuple]]:
        """This rank's computations and messages, in the simulated timeline's order."""
        p, nv = self.num_stages, self.num_virtual
        sim = simulate(self.schedule, num_virtual=nv)
        end = {}
        for s, ev in enumerate(sim.events):
            for a, _, e in ev:
                end[(a[0], a[1], virtual_stage(s, a, p))] = e
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
        x = np.asarray(x.numpy() if hasattr(x, "numpy") else x)
        y = np.asarray(y.numpy() if hasattr(y, "numpy") else y)
        m, p, nv = self.num_microbatches, self.num_stages, self.num_virtual
        if x.shape[0] % m or y.shape[0] != x.shape[0]:
            raise ValueError(f"{m} microbatches do not divide the batch of {x.shape[0]} "
                             f"(targets: {y.shape[0]})")
        params = self.parameters()
        st = _StepState(np.split(x, m), np.split(y, m), params)
        self.timeline, self.peak_activation_bytes = [], 0
        for what, kind, mb, k in self._plan_items:
            if what == "run":
                t0 = time.perf_counter()
                (self._forward if kind == "F" else self._backward)(st, mb, k)
                self.timeline.append(((kind, mb, k // p), t0, time.perf_counter()))
            else:
                self._message(st, what, kind, mb, k)
        self.links.wait_all()
        for q in params:
            q.grad = (Tensor(st.acc[id(q)], dtype=q.dtype, requires_grad=False)
                      if id(q) in st.acc else None)
        total = np.array([sum(st.losses)], dtype=np.float64)
        if p > 1:
            total = self.comm.broadcast(total, root=(nv - 1) % p, label="pp.loss")
        return float(total[0])

    def _message(self, st: "_StepState", what: str, kind: str, mb: int, k: int) -> None:
        """Receive or send microbatch mb's activation (F) or gradient (B) of virtual stage k."""
        p = self.num_stages
        if what == "recv":
            src, tag = ((k - 1) % p, ACTIVATION) if kind == "F" else ((k + 1) % p, GRADIENT)
            st.inbox[(kind, mb, k)] = self.links.recv(src, tag)
        elif kind == "F":
            self.links.send(st.stored[(mb, k)][1].numpy(), (k + 1) % p, ACTIVATION)
        else:
            self.links.send(st.stored.pop((mb, k))[0].grad.numpy(), (k - 1) % p, GRADIENT)

    def _forward(self, st: "_StepState", mb: int, k: int) -> None:
        """Microbatch mb through virtual stage k (and the loss on the last); keep its graph."""
        if k == 0:
            x = st.xs[mb]
            inp = Tensor(x, dtype=x.dtype.name if x.dtype.kind in "iu" else st.dtype,
                         requires_grad=False)   # token ids stay integers
        else:
            inp = Tensor(st.inbox.pop(("F", mb, k)), dtype=st.dtype, requires_grad=True)
        out = self.chunks[k // self.num_stages](inp)
        if k == self.num_virtual - 1:
            y = st.ys[mb]
            out = self.loss_fn(out, Tensor(y, dtype=y.dtype.name, requires_grad=False)) * (
                1.0 / self.num_microbatches)
            st.losses.append(float(out.numpy()))
        nbytes = _graph_bytes(out, st.pids)
        st.stored[(mb, k)] = (inp, out, nbytes)
        st.live += nbytes
        self.peak_activation_bytes = max(self.peak_activation_bytes, st.live)

    def _backward(self, st: "_StepState", mb: int, k: int) -> None:
        """Backward of microbatch mb through virtual stage k; sum its parameter gradients.

        A function of its own so that its locals, which hold the microbatch's whole graph, go
        when it returns: left in ``train_step``'s loop they stayed alive until the next
        forward had finished, and a 1F1B stage held min(p - r, m) + 1 graphs, not min(p - r, m).
        """
        chunk = self.chunks[k // self.num_stages]
        inp, out, nbytes = st.stored[(mb, k)]
        for q in chunk.parameters():
            q.grad = None
        if k == self.num_virtual - 1:
            out.backward(create_graph=False)
        else:
            g = Tensor(st.inbox.pop(("B", mb, k)), dtype=out.dtype, requires_grad=False)
            out.backward(g, create_graph=False)
        for q in chunk.parameters():
            if q.grad is not None:
                gq = q.grad.numpy()
                st.acc[id(q)] = st.acc[id(q)] + gq if id(q) in st.acc else gq.copy()
        st.live -= nbytes
        if k > 0:
            st.stored[(mb, k)] = (inp, None, 0)   # keep the input's grad for the send
        else:
            del st.stored[(mb, k)]

    def gather_timeline(self) -> List[List[Tuple[Tuple, float, float]]]:
        """Every stage's recorded timeline (seconds from the earliest start), on every rank."""
        rows = np.array([[0 if a[0] == "F" else 1, a[1], a[2], t0, t1]
                         for a, t0, t1 in self.timeline], dtype=np.float64)
        allrows = (self.comm.allgather(rows, label="pp.timeline") if self.num_stages > 1
                   else rows)
        origin = allrows[:, 3].min()
        n = len(rows)
        out = []
        for s in range(self.num_stages):
            part = allrows[s * n:(s + 1) * n]
            out.append([((("F", "B")[int(r[0])], int(r[1]), int(r[2])), r[3] - origin,
                         r[4] - origin) for r in part])
        return out
