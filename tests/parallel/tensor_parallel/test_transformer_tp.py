"""Tensor (and sequence) parallel transformer == the serial needle model, sliced.

The reference is computed in this (pytest) process with the serial layers and the same seed;
the ranks return their losses and gradient shards, which must equal the matching slices.
"""
import numpy as np
import pytest
from mpi_helpers import BACKENDS, run_ranks

import needle as ndl
from needle import nn
from needle.parallel.tensor_parallel import (
    ColumnParallelLinear,
    ParallelTransformerBlock,
    VocabParallelEmbedding,
    allreduce_sequence_parallel_grads,
    vocab_parallel_cross_entropy,
)

B, T, D, NH, DH, H, V = 2, 8, 16, 4, 4, 32, 12
SEED = 3

# serial name -> (parallel name, axis the parallel parameter is a slice of, or None if whole)
NAMES = {
    "emb.weight": ("emb.weight", 0),
    "layer.attn.prenorm_q.weight": ("block.attn.prenorm_q.weight", None),
    "layer.attn.prenorm_q.bias": ("block.attn.prenorm_q.bias", None),
    "layer.attn.prenorm_k.weight": ("block.attn.prenorm_k.weight", None),
    "layer.attn.prenorm_k.bias": ("block.attn.prenorm_k.bias", None),
    "layer.attn.prenorm_v.weight": ("block.attn.prenorm_v.weight", None),
    "layer.attn.prenorm_v.bias": ("block.attn.prenorm_v.bias", None),
    "layer.attn.q_projection.weight": ("block.attn.q_projection.weight", 1),
    "layer.attn.k_projection.weight": ("block.attn.k_projection.weight", 1),
    "layer.attn.v_projection.weight": ("block.attn.v_projection.weight", 1),
    "layer.attn.out_projection.weight": ("block.attn.out_projection.weight", 0),
    "layer.layernorm1.weight": ("block.layernorm1.weight", None),
    "layer.layernorm1.bias": ("block.layernorm1.bias", None),
    "layer.linear1.weight": ("block.mlp.linear1.weight", 1),
    "layer.linear1.bias": ("block.mlp.linear1.bias", 1),
    "layer.linear2.weight": ("block.mlp.linear2.weight", 0),
    "layer.linear2.bias": ("block.mlp.linear2.bias", None),
    "head.weight": ("head.weight", 1),
}


def backends():
    """Virtual and MPI once the virtual cluster exists; MPI alone until then."""
    try:
        import needle.parallel.virtual  # noqa: F401
    except ImportError:
        return [pytest.param("mpi", marks=pytest.mark.mpi)]
    return BACKENDS


def _data():
    rng = np.random.RandomState(7)
    return rng.randint(0, V, size=(B, T)), rng.randint(0, V, size=(B * T,))


def serial_reference(dtype):
    """Loss and gradients of the serial model (nn.Embedding, nn.TransformerLayer, nn.Linear)."""
    np.random.seed(SEED)
    model = nn.Module()
    model.emb = nn.Embedding(V, D, gather=True, dtype=dtype)
    model.layer = nn.TransformerLayer(D, NH, DH, H, dtype=dtype)
    model.head = nn.Linear(D, V, bias=False, dtype=dtype)
    idx, y = _data()
    h = model.layer(model.emb(ndl.Tensor(idx, dtype="int64")))          # (B, T, D)
    logits = model.head(h.reshape((B * T, D)))
    loss = nn.SoftmaxLoss()(logits, ndl.Tensor(y, dtype="int64"))
    loss.backward()
    grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
    return float(loss.numpy()), h.numpy(), grads


def tp_step(comm, dtype, sp):
    """One forward/backward of the tensor-parallel model; returns loss, output, grads, stats."""
    np.random.seed(SEED)
    model = nn.Module()
    sp_flag = bool(sp)
    model.emb = VocabParallelEmbedding(V, D, comm, sequence_parallel=sp_flag, dtype=dtype)
    model.block = ParallelTransformerBlock(D, NH, DH, H, comm, sequence_parallel=bool(sp),
                                           recompute_gather=sp == "recompute", dtype=dtype)
    model.head = ColumnParallelLinear(D, V, comm, bias=False, sequence_parallel=sp_flag,
                                      dtype=dtype)
    idx, y = _data()
    h = model.block(model.emb(idx))                  # (B, T, D), or (B, T/p, D) under SP
    logits = model.head(h)                           # (B, T, V/p)
    loss = vocab_parallel_cross_entropy(logits.reshape((B * T, V // comm.size)), y, comm)
    loss.backward()
    allreduce_sequence_parallel_grads(model, comm)
    grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
    return float(loss.numpy()), h.numpy(), grads


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("tp,sp,dtype", [(2, False, "float32"), (2, True, "float64"),
                                         (4, False, "float64"), (4, True, "float32"),
                                         (2, "recompute", "float64"),
                                         (4, "recompute", "float32")])
def test_tp_transformer_equals_serial(backend, tp, sp, dtype):
    tol = 1e-5 if dtype == "float32" else 1e-10
    loss_ref, h_ref, grads_ref = serial_reference(dtype)
    results = run_ranks(backend, tp, tp_step, dtype, sp, timeout=180)
    for r, (loss, h, grads) in enumerate(results):
        assert abs(loss - loss_ref) < tol * max(1.0, abs(loss_ref))
        want_h = np.split(h_ref, tp, axis=1)[r] if sp else h_ref
        np.testing.assert_allclose(h, want_h, rtol=tol, atol=tol)
        assert set(grads) == {name for name, _ in NAMES.values()}
        for serial_name, (name, axis) in NAMES.items():
            want = grads_ref[serial_name]
            if axis is not None:
                want = np.split(want, tp, axis=axis)[r]
            np.testing.assert_allclose(grads[name], want, rtol=tol, atol=tol,
                                       err_msg=f"{name} on rank {r}")
