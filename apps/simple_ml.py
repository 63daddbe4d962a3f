"""The course's simple_ml: softmax regression and a two-layer net on MNIST (hw0 in plain NumPy,
hw1 in needle), and the training loops for CIFAR-10 (ResNet9) and Penn Treebank (hw4)."""
import functools
from typing import Any, Callable, Optional, Tuple

import numpy as np

import needle as ndl
from needle import nn
from needle.data import parse_mnist  # noqa: F401  (course: simple_ml.parse_mnist)

if __package__:  # imported as apps.<module>
    from .progress import Progress
else:  # the course's way: sys.path.append("./apps"); from <module> import *
    from progress import Progress


# ------------------------------------------------------------------------- hw0: plain NumPy
def add(x: Any, y: Any) -> Any:
    """x + y (hw0's first exercise: the submission workflow end to end)."""
    ### BEGIN YOUR SOLUTION (hw0.simple_ml.add)
    return x + y
    ### END YOUR SOLUTION


def softmax_loss_numpy(Z: np.ndarray, y: np.ndarray) -> float:
    """Mean cross-entropy of logits Z (B, k) and integer labels y (B,)."""
    ### BEGIN YOUR SOLUTION (hw0.simple_ml.softmax_loss)
    zmax = Z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(Z - zmax).sum(axis=1)) + zmax[:, 0]
    return float(np.mean(lse - Z[np.arange(Z.shape[0]), y]))
    ### END YOUR SOLUTION


def _softmax(Z: np.ndarray) -> np.ndarray:
    E = np.exp(Z - Z.max(axis=1, keepdims=True))
    return E / E.sum(axis=1, keepdims=True)


def softmax_regression_epoch(X: np.ndarray, y: np.ndarray, theta: np.ndarray, lr: float = 0.1,
                             batch: int = 100) -> None:
    """One epoch of minibatch SGD on softmax regression; updates ``theta`` (n, k) in place."""
    ### BEGIN YOUR SOLUTION (hw0.simple_ml.epochs)
    for i in range(0, X.shape[0], batch):
        xb, yb = X[i:i + batch], y[i:i + batch]
        G = _softmax(xb @ theta)
        G[np.arange(len(yb)), yb] -= 1
        theta -= lr * xb.T @ G / len(yb)
    ### END YOUR SOLUTION


def nn_epoch_numpy(X: np.ndarray, y: np.ndarray, W1: np.ndarray, W2: np.ndarray,
                   lr: float = 0.1, batch: int = 100) -> None:
    """One SGD epoch of logits = ReLU(X W1) W2 with hand-written backprop; updates in place."""
    ### BEGIN YOUR SOLUTION (hw0.simple_ml.epochs)
    for i in range(0, X.shape[0], batch):
        xb, yb = X[i:i + batch], y[i:i + batch]
        Z1 = np.maximum(xb @ W1, 0)
        G2 = _softmax(Z1 @ W2)
        G2[np.arange(len(yb)), yb] -= 1
        G1 = (Z1 > 0) * (G2 @ W2.T)
        W1 -= lr * xb.T @ G1 / len(yb)
        W2 -= lr * Z1.T @ G2 / len(yb)
    ### END YOUR SOLUTION


def loss_err_numpy(h: np.ndarray, y: np.ndarray) -> Tuple[float, float]:
    """(mean softmax loss, error rate) of logits h for labels y."""
    return softmax_loss_numpy(h, y), float(np.mean(h.argmax(axis=1) != y))


def train_softmax(X_tr: np.ndarray, y_tr: np.ndarray, X_te: np.ndarray, y_te: np.ndarray,
                  epochs: int = 10, lr: float = 0.5, batch: int = 100) -> Tuple[float, float]:
    """Softmax regression from zeros; returns the final (test loss, test error)."""
    theta = np.zeros((X_tr.shape[1], int(y_tr.max()) + 1), dtype=np.float32)
    for _ in range(epochs):
        softmax_regression_epoch(X_tr, y_tr, theta, lr=lr, batch=batch)
    return loss_err_numpy(X_te @ theta, y_te)


def train_nn_numpy(X_tr: np.ndarray, y_tr: np.ndarray, X_te: np.ndarray, y_te: np.ndarray,
                   hidden_dim: int = 500, epochs: int = 10, lr: float = 0.5,
                   batch: int = 100) -> Tuple[float, float]:
    """Two-layer net with the course's scaled-normal init; returns (test loss, test error)."""
    n, k = X_tr.shape[1], int(y_tr.max()) + 1
    np.random.seed(0)
    W1 = np.random.randn(n, hidden_dim).astype(np.float32) / np.sqrt(hidden_dim)
    W2 = np.random.randn(hidden_dim, k).astype(np.float32) / np.sqrt(k)
    for _ in range(epochs):
        nn_epoch_numpy(X_tr, y_tr, W1, W2, lr=lr, batch=batch)
    return loss_err_numpy(np.maximum(X_te @ W1, 0) @ W2, y_te)


# ------------------------------------------------------------------------- hw1: needle
def _numpy_calls_go_to(numpy_fn: Callable, arg: int, name: str) -> Callable:
    """hw0 and hw1 share this name: a NumPy array as argument ``arg`` (hw0's calls, e.g. its
    public tests) runs the NumPy version, anything else the needle one."""
    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def dispatch(*args: Any, **kwargs: Any) -> Any:
            value = args[arg] if len(args) > arg else kwargs.get(name)
            if isinstance(value, np.ndarray):
                return numpy_fn(*args, **kwargs)
            return fn(*args, **kwargs)
        return dispatch
    return wrap


@_numpy_calls_go_to(softmax_loss_numpy, 0, "Z")
def softmax_loss(Z: ndl.Tensor, y_one_hot: ndl.Tensor) -> ndl.Tensor:
    """Mean cross-entropy of logits Z (B, k) against one-hot labels, as a needle Tensor.

    Exercise hw1.simple_ml.softmax_loss, in needle ops: (log(exp(Z).sum(1)).sum() -
    (y_one_hot * Z).sum()) / B, a scalar Tensor."""
    ### BEGIN YOUR SOLUTION (hw1.simple_ml.softmax_loss)
    return (ndl.log(ndl.exp(Z).sum((1,))).sum() - (y_one_hot * Z).sum()) / Z.shape[0]
    ### END YOUR SOLUTION


@_numpy_calls_go_to(nn_epoch_numpy, 2, "W1")
def nn_epoch(X: np.ndarray, y: np.ndarray, W1: ndl.Tensor, W2: ndl.Tensor, lr: float = 0.1,
             batch: int = 100) -> Tuple[ndl.Tensor, ndl.Tensor]:
    """One SGD epoch of the two-layer net using needle autodiff; returns the new (W1, W2).

    Exercise hw1.simple_ml.nn_epoch. X (n, d) float32, y (n,) integer labels, W1 (d, h) and
    W2 (h, k) Tensors. Minibatches X[i:i + batch] in order (the last may be short); loss
    ``softmax_loss(relu(Xb @ W1) @ W2, one-hot yb)``; after its backward, W = W - lr * W.grad
    as new detached Tensors (on the NDArray data: no graph across steps)."""
    ### BEGIN YOUR SOLUTION (hw1.simple_ml.nn_epoch)
    k = W2.shape[1]
    for i in range(0, X.shape[0], batch):
        xb = ndl.Tensor(X[i:i + batch], requires_grad=False)
        yb = ndl.Tensor(np.eye(k, dtype=np.float32)[y[i:i + batch]], requires_grad=False)
        loss = softmax_loss(ndl.relu(xb @ W1) @ W2, yb)
        loss.backward()
        W1 = ndl.Tensor(W1.realize_cached_data() - lr * W1.grad.realize_cached_data())
        W2 = ndl.Tensor(W2.realize_cached_data() - lr * W2.grad.realize_cached_data())
    return W1, W2
    ### END YOUR SOLUTION


def loss_err(h: ndl.Tensor, y: np.ndarray) -> Tuple[float, float]:
    """(mean softmax loss, error rate) of needle logits h for integer labels y."""
    one_hot = ndl.Tensor(np.eye(h.shape[1], dtype=np.float32)[y], requires_grad=False)
    return float(softmax_loss(h, one_hot).numpy()), float(np.mean(h.numpy().argmax(1) != y))


# ------------------------------------------------------------------------- hw4: CIFAR-10
def _as_loss(loss_fn: Any) -> Any:
    return loss_fn() if isinstance(loss_fn, type) else loss_fn


def epoch_general_cifar10(dataloader: ndl.data.DataLoader, model: nn.Module,
                          loss_fn: Any = nn.SoftmaxLoss, opt: Optional[ndl.optim.Optimizer] = None,
                          progress: Optional[bool] = None) -> Tuple[float, float]:
    """One pass (training when ``opt`` is given); returns (accuracy, mean loss)."""
    loss_fn = _as_loss(loss_fn)
    model.train() if opt is not None else model.eval()
    correct, total_loss, n = 0, 0.0, 0
    bar = Progress(dataloader, total=len(dataloader), desc="train" if opt else "eval",
                   disable=None if progress is None else not progress)
    ### BEGIN YOUR SOLUTION (hw4.models)
    for X, y in bar:
        logits = model(X)
        loss = loss_fn(logits, y)
        if opt is not None:
            opt.reset_grad()
            loss.backward()
            opt.step()
        b = y.shape[0]
        lv = float(loss.numpy())
        correct += int((logits.numpy().argmax(axis=1) == y.numpy()).sum())
        total_loss += lv * b
        n += b
        bar.update(lv, b)
    ### END YOUR SOLUTION
    bar.close()
    return correct / n, total_loss / n


def train_cifar10(model: nn.Module, dataloader: ndl.data.DataLoader, n_epochs: int = 1,
                  optimizer: Any = ndl.optim.Adam, lr: float = 0.001, weight_decay: float = 0.001,
                  loss_fn: Any = nn.SoftmaxLoss,
                  progress: Optional[bool] = None) -> Tuple[float, float]:
    """Train for ``n_epochs``; returns the last epoch's (accuracy, mean loss)."""
    opt = optimizer(model.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(n_epochs):
        acc, loss = epoch_general_cifar10(dataloader, model, loss_fn, opt, progress)
    return acc, loss


def evaluate_cifar10(model: nn.Module, dataloader: ndl.data.DataLoader,
                     loss_fn: Any = nn.SoftmaxLoss,
                     progress: Optional[bool] = None) -> Tuple[float, float]:
    """(accuracy, mean loss) of ``model`` in eval mode."""
    return epoch_general_cifar10(dataloader, model, loss_fn, None, progress)


# ------------------------------------------------------------------------- hw4: PTB
def _detach_hidden(h: Any) -> Any:
    """Cut the graph between BPTT windows (truncated backpropagation through time)."""
    if h is None:
        return None
    if isinstance(h, (tuple, list, ndl.TensorTuple)):
        return tuple(_detach_hidden(x) for x in h)
    return h.detach()


def epoch_general_ptb(data: np.ndarray, model: nn.Module, seq_len: int = 40,
                      loss_fn: Any = nn.SoftmaxLoss(),  # noqa: B008 (the course's signature)
                      opt: Optional[ndl.optim.Optimizer] = None,
                      clip: Optional[float] = None, device: Any = None, dtype: str = "float32",
                      progress: Optional[bool] = None) -> Tuple[float, float]:
    """One pass over batchified ``data`` (nbatch, bs) in BPTT windows; (accuracy, mean loss)."""
    loss_fn = _as_loss(loss_fn)
    model.train() if opt is not None else model.eval()
    starts = range(0, data.shape[0] - 1, seq_len)
    bar = Progress(starts, total=len(starts), desc="train" if opt else "eval",
                   disable=None if progress is None else not progress)
    correct, total_loss, n, h = 0, 0.0, 0, None
    ### BEGIN YOUR SOLUTION (hw4.models)
    for i in bar:
        X, y = ndl.data.get_batch(data, i, seq_len, device=device, dtype=dtype)
        logits, h = model(X, h)
        loss = loss_fn(logits, y)
        if opt is not None:
            opt.reset_grad()
            loss.backward()
            if clip is not None:
                ndl.optim.clip_grad_norm_(model.parameters(), clip)
            opt.step()
        h = _detach_hidden(h)
        b = y.shape[0]
        lv = float(loss.numpy())
        correct += int((logits.numpy().argmax(axis=1) == y.numpy()).sum())
        total_loss += lv * b
        n += b
        bar.update(lv, b)
    ### END YOUR SOLUTION
    bar.close()
    return correct / n, total_loss / n


def train_ptb(model: nn.Module, data: np.ndarray, seq_len: int = 40, n_epochs: int = 1,
              optimizer: Any = ndl.optim.SGD, lr: float = 4.0, weight_decay: float = 0.0,
              loss_fn: Any = nn.SoftmaxLoss, clip: Optional[float] = None, device: Any = None,
              dtype: str = "float32", progress: Optional[bool] = None) -> Tuple[float, float]:
    """Train a language model for ``n_epochs``; returns the last epoch's (accuracy, loss)."""
    opt = optimizer(model.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(n_epochs):
        acc, loss = epoch_general_ptb(data, model, seq_len, loss_fn, opt, clip, device, dtype,
                                      progress)
    return acc, loss


def evaluate_ptb(model: nn.Module, data: np.ndarray, seq_len: int = 40,
                 loss_fn: Any = nn.SoftmaxLoss, device: Any = None, dtype: str = "float32",
                 progress: Optional[bool] = None) -> Tuple[float, float]:
    """(accuracy, mean loss) of a language model in eval mode."""
    return epoch_general_ptb(data, model, seq_len, loss_fn, None, None, device, dtype, progress)
