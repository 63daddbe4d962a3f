"""The course's hw4 models: ResNet9 for CIFAR-10 and a word/character LanguageModel."""
from typing import Any, Optional, Tuple

import needle as ndl
from needle import nn


class ConvBN(nn.Module):
    """Conv (k x k, stride s) -> BatchNorm2d -> ReLU on NCHW images."""

    def __init__(self, a: int, b: int, k: int, s: int, device: Any = None,
                 dtype: str = "float32"):
        super().__init__()
        self.conv = nn.Conv(a, b, k, stride=s, device=device, dtype=dtype)
        self.bn = nn.BatchNorm2d(b, device=device, dtype=dtype)
        self.relu = nn.ReLU()

    def forward(self, x: ndl.Tensor) -> ndl.Tensor:
        return self.relu(self.bn(self.conv(x)))


class ResNet9(nn.Module):
    """The course's small ResNet for 32x32 CIFAR-10 images (N, 3, 32, 32) -> logits (N, 10)."""

    def __init__(self, device: Any = None, dtype: str = "float32"):
        """Exercise hw4.models: ``self.model``, as the course: ConvBN(3,16,7,4), ConvBN(16,32,3,2),
        Residual(ConvBN(32,32,3,1), ConvBN(32,32,3,1)), ConvBN(32,64,3,2), ConvBN(64,128,3,2),
        Residual(two ConvBN(128,128,3,1)), Flatten, Linear(128,128), ReLU, Linear(128,10); the
        layers built in this order (the RNG draws follow it)."""
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        ### BEGIN YOUR SOLUTION (hw4.models)
        self.model = nn.Sequential(
            ConvBN(3, 16, 7, 4, **kw),
            ConvBN(16, 32, 3, 2, **kw),
            nn.Residual(nn.Sequential(ConvBN(32, 32, 3, 1, **kw), ConvBN(32, 32, 3, 1, **kw))),
            ConvBN(32, 64, 3, 2, **kw),
            ConvBN(64, 128, 3, 2, **kw),
            nn.Residual(nn.Sequential(ConvBN(128, 128, 3, 1, **kw),
                                      ConvBN(128, 128, 3, 1, **kw))),
            nn.Flatten(),
            nn.Linear(128, 128, **kw),
            nn.ReLU(),
            nn.Linear(128, 10, **kw))
        ### END YOUR SOLUTION

    def forward(self, x: ndl.Tensor) -> ndl.Tensor:
        return self.model(x)


class LanguageModel(nn.Module):
    """Embedding -> RNN / LSTM / Transformer -> Linear over the vocabulary.

    Input token ids (seq_len, bs); output logits (seq_len * bs, output_size) and the hidden state.
    """

    def __init__(self, embedding_size: int, output_size: int, hidden_size: int,
                 num_layers: int = 1, seq_model: str = "rnn", seq_len: int = 40,
                 device: Any = None, dtype: str = "float32", **transformer_kw: Any):
        """Exercise hw4.models: in order ``self.embedding`` = Embedding(output_size, embedding_size,
        gather=True), ``self.seq_model`` (RNN, LSTM or Transformer by ``seq_model``; else
        ValueError), ``self.hidden_size`` (embedding_size for the transformer, which keeps the
        embedding width) and ``self.linear`` = Linear(hidden_size, output_size)."""
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        ### BEGIN YOUR SOLUTION (hw4.models)
        self.embedding = nn.Embedding(output_size, embedding_size, gather=True, **kw)
        if seq_model == "rnn":
            self.seq_model = nn.RNN(embedding_size, hidden_size, num_layers, **kw)
        elif seq_model == "lstm":
            self.seq_model = nn.LSTM(embedding_size, hidden_size, num_layers, **kw)
        elif seq_model == "transformer":
            self.seq_model = nn.Transformer(embedding_size, hidden_size, num_layers,
                                            sequence_len=seq_len, **transformer_kw, **kw)
            hidden_size = embedding_size  # the transformer keeps the embedding width
        else:
            raise ValueError(f"seq_model must be 'rnn', 'lstm' or 'transformer', got {seq_model!r}")
        self.hidden_size = hidden_size
        self.linear = nn.Linear(hidden_size, output_size, **kw)
        ### END YOUR SOLUTION

    def forward(self, x: ndl.Tensor, h: Optional[Any] = None) -> Tuple[ndl.Tensor, Any]:
        """Logits (seq_len * bs, output_size) for token ids x (seq_len, bs), and the new state."""
        seq_len, bs = x.shape
        ### BEGIN YOUR SOLUTION (hw4.models)
        out, h = self.seq_model(self.embedding(x), h)                 # (T, B, hidden)
        logits = self.linear(out.reshape((seq_len * bs, self.hidden_size)))
        ### END YOUR SOLUTION
        return logits, h
