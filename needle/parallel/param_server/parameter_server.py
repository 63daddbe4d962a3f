"""A parameter server (Li et al., OSDI 2014): the first rank(s) serve parameters and apply the
optimizer, the others push gradients and pull parameters; keys dealt round-robin to servers."""
import atexit
import math
import sys
from typing import Any, Dict, List, Optional

from ..comm.agree import agree, optimizer_settings
from ..comm.protocol import Comm
from ..data_parallel.replicas import check_same_shapes, replicate_from_rank0
from .consistency import staleness_of
from .server import Server, ServerEvent
from .worker import Worker

__all__ = ["ParameterServer"]


def _end_job(comm: Comm, dead: List[int], timeout: float) -> None:
    """At exit: abort the job, naming the workers presumed dead (they may be stuck, alive)."""
    sys.stderr.write(f"needle.parallel: parameter server (rank {comm.rank}): worker ranks "
                     f"{dead} were presumed dead (silent for {timeout:g} s); training went on "
                     "without them, and the job is aborted so that it cannot wait for them\n")
    sys.stderr.flush()
    comm.abort(3)


class ParameterServer:
    """This rank's role in a parameter-server job (server or worker) over ``model``'s keys."""

    def __init__(self, comm: Comm, model: Any, optimizer_class: Any, num_servers: int = 1,
                 consistency: str = "bsp", staleness: Optional[int] = None,
                 timeout: float = 30.0, **optimizer_kwargs: Any) -> None:
        s = staleness_of(consistency, staleness)
        if not isinstance(num_servers, int) or not 1 <= num_servers < comm.size:
            raise ValueError(f"parameter server (rank {comm.rank}): num_servers must be in "
                             f"1..{comm.size - 1} so that some ranks are workers, got "
                             f"{num_servers!r}")
        if not 0 < timeout < math.inf:  # inf: a worker waits for ever on a server that died
            raise ValueError(f"parameter server (rank {comm.rank}): timeout must be a finite "
                             f"number > 0, got {timeout!r}")
        agree(comm, "ParameterServer", dict(
            {"consistency": consistency, "staleness": s, "num_servers": num_servers,
             "timeout": timeout}, **optimizer_settings((optimizer_class, optimizer_kwargs))))
        self.comm, self.consistency, self.staleness = comm, consistency, s
        named = list(model.named_parameters())
        check_same_shapes(comm, named, "ParameterServer")
        replicate_from_rank0(model, comm, "ParameterServer")
        self.keys: Dict[str, int] = {name: i for i, (name, _) in enumerate(named)}
        self.servers = list(range(num_servers))
        self.workers = list(range(num_servers, comm.size))
        server_of = {i: i % num_servers for i in range(len(named))}
        self.is_server = comm.rank < num_servers
        self._server: Optional[Server] = None
        self._worker: Optional[Worker] = None
        if self.is_server:
            mine = {i: p for i, (_, p) in enumerate(named) if server_of[i] == comm.rank}
            names = {i: n for i, (n, _) in enumerate(named)}
            optimizer = optimizer_class(list(mine.values()), **optimizer_kwargs)
            self._server = Server(comm, mine, names, self.workers, s, optimizer, timeout)
        else:
            self._worker = Worker(comm, self.keys, server_of, self.servers)

    # -- servers ---------------------------------------------------------------------------
    def serve(self) -> List[ServerEvent]:
        """Run the server loop; returns its log. Under MPI a presumed-dead worker aborts the job at
        exit (a stuck one would keep ``mpiexec`` waiting forever)."""
        if self._server is None:
            raise RuntimeError(f"rank {self.comm.rank} is a worker, not a server")
        log = self._server.serve()
        dead = sorted(self._server.table.dead)
        if dead and hasattr(self.comm.transport, "comm"):  # MPI: a process we cannot join
            atexit.register(_end_job, self.comm, dead, self._server.timeout)
        return log

    # -- workers ---------------------------------------------------------------------------
    def _as_worker(self) -> Worker:
        if self._worker is None:
            raise RuntimeError(f"rank {self.comm.rank} is a server: push/pull are for workers")
        return self._worker

    def pull(self, key: Any) -> Any:
        """The current value of parameter ``key`` (a name), as far as consistency allows."""
        return self._as_worker().pull(key)

    def push(self, key: Any, grad: Any) -> None:
        """Send the gradient of parameter ``key`` for this iteration."""
        self._as_worker().push(key, grad)

    def clock(self) -> None:
        """End this worker's iteration."""
        self._as_worker().clock()

    def finish(self) -> None:
        """This worker leaves training."""
        self._as_worker().finish()

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    def __repr__(self) -> str:
        role = "server" if self.is_server else "worker"
        bound = {0: "BSP", float("inf"): "ASP"}.get(self.staleness, f"SSP(s={self.staleness})")
        return (f"ParameterServer({role}, rank {self.comm.rank} of {self.comm.size}, {bound}, "
                f"{len(self.servers)} server(s), {len(self.keys)} keys)")
