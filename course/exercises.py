"""The rubric: each graded exercise, its points, and the tests that grade it.

A test is named ``<test module>::<test id>`` where ``*`` matches anything (and nothing else is
special), e.g. ``test_ops::test_forward_matches_numpy[matmul-*``; the module is the file name
without ``.py`` (wherever it sits under tests/); a test belongs to the first exercise naming it.
``course.grading`` marks every such test ``@pytest.mark.grade(<exercise>, points=<points>)`` at
collection; a test (e.g. an instructor's hidden one) may also carry that marker itself.
An exercise's points are shared by its tests: the score is points x (passed / run).

``tests/test_course_release.py`` checks the rubric against the code: every graded test fails in
the student release (``make student``) and passes here, and every ``### BEGIN YOUR SOLUTION``
region runs under at least one graded test. Regions that only run on a GPU or inside mpiexec
workers are named in ``UNTRACED`` with the exercise that grades them.
"""
from pathlib import Path
from typing import Dict, List, NamedTuple, Sequence, Tuple


class Exercise(NamedTuple):
    """One graded exercise: ``hwN.unit.name``, its points, the test patterns grading it."""

    name: str
    points: int
    tests: Tuple[str, ...]

    @property
    def homework(self) -> str:
        """``hw1`` for ``hw1.ops.matmul``."""
        return self.name.split(".")[0]


def _ops(*names: str, kinds: Tuple[str, ...] = ("forward_matches_numpy",
                                                 "gradient_matches_central_differences",
                                                 "forward_and_gradient_match_torch")
         ) -> Tuple[str, ...]:
    """test_ops patterns for the listed ops (every shape and device)."""
    return tuple(f"test_ops::test_{k}[{n}-*" for n in names for k in kinds)


def _grads(*names: str) -> Tuple[str, ...]:
    return _ops(*names, kinds=("gradient_matches_central_differences",
                               "forward_and_gradient_match_torch"))


EXERCISES: List[Exercise] = [
    # ---------------------------------------------------------------- hw0: NumPy warm-up
    Exercise("hw0.simple_ml.add", 1, ("test_course_api::test_add_is_hw0s_first_exercise",)),
    Exercise("hw0.simple_ml.parse_mnist", 2, ("test_data::test_mnist_reader_on_written_files",
                                              "test_data::test_mnist_reader_errors_name_*")),
    Exercise("hw0.simple_ml.softmax_loss", 2, (
        "test_apps::test_softmax_loss_numpy_and_needle_agree_with_formula",)),
    Exercise("hw0.simple_ml.epochs", 4, (
        "test_apps::test_softmax_regression_and_two_layer_net_learn_digits",)),
    # ---------------------------------------------------------------- hw1: autodiff
    Exercise("hw1.ops.multiply", 1, _grads("multiply")),
    Exercise("hw1.ops.power", 1, _grads("power")),
    Exercise("hw1.ops.power_scalar", 1, _ops("power_scalar")),
    Exercise("hw1.ops.divide", 1, _ops("divide")),
    Exercise("hw1.ops.divide_scalar", 1, _ops("divide_scalar")),
    Exercise("hw1.ops.log", 1, _grads("log")),
    Exercise("hw1.ops.exp", 1, _grads("exp")),
    Exercise("hw1.ops.relu", 1, _grads("relu")),
    Exercise("hw1.ops.tanh", 1, _grads("tanh")),
    Exercise("hw1.ops.transpose", 1, _ops("transpose")),
    Exercise("hw1.ops.reshape", 1, _ops("reshape")),
    Exercise("hw1.ops.broadcast_to", 1, _grads("broadcast_to")),
    Exercise("hw1.ops.summation", 1, _grads("summation")),
    Exercise("hw1.ops.matmul", 2, _grads("matmul")),
    Exercise("hw1.autograd.make_from_op", 1, (
        "test_autograd::test_requires_grad_propagation",
        "test_autograd::test_lazy_mode_*")),
    Exercise("hw1.autograd.topo_sort", 2, ("test_autograd::test_topo_sort_*",)),
    Exercise("hw1.autograd.compute_gradient", 3, (
        "test_autograd::test_gradient_accumulates_over_uses_and_out_grad",
        "test_autograd::test_compute_gradient_of_gradient",
        "test_autograd::test_backward_overwrites_leaf_grad")),
    Exercise("hw1.simple_ml.nn_epoch", 2, (
        "test_apps::test_numpy_backprop_matches_needle_autodiff",)),
    # ---------------------------------------------------------------- hw2: nn, optim, data
    Exercise("hw2.ops.logsumexp", 2, _ops("logsumexp") + (
        "test_ops::test_logsumexp_logsoftmax_stable_for_large_inputs[cpu*",)),
    Exercise("hw2.ops.logsoftmax", 1, _ops("logsoftmax")),
    Exercise("hw2.init.rand", 1, ("test_init::test_rand_randn_follow_numpy_global_rng*",
                                  "test_init::test_randb_frequency_and_seeding*",
                                  "test_init::test_constants_and_like*",
                                  "test_init::test_one_hot*")),
    Exercise("hw2.init.fan", 2, ("test_init::test_xavier*", "test_init::test_kaiming*")),
    Exercise("hw2.nn.linear", 2, ("test_nn_basic::test_linear_*",)),
    Exercise("hw2.nn.sequential", 1, ("test_nn_basic::test_sequential_container_and_errors",)),
    Exercise("hw2.nn.softmax_loss", 1, ("test_nn_basic::test_softmax_loss_*",)),
    Exercise("hw2.nn.batchnorm1d", 2, ("test_nn_basic::test_batchnorm_train_eval_match_torch*",)),
    Exercise("hw2.nn.layernorm1d", 2, ("test_nn_basic::test_layernorm_matches_torch*",)),
    Exercise("hw2.nn.dropout", 1, ("test_nn_basic::test_dropout_statistics_and_eval*",)),
    Exercise("hw2.optim.sgd", 2, ("test_optim::test_sgd_course_momentum_rule*",
                                  "test_optim::test_optimizers_match_torch[sgd*")),
    # the plain step only: the tuned one (Adam.tuned, AdamW's default "adamw" case) is not
    # the student's code, and the release stubs it
    Exercise("hw2.optim.adam", 2, ("test_optim::test_adam_rule_step_by_step[plain*",
                                   "test_optim::test_optimizers_match_torch[adam-*",
                                   "test_optim::test_optimizers_match_torch[adamw-plain*")),
    Exercise("hw2.data.transforms", 1, ("test_data::test_random_flip_horizontal_matches_numpy",
                                        "test_data::test_random_crop_is_a_zero_filled_shift*")),
    Exercise("hw2.data.dataloader", 2, ("test_data::test_dataloader_batches_in_order",
                                        "test_data::test_shuffle_*")),
    Exercise("hw2.mlp_resnet", 3, ("test_apps::test_mlp_resnet_structure",
                                   "test_apps::test_mlp_resnet_epoch_reports_*",
                                   "test_apps::test_train_mnist_reads_*")),
    # ---------------------------------------------------------------- hw3: NDArray backend
    Exercise("hw3.ndarray.views", 3, ("test_ndarray::test_views_match_numpy",
                                      "test_ndarray::test_make_strides_offset_and_views",
                                      "test_ndarray::test_elementwise_on_views_match_numpy")),
    Exercise("hw3.ndarray.flip", 1, ("test_ndarray::test_flip_and_pad",)),
    Exercise("hw3.ndarray.setitem", 2, (
        "test_ndarray::test_setitem_through_views_matches_numpy",)),
    Exercise("hw3.ndarray.reductions", 2, (
        "test_ndarray::test_reductions_on_views_match_numpy",)),
    Exercise("hw3.ndarray.matmul", 2, ("test_ndarray::test_matmul_on_views_matches_numpy",)),
    Exercise("hw3.ndarray.matmul_tiled", 2, (
        "test_course_compat::test_matmul_tiled_primitive_on_the_tiled_layout*",
        *(f"test_course_compat::test_ndarray_matmul_routes_aligned_shapes_through_matmul_tiled"
          f"[{shape}]" for shape in ("8-8-8", "16-32-8", "64-64-64")))),
    # The NumPy backend's gather/scatter: the cpu cases (on cuda the CUDA backend gathers).
    Exercise("hw3.ndarray.gather_scatter", 1, (
        "test_ops_embedding::test_lookup_matches_numpy_indexing[*-cpu]",
        "test_ops_embedding::test_gradient_scatter_adds_repeated_rows[cpu]")),
    # Graded where the student's code runs: not cuBLAS, and not the empty or one-element
    # shapes that need no kernel (they pass with nothing written, GPU or emulator alike).
    Exercise("hw3.cuda.backend", 4, (
        *(f"test_cuda_backend::test_roundtrip_and_compact[*-{s}"
          for s in ("(3,*", "(257,)]", "(33,*", "(2,*")),
        "test_cuda_backend::test_compact_7d_permuted_sliced_*",
        "test_cuda_backend::test_setitem_views_and_scalars*",
        *(f"test_cuda_backend::test_matmul[{shape}*-{mode}]"
          for shape in ("((1, 1)", "((3, 5)", "((129, 67)", "((4, 3, 257, 9)", "((5, 17, 33)")
          for mode in ("tiled", "naive")),
        *(f"test_cuda_backend::test_reductions[{shape}-*"
          for shape in ("(1,)", "(100003,)", "(2, 1, 3, 1, 2, 3, 2)", "(2, 3, 4, 5)",
                        "(3, 5000)", "(300, 40)", "(4224, 3)", "(5000, 7)", "(7, 20000)")))),
    # ---------------------------------------------------------------- hw4: CNN, RNN, Transformer
    Exercise("hw4.ops.dilate", 1, _ops("dilate", "undilate")),
    Exercise("hw4.ops.stack_split", 2, _ops("stack", "split") + (
        "test_ops::test_stack_split_round_trip",)),
    Exercise("hw4.ops.conv", 3, _ops("conv")),
    Exercise("hw4.nn.conv", 2, ("test_nn_conv::test_conv_*",)),
    Exercise("hw4.nn.rnn", 3, ("test_nn_sequence::test_cells_gradcheck*",
                               "test_nn_sequence::test_stacks_match_torch*",
                               "test_nn_sequence::test_stack_gradcheck*",
                               "test_nn_sequence::test_default_hidden_is_zeros")),
    Exercise("hw4.nn.embedding", 1, ("test_nn_sequence::test_embedding*",)),
    Exercise("hw4.nn.transformer", 4, ("test_nn_transformer::test_*",)),
    Exercise("hw4.data.ptb", 2, ("test_data::test_ptb_corpus_batchify_get_batch",)),
    Exercise("hw4.models", 3, (
        "test_apps::test_resnet9_overfits_a_small_batch_with_the_cifar_loop",
        "test_apps::test_language_model_learns_a_periodic_sequence*")),
    # ---------------------------------------------------------------- collectives
    Exercise("collectives.reference", 3, ("test_reference::test_allreduce_references*",
                                          "test_reference::test_reduce_scatter_reference*",
                                          "test_reference::test_allgather_and_alltoall_*",
                                          "test_reference::test_ring_segments_circulate_*")),
    Exercise("collectives.mpi", 3, ("test_collectives::test_collectives_match_references*",
                                    "test_ring_exercise::test_naive_ring_allreduce_*")),
]

# Regions no graded test runs in-process on a CPU machine, with the exercise that grades them
# (the isolation check stubs them with it): GPU-only code, mpiexec workers, numba-compiled loops,
# and fallbacks of fused paths that the CPU backend never takes (copies of an answer, stubbed
# in the release so that they give nothing away).
UNTRACED: Dict[str, str] = {
    "needle/backend_cuda/ndarray_backend_cuda.py::compact": "hw3.cuda.backend",
    "needle/backend_cuda/ndarray_backend_cuda.py::ewise_setitem": "hw3.cuda.backend",
    "needle/backend_cuda/ndarray_backend_cuda.py::scalar_setitem": "hw3.cuda.backend",
    "needle/backend_cuda/ndarray_backend_cuda.py::matmul": "hw3.cuda.backend",
    "needle/backend_cuda/ndarray_backend_cuda.py::_reduce": "hw3.cuda.backend",
    "needle/backend_ndarray/adam_cpu_kernel.py::adam_step": "hw2.optim.adam",  # numba
    "needle/backend_ndarray/fused_ops.py::logsumexp_naive": "hw2.ops.logsumexp",  # GPU fallback
    "needle/backend_ndarray/fused_ops.py::adam_update_naive": "hw2.optim.adam",  # no numba
    "needle/backend_ndarray/fused_ops.py::dropout_naive": "hw2.nn.dropout",  # ops.dropout on CPU
    "needle/parallel/comm/ring.py::ring_reduce_scatter": "collectives.mpi",
    "needle/parallel/comm/ring.py::ring_gather": "collectives.mpi",
    "needle/parallel/comm/latency_bound.py::recursive_doubling_allreduce": "collectives.mpi",
    "needle/parallel/comm/latency_bound.py::binomial_broadcast": "collectives.mpi",
    "needle/parallel/comm/latency_bound.py::binomial_reduce": "collectives.mpi",
}


def test_files(names: Sequence[str], root: Path) -> List[str]:
    """The test modules (paths relative to ``root``) the rubric names for the exercises."""
    stems = {pattern.partition("::")[0] for ex in EXERCISES if ex.name in names
             for pattern in ex.tests}
    return sorted(str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py")
                  if p.stem in stems and "__pycache__" not in p.parts)
