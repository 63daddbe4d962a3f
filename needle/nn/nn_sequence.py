"""Recurrent layers and embeddings (course hw4): RNNCell, RNN, LSTMCell, LSTM, Embedding.

Sequences are time-major: input (seq_len, bs, input_size), hidden (num_layers, bs, hidden_size).
The multi-layer modules compute each layer's input projection for all time steps with one
matmul ((seq_len*bs, in) @ W_ih) and loop in Python only over the recurrent h @ W_hh part.
"""
import math
from typing import Any, Optional, Tuple

from .. import init, numbers, ops
from ..autograd import Tensor
from ..backend_ndarray import BackendDevice
from .nn_basic import _check_flag
from .nn_module import Module, Parameter

__all__ = ["RNNCell", "RNN", "LSTMCell", "LSTM", "Embedding"]


def _uniform(*shape: int, k: float, device: Optional[BackendDevice], dtype: str) -> Parameter:
    return Parameter(init.rand(*shape, low=-k, high=k, device=device, dtype=dtype))


class _Cell(Module):
    """Shared parts of RNNCell/LSTMCell: W_ih (in, G*h), W_hh (h, G*h), biases (G*h,)."""

    gates = 1

    def __init__(self, input_size: int, hidden_size: int, bias: bool,
                 device: Optional[BackendDevice], dtype: str) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        k = 1.0 / math.sqrt(hidden_size)
        n = self.gates * hidden_size
        self.W_ih = _uniform(input_size, n, k=k, device=device, dtype=dtype)
        self.W_hh = _uniform(hidden_size, n, k=k, device=device, dtype=dtype)
        self.bias_ih = _uniform(n, k=k, device=device, dtype=dtype) if bias else None
        self.bias_hh = _uniform(n, k=k, device=device, dtype=dtype) if bias else None

    def project(self, X: Tensor) -> Tensor:
        """X @ W_ih + bias_ih + bias_hh for X of shape (..., input_size)."""
        if X.shape[-1] != self.input_size:
            raise ValueError(f"{type(self).__name__}: expected input (..., {self.input_size}), "
                             f"got {X.shape}")
        out = X @ self.W_ih
        if self.bias_ih is not None:
            out = out + (self.bias_ih + self.bias_hh).broadcast_to(out.shape)
        return out

    def _zeros(self, X: Tensor) -> Tensor:
        return init.zeros(X.shape[-2], self.hidden_size, device=X.device, dtype=X.dtype)


class RNNCell(_Cell):
    """h' = tanh(X W_ih + b_ih + h W_hh + b_hh) (or relu)."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: str = "tanh", device: Optional[BackendDevice] = None,
                 dtype: str = "float32") -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNNCell nonlinearity must be 'tanh' or 'relu', got "
                             f"{nonlinearity!r}")
        super().__init__(input_size, hidden_size, bias, device, dtype)
        self.nonlinearity = nonlinearity

    def step(self, xp: Tensor, h: Tensor) -> Tensor:
        """One update from a precomputed input projection ``xp`` (bs, hidden)."""
        ### BEGIN YOUR SOLUTION (hw4.nn.rnn)
        z = xp + h @ self.W_hh
        return ops.tanh(z) if self.nonlinearity == "tanh" else ops.relu(z)
        ### END YOUR SOLUTION

    def forward(self, X: Tensor, h: Optional[Tensor] = None) -> Tensor:
        """X (bs, input_size), h (bs, hidden_size) or None (zeros) -> h' (bs, hidden_size)."""
        return self.step(self.project(X), self._zeros(X) if h is None else h)


class LSTMCell(_Cell):
    """LSTM cell, gates (i, f, g, o) as in torch (Hochreiter & Schmidhuber, 1997)."""

    gates = 4

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 device: Optional[BackendDevice] = None, dtype: str = "float32") -> None:
        super().__init__(input_size, hidden_size, bias, device, dtype)

    def step(self, xp: Tensor, h: Tensor, c: Tensor) -> Tuple[Tensor, Tensor]:
        """One update from a precomputed input projection ``xp`` (bs, 4*hidden)."""
        ### BEGIN YOUR SOLUTION (hw4.nn.rnn)
        bs = xp.shape[0]
        gates = (xp + h @ self.W_hh).reshape((bs, 4, self.hidden_size))
        i, f, g, o = ops.split(gates, axis=1)
        i, f, g, o = ops.sigmoid(i), ops.sigmoid(f), ops.tanh(g), ops.sigmoid(o)
        c_new = f * c + i * g
        return o * ops.tanh(c_new), c_new
        ### END YOUR SOLUTION

    def forward(self, X: Tensor, h: Optional[Tuple[Tensor, Tensor]] = None
                ) -> Tuple[Tensor, Tensor]:
        """X (bs, input_size), h = (h0, c0) each (bs, hidden) or None -> (h', c')."""
        h0, c0 = (self._zeros(X), self._zeros(X)) if h is None else h
        return self.step(self.project(X), h0, c0)


def _check_seq(X: Tensor, input_size: int, name: str) -> None:
    if X.ndim != 3 or X.shape[2] != input_size:
        raise ValueError(f"{name} expects input (seq_len, bs, {input_size}), got {X.shape}")
    if X.shape[0] == 0:
        raise ValueError(f"{name} got an input of no time steps, shape {X.shape}")


def _check_state(h: Any, want: Tuple[int, int, int], name: str, what: str) -> None:
    """A state (num_layers, bs, hidden) of the wrong shape broadcast wrongly or, with fewer
    layers, silently ran only the layers it had (zip)."""
    if not isinstance(h, Tensor):
        raise TypeError(f"{name}: {what} must be a Tensor {want}, got {type(h).__name__}")
    if tuple(h.shape) != want:
        raise ValueError(f"{name}: {what} must have shape (num_layers, bs, hidden) = {want}, "
                         f"got {tuple(h.shape)}")


def _sizes(cls: str, input_size: Any, hidden_size: Any, num_layers: Any, bias: Any
           ) -> Tuple[int, int, int]:
    _check_flag(cls, "bias", bias)
    return (numbers.count_arg(input_size, f"{cls}: input_size", lo=1),
            numbers.count_arg(hidden_size, f"{cls}: hidden_size", lo=1),
            numbers.count_arg(num_layers, f"{cls}: num_layers", lo=1))


def _layer_inputs(cell: _Cell, X: Tensor) -> list:
    """The input projection of every time step, from one matmul: list of (bs, G*hidden)."""
    seq_len, bs, _ = X.shape
    xp = cell.project(X.reshape((seq_len * bs, X.shape[2])))
    return list(ops.split(xp.reshape((seq_len, bs, xp.shape[-1])), axis=0))


class RNN(Module):
    """Multi-layer Elman RNN over time-major sequences."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 nonlinearity: str = "tanh", device: Optional[BackendDevice] = None,
                 dtype: str = "float32") -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.num_layers = _sizes(
            "RNN", input_size, hidden_size, num_layers, bias)
        self.rnn_cells = [RNNCell(self.input_size if i == 0 else self.hidden_size,
                                  self.hidden_size, bias, nonlinearity, device, dtype)
                          for i in range(self.num_layers)]

    def forward(self, X: Tensor, h0: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """X (seq_len, bs, input), h0 (num_layers, bs, hidden) -> (output (seq_len, bs,
        hidden), h_n (num_layers, bs, hidden)); h0 None means zeros."""
        _check_seq(X, self.input_size, "RNN")
        bs = X.shape[1]
        if h0 is not None:
            _check_state(h0, (self.num_layers, bs, self.hidden_size), "RNN", "h0")
        hs = [None] * self.num_layers if h0 is None else list(ops.split(h0, axis=0))
        ### BEGIN YOUR SOLUTION (hw4.nn.rnn)
        h_n = []
        for cell, h in zip(self.rnn_cells, hs):
            h = init.zeros(bs, self.hidden_size, device=X.device, dtype=X.dtype) if h is None else h
            outputs = []
            for xp in _layer_inputs(cell, X):
                h = cell.step(xp, h)
                outputs.append(h)
            X = ops.stack(outputs, 0)
            h_n.append(h)
        return X, ops.stack(h_n, 0)
        ### END YOUR SOLUTION


class LSTM(Module):
    """Multi-layer LSTM over time-major sequences."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 device: Optional[BackendDevice] = None, dtype: str = "float32") -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.num_layers = _sizes(
            "LSTM", input_size, hidden_size, num_layers, bias)
        self.lstm_cells = [LSTMCell(self.input_size if i == 0 else self.hidden_size,
                                    self.hidden_size, bias, device, dtype)
                           for i in range(self.num_layers)]

    def forward(self, X: Tensor, h: Optional[Tuple[Tensor, Tensor]] = None
                ) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        """X (seq_len, bs, input), h = (h0, c0) each (num_layers, bs, hidden) ->
        (output (seq_len, bs, hidden), (h_n, c_n)); h None means zeros."""
        _check_seq(X, self.input_size, "LSTM")
        bs = X.shape[1]
        hs = cs = [None] * self.num_layers  # read only (zip below)
        if h is not None:
            if not isinstance(h, (tuple, list)) or len(h) != 2:
                raise TypeError(f"LSTM: h must be a pair (h0, c0), got {type(h).__name__}")
            for what, x in zip(("h0", "c0"), h):
                _check_state(x, (self.num_layers, bs, self.hidden_size), "LSTM", what)
            hs, cs = list(ops.split(h[0], axis=0)), list(ops.split(h[1], axis=0))
        ### BEGIN YOUR SOLUTION (hw4.nn.rnn)
        h_n, c_n = [], []
        for cell, h_l, c_l in zip(self.lstm_cells, hs, cs):
            zeros = init.zeros(bs, self.hidden_size, device=X.device, dtype=X.dtype)
            h_l = zeros if h_l is None else h_l
            c_l = zeros if c_l is None else c_l
            outputs = []
            for xp in _layer_inputs(cell, X):
                h_l, c_l = cell.step(xp, h_l, c_l)
                outputs.append(h_l)
            X = ops.stack(outputs, 0)
            h_n.append(h_l)
            c_n.append(c_l)
        return X, (ops.stack(h_n, 0), ops.stack(c_n, 0))
        ### END YOUR SOLUTION


class Embedding(Module):
    """Lookup table: indices (seq_len, bs) -> vectors (seq_len, bs, embedding_dim).

    As in the course the lookup is one_hot(x) @ weight, so its gradient is a plain matmul
    (the hw4 exercise). ``gather=True`` uses ``ops.embedding`` instead: rows are gathered and
    their gradient scatter-added, with no (n, num_embeddings) one-hot matrix or matmul; the
    language models use it.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 device: Optional[BackendDevice] = None, dtype: str = "float32",
                 gather: bool = False) -> None:
        super().__init__()
        num_embeddings = numbers.count_arg(num_embeddings, "Embedding: num_embeddings", lo=1)
        embedding_dim = numbers.count_arg(embedding_dim, "Embedding: embedding_dim", lo=1)
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.gather = gather
        self.weight = Parameter(init.randn(num_embeddings, embedding_dim, device=device,
                                           dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        """Exercise hw4.nn.embedding: x of integer indices (any shape) -> x.shape + (dim,), as
        ``init.one_hot(num_embeddings, x flattened) @ weight`` (so the gradient is a matmul)."""
        if self.gather:
            return ops.embedding(self.weight, x)
        ### BEGIN YOUR SOLUTION (hw4.nn.embedding)
        shape = tuple(x.shape)
        n = math.prod(shape)
        one_hot = init.one_hot(self.num_embeddings, x.reshape((n,)), device=self.weight.device,
                               dtype=self.weight.dtype)
        return (one_hot @ self.weight).reshape(shape + (self.embedding_dim,))
        ### END YOUR SOLUTION
