"""The parameter-server job the fault tests share: one linear layer, an ASP server, a worker
loop over the same batch (``pause`` runs before each batch, e.g. a long computation)."""
from typing import Any, Callable, Iterator, Optional, Tuple

import numpy as np

import needle as ndl
from needle import nn
from needle.parallel import ParameterServer


def tiny_asp_job(comm: Any, timeout: float, pause: Optional[Callable[[], None]] = None
                 ) -> Tuple[ParameterServer, nn.Module, Iterator, Callable]:
    """(server, model, endless batches, loss function), seeded the same on every rank."""
    np.random.seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    ps = ParameterServer(comm, model, ndl.optim.SGD, consistency="asp", timeout=timeout, lr=0.1)
    x, y = np.random.randn(8, 4).astype("float32"), np.arange(8) % 3

    def batches() -> Iterator:
        while True:
            if pause is not None:
                pause()
            yield ndl.Tensor(x), ndl.Tensor(y)

    def loss(m: nn.Module, a: ndl.Tensor, b: ndl.Tensor) -> ndl.Tensor:
        return nn.SoftmaxLoss()(m(a), b)
    return ps, model, batches(), loss
