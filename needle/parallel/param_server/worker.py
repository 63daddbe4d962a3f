"""The worker role: ``pull`` parameters, compute gradients, ``push`` them, ``clock``;
``train_worker`` adds fault injection (a straggler, or a silently crashed worker)."""
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from ...autograd import Tensor
from ..comm.engine.convert import host_view, to_tensor
from ..comm.protocol import Comm
from .messages import CLOCK, DONE, PAYLOAD, PULL, PUSH, REQUEST, header, recv_reply

__all__ = ["Worker", "train_worker"]


class Worker:
    """A worker's connection to the servers: which server owns which key, and its clock."""

    def __init__(self, comm: Comm, keys: Dict[str, int], server_of: Dict[int, int],
                 servers: List[int]) -> None:
        self.comm, self.keys, self.server_of, self.servers = comm, keys, server_of, servers
        self.clock_value = 0

    def _key(self, key: Any) -> int:
        if isinstance(key, (int, np.integer)) and int(key) in self.server_of:
            return int(key)
        if key not in self.keys:
            raise KeyError(f"parameter server: unknown key {key!r}")
        return self.keys[key]

    def pull(self, key: Any) -> np.ndarray:
        """The server's current value of ``key`` (waits as long as consistency requires)."""
        k = self._key(key)
        server = self.server_of[k]
        self.comm.send(header(PULL, k, self.clock_value), server, REQUEST)
        _, value = recv_reply(self.comm, server)
        return value

    def push(self, key: Any, grad: Any) -> None:
        """Send this iteration's gradient of ``key`` to its server."""
        k = self._key(key)
        server = self.server_of[k]
        data = np.ascontiguousarray(host_view(grad) if isinstance(grad, Tensor) else grad)
        self.comm.send(header(PUSH, k, self.clock_value), server, REQUEST)
        self.comm.send(data, server, PAYLOAD)

    def clock(self) -> None:
        """Finish this iteration (SSP's ``clock()``): tell every server."""
        self.clock_value += 1
        for s in self.servers:
            self.comm.send(header(CLOCK, -1, self.clock_value), s, REQUEST)

    def finish(self) -> None:
        """This worker is done training."""
        for s in self.servers:
            self.comm.send(header(DONE, -1, self.clock_value), s, REQUEST)


def train_worker(ps: Any, model: Any, loss_fn: Callable[..., Tensor],
                 batches: Iterator[Tuple[Tensor, ...]], steps: int, delay_factor: float = 1.0,
                 stop_after: Optional[int] = None, delay_probability: float = 1.0,
                 seed: int = 0) -> List[Tuple[float, float]]:
    """Train ``steps`` iterations through the parameter server; (seconds, loss) per step."""
    if delay_factor < 1:
        raise ValueError(f"delay_factor must be >= 1 (1 = no delay), got {delay_factor}")
    named = list(model.named_parameters())
    rng = np.random.default_rng(seed)
    history: List[Any] = []
    start = time.perf_counter()
    for step in range(steps):
        if stop_after is not None and step == stop_after:
            return history  # a crash: no finish(), the servers must notice the silence
        for name, p in named:
            value = ps.pull(name)
            p.cached_data = to_tensor(value, p.device, p.dtype).cached_data
        t0 = time.perf_counter()
        loss = loss_fn(model, *next(batches))
        for _, p in named:
            p.grad = None
        loss.backward(create_graph=False)
        for name, p in named:
            if p.requires_grad:
                ps.push(name, p.grad if p.grad is not None else np.zeros(p.shape, p.dtype))
        if delay_factor > 1 and rng.random() < delay_probability:  # its own work, f times
            time.sleep((delay_factor - 1) * (time.perf_counter() - t0))
        ps.clock()
        history.append((time.perf_counter() - start, float(loss.numpy())))
    ps.finish()
    return history
