"""Run under mpiexec by test_faults_hang.py: an ASP parameter server whose worker rank 2 stops
answering after two steps (alive, stuck in a sleep) while rank 1 trains on."""
import time

import numpy as np

import needle as ndl
from needle import nn
from needle.parallel import ParameterServer, communicator
from needle.parallel.param_server.worker import train_worker


def main() -> None:
    comm = communicator.create()
    np.random.seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    ps = ParameterServer(comm, model, ndl.optim.SGD, consistency="asp", timeout=2.0, lr=0.1)
    x, y = np.random.randn(8, 4).astype("float32"), np.arange(8) % 3

    def batches():
        while True:
            yield ndl.Tensor(x), ndl.Tensor(y)

    def loss(m, a, b):
        return nn.SoftmaxLoss()(m(a), b)
    if ps.is_server:
        log = ps.serve()
        print("server done; presumed dead:", [e.worker for e in log if e.event == "dead"],
              flush=True)
    elif comm.rank == 2:
        train_worker(ps, model, loss, batches(), 6, stop_after=2)
        time.sleep(1000)  # stuck, not dead
    else:
        print("worker 1 trained", len(train_worker(ps, model, loss, batches(), 6)), "steps",
              flush=True)


if __name__ == "__main__":
    main()
