"""The course's MLP ResNet (hw2): residual blocks of Linear-Norm-ReLU-Dropout, trained on MNIST."""
import os
from typing import Any, Optional, Tuple

import numpy as np

import needle as ndl
from needle import nn

if __package__:  # imported as apps.<module>
    from .progress import Progress
else:  # the course's way: sys.path.append("./apps"); from <module> import *
    from progress import Progress


def ResidualBlock(dim: int, hidden_dim: int, norm: Any = nn.BatchNorm1d,
                  drop_prob: float = 0.1) -> nn.Module:
    """ReLU(x + Norm(Linear(Dropout(ReLU(Norm(Linear(x))))))) (He et al., arXiv:1512.03385)."""
    ### BEGIN YOUR SOLUTION (hw2.mlp_resnet)
    return nn.Sequential(
        nn.Residual(nn.Sequential(
            nn.Linear(dim, hidden_dim), norm(hidden_dim), nn.ReLU(), nn.Dropout(drop_prob),
            nn.Linear(hidden_dim, dim), norm(dim))),
        nn.ReLU())
    ### END YOUR SOLUTION


def MLPResNet(dim: int, hidden_dim: int = 100, num_blocks: int = 3, num_classes: int = 10,
              norm: Any = nn.BatchNorm1d, drop_prob: float = 0.1) -> nn.Module:
    """Linear-ReLU, ``num_blocks`` residual blocks of width hidden_dim // 2, then a classifier."""
    ### BEGIN YOUR SOLUTION (hw2.mlp_resnet)
    return nn.Sequential(
        nn.Linear(dim, hidden_dim), nn.ReLU(),
        *[ResidualBlock(hidden_dim, hidden_dim // 2, norm, drop_prob) for _ in range(num_blocks)],
        nn.Linear(hidden_dim, num_classes))
    ### END YOUR SOLUTION


def epoch(dataloader: ndl.data.DataLoader, model: nn.Module,
          opt: Optional[ndl.optim.Optimizer] = None, progress: Optional[bool] = None,
          seed: Optional[int] = 4) -> Tuple[float, float]:
    """One pass (training when ``opt`` is given); returns (error rate, mean loss).

    As in the course the global RNG is reseeded with ``seed`` first (pass None to skip).
    """
    if seed is not None:
        np.random.seed(seed)
    loss_fn = nn.SoftmaxLoss()
    model.train() if opt is not None else model.eval()
    bar = Progress(dataloader, total=len(dataloader), desc="train" if opt else "eval",
                   disable=None if progress is None else not progress)
    errors, total_loss, n = 0, 0.0, 0
    ### BEGIN YOUR SOLUTION (hw2.mlp_resnet)
    for X, y in bar:
        if X.ndim != 2:
            X = X.reshape((X.shape[0], int(np.prod(X.shape[1:]))))
        logits = model(X)
        loss = loss_fn(logits, y)
        if opt is not None:
            opt.reset_grad()
            loss.backward()
            opt.step()
        b = y.shape[0]
        lv = float(loss.numpy())
        errors += int((logits.numpy().argmax(axis=1) != y.numpy()).sum())
        total_loss += lv * b
        n += b
        bar.update(lv, b)
    ### END YOUR SOLUTION
    bar.close()
    return errors / n, total_loss / n


def train_mnist(batch_size: int = 100, epochs: int = 10, optimizer: Any = ndl.optim.Adam,
                lr: float = 0.001, weight_decay: float = 0.001, hidden_dim: int = 100,
                data_dir: str = "data",
                progress: Optional[bool] = None) -> Tuple[float, float, float, float]:
    """Train MLPResNet(784, hidden_dim) on MNIST in ``data_dir``.

    Returns (train error, train loss, test error, test loss) of the last epoch.
    """
    np.random.seed(4)
    ### BEGIN YOUR SOLUTION (hw2.mlp_resnet)
    train_set = ndl.data.MNISTDataset(os.path.join(data_dir, "train-images-idx3-ubyte.gz"),
                                      os.path.join(data_dir, "train-labels-idx1-ubyte.gz"))
    test_set = ndl.data.MNISTDataset(os.path.join(data_dir, "t10k-images-idx3-ubyte.gz"),
                                     os.path.join(data_dir, "t10k-labels-idx1-ubyte.gz"))
    train_loader = ndl.data.DataLoader(train_set, batch_size, shuffle=True)
    test_loader = ndl.data.DataLoader(test_set, batch_size)
    model = MLPResNet(784, hidden_dim)
    opt = optimizer(model.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(epochs):
        train_err, train_loss = epoch(train_loader, model, opt, progress)
    test_err, test_loss = epoch(test_loader, model, None, progress)
    return train_err, train_loss, test_err, test_loss
    ### END YOUR SOLUTION
