"""Bad tensor-parallel shapes are clear errors naming the numbers, on every rank."""
import numpy as np
import pytest
from mpi_helpers import run_ranks

from needle.parallel.tensor_parallel import (
    ColumnParallelLinear,
    ParallelTransformerBlock,
    RowParallelLinear,
    VocabParallelEmbedding,
)


def bad_shapes(comm):
    errors = []
    for make in (lambda: ColumnParallelLinear(4, 6, comm),
                 lambda: RowParallelLinear(9, 4, comm),
                 lambda: VocabParallelEmbedding(10, 4, comm),
                 lambda: ParallelTransformerBlock(8, 6, 2, 16, comm),       # 6 heads
                 lambda: ParallelTransformerBlock(8, 4, 2, 10, comm)):      # hidden 10
        try:
            make()
            errors.append(None)
        except ValueError as err:
            errors.append(str(err))
    return errors


@pytest.mark.parametrize("tp", [4])
def test_not_divisible_by_tp(tp):
    for errors in run_ranks("virtual", tp, bad_shapes):
        assert "out_features = 6 is not divisible by the tensor-parallel size 4" in errors[0]
        assert "in_features = 9 is not divisible" in errors[1]
        assert "num_embeddings = 10 is not divisible" in errors[2]
        assert "num_head = 6 is not divisible by the tensor-parallel size 4" in errors[3]
        assert "out_features = 10 is not divisible" in errors[4]


def test_wrong_input_width():
    import needle as ndl

    def fn(comm):
        try:
            ColumnParallelLinear(4, 8, comm)(ndl.Tensor(np.zeros((2, 5))))
        except ValueError as err:
            return str(err)
    # run in-process on one rank: the check is local, before any communication
    from needle.parallel import virtual
    assert "ColumnParallelLinear(4, 8) got input of shape (2, 5)" in virtual.run(1, fn)[0]
