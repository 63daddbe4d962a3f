"""Sequence parallelism with each of 2 ranks on its own GPU (two GPUs, or the emulator's two)
equals the serial CPU model, sliced: the parameters are built on the CPU with the same seed and
moved to ``cuda(local rank)``; activations cross ranks through the host bridge."""
import numpy as np
import pytest
from mpi_helpers import run_ranks
from test_transformer_tp import DH, NAMES, NH, SEED, B, D, H, T, V, _data, serial_reference

import needle as ndl
from needle import nn
from needle.parallel import devices
from needle.parallel.tensor_parallel import (
    ColumnParallelLinear,
    ParallelTransformerBlock,
    VocabParallelEmbedding,
    allreduce_sequence_parallel_grads,
    vocab_parallel_cross_entropy,
)


def sp_step_on_gpu(comm):
    """One sequence-parallel forward/backward on this rank's GPU: loss, grads, devices."""
    np.random.seed(SEED)
    model = nn.Module()
    model.emb = VocabParallelEmbedding(V, D, comm, sequence_parallel=True)
    model.block = ParallelTransformerBlock(D, NH, DH, H, comm, sequence_parallel=True)
    model.head = ColumnParallelLinear(D, V, comm, bias=False, sequence_parallel=True)
    gpu = devices.device_for("cuda", devices.local_rank(), comm.rank)
    model.to(gpu)
    idx, y = _data()
    logits = model.head(model.block(model.emb(idx)))
    loss = vocab_parallel_cross_entropy(logits.reshape((B * T, V // comm.size)), y, comm)
    loss.backward()
    allreduce_sequence_parallel_grads(model, comm)
    grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
    where = {repr(p.grad.device) for p in model.parameters()} | {repr(logits.device)}
    return float(loss.numpy()), grads, sorted(where)


@pytest.mark.mpi
@pytest.mark.cuda
@pytest.mark.skipif(not ndl.cuda().enabled(), reason="no GPU (NEEDLE_CUDA_EMULATOR=1 runs the "
                    "emulator instead)")
def test_sequence_parallel_on_two_gpus_equals_serial_cpu():
    loss_ref, _, grads_ref = serial_reference("float32")
    results = run_ranks("mpi", 2, sp_step_on_gpu, timeout=120,
                        env={"NEEDLE_CUDA_EMULATOR_DEVICES": "2"})
    for r, (loss, grads, where) in enumerate(results):
        assert len(where) == 1 and where[0].startswith(f"cuda({r}"), (r, where)
        assert abs(loss - loss_ref) < 1e-5 * max(1.0, abs(loss_ref))
        for serial_name, (name, axis) in NAMES.items():
            want = grads_ref[serial_name]
            if axis is not None:
                want = np.split(want, 2, axis=axis)[r]
            np.testing.assert_allclose(grads[name], want, rtol=1e-5, atol=1e-5,
                                       err_msg=f"{name} on rank {r}")
