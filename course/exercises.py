"""The rubric: each graded exercise, its points, and the tests that grade it.

A test is named ``<test module>::<test id>`` where ``*`` matches anything (and nothing else is
special), e.g. ``test_ops::test_forward_matches_numpy[matmul-*``; the module is the file name
without ``.py`` (wherever it sits under tests/); a test belongs to the first exercise naming it.
``course.grade_plugin`` marks every such test ``@pytest.mark.grade(<exercise>, points=<points>)`` at
collection; a test (e.g. an instructor's hidden one) may also carry that marker itself.
An exercise's points are shared by its tests: the score is points x (passed / run). A case on
the cuda device (a test id naming ``cuda`` as a parameter) is graded only by ``hw3.cuda.*``: no
other exercise's score depends on the CUDA backend or on a GPU being there.

The rubric rule: a student who writes nothing scores 0, and one who writes exercise E
and the exercises E ``requires`` (transitively) scores exactly the points of those exercises.
The course orders homework so that later exercises build on earlier ones (every op goes through
``make_from_op``; Adam is written in hw1's ops; a training loop needs nn), and ``requires``
declares those dependencies: the exercises whose solution regions E's graded tests run. Tests are
written to need as little else as they can (an op's gradient test calls the op's ``gradient``
directly, not ``backward()``). The instructor's release check checks the rule: in the reference,
every region a graded test of E runs belongs to E or to E's requirements (no missing
declaration); with only E and its requirements written, E's graded tests all pass; with nothing
written, every graded test fails; and with only E unwritten, E's tests fail (no leak). The grade
report names the missing prerequisite when a test fails on another exercise's stub. No
requirement comes from a later homework (``requires_problems`` checks the course order,
``HOMEWORKS``): hw1's and hw2's graded tests compute on NumPy arrays (``HOMEWORK_BACKEND``,
``NEEDLE_BACKEND=np``), as the course's did before hw3 brings the NDArray, so no hw1 or hw2
test runs a hw3 region.

The same check (the instructor's, run in CI) checks the rubric against the code: every graded
test fails in the student release and passes in the reference, and every
``### BEGIN YOUR SOLUTION`` region runs under at least one graded test. Python regions that only
run on a GPU or inside mpiexec workers are named in ``UNTRACED`` with the
exercise that grades them (CUDA C regions, ``// BEGIN YOUR SOLUTION``, are never traced).
"""
from pathlib import Path
from typing import Dict, List, NamedTuple, Sequence, Set, Tuple


class Exercise(NamedTuple):
    """One graded exercise: ``hwN.unit.name``, its points, the test patterns grading it, and
    the exercises its graded tests also need written (see the rubric rule above)."""

    name: str
    points: int
    tests: Tuple[str, ...]
    requires: Tuple[str, ...] = ()

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
        "test_apps::test_softmax_loss_numpy_agrees_with_formula",)),
    Exercise("hw0.simple_ml.epochs", 4, (
        "test_apps::test_softmax_regression_and_two_layer_net_learn_digits",),
             requires=("hw0.simple_ml.softmax_loss",)),
    # ---------------------------------------------------------------- hw1: autodiff
    Exercise("hw1.ops.multiply", 1, _grads("multiply"),
             requires=("hw1.ops.broadcast_to",)),
    Exercise("hw1.ops.power", 1, _grads("power"),
             requires=("hw1.ops.broadcast_to",)),
    Exercise("hw1.ops.power_scalar", 1, _ops("power_scalar"),
             requires=("hw1.autograd.make_from_op",)),
    Exercise("hw1.ops.divide", 1, _ops("divide"),
             requires=("hw1.ops.broadcast_to",)),
    Exercise("hw1.ops.divide_scalar", 1, _ops("divide_scalar"),
             requires=("hw1.autograd.make_from_op",)),
    Exercise("hw1.ops.log", 1, _grads("log"),
             requires=("hw1.ops.divide",)),
    Exercise("hw1.ops.exp", 1, _grads("exp"),
             requires=("hw1.autograd.make_from_op",)),
    Exercise("hw1.ops.relu", 1, _grads("relu"),
             requires=("hw1.autograd.make_from_op",)),
    Exercise("hw1.ops.tanh", 1, _grads("tanh"),
             requires=("hw1.autograd.make_from_op",)),
    Exercise("hw1.ops.transpose", 1, _ops("transpose"),
             requires=("hw1.autograd.make_from_op",)),
    Exercise("hw1.ops.reshape", 1, _ops("reshape"),
             requires=("hw1.autograd.make_from_op",)),
    Exercise("hw1.ops.broadcast_to", 1, _grads("broadcast_to"),
             requires=("hw1.ops.reshape",)),
    Exercise("hw1.ops.summation", 1, _grads("summation"),
             requires=("hw1.ops.reshape",)),
    Exercise("hw1.ops.matmul", 2, _grads("matmul"),
             requires=("hw1.ops.broadcast_to", "hw1.ops.transpose")),
    Exercise("hw1.autograd.make_from_op", 1, ("test_autograd::test_requires_grad_propagation",)),
    # realizing a lazy graph walks it in topological order: graded here, not under make_from_op
    Exercise("hw1.autograd.topo_sort", 2, ("test_autograd::test_topo_sort_*",
                                           "test_autograd::test_lazy_mode_defers_*"),
             requires=("hw1.autograd.make_from_op",)),
    Exercise("hw1.autograd.compute_gradient", 3, (
        "test_autograd::test_gradient_accumulates_over_uses_and_out_grad",
        "test_autograd::test_compute_gradient_of_gradient",
        "test_autograd::test_backward_overwrites_leaf_grad",
        "test_autograd::test_backward_reaches_only_what_requires_grad"),
             requires=("hw1.autograd.topo_sort", "hw1.ops.exp", "hw1.ops.multiply",
                       "hw1.ops.summation")),
    Exercise("hw1.simple_ml.softmax_loss", 1, (
        "test_apps::test_softmax_loss_needle_agrees_with_formula",),
             requires=("hw1.ops.divide_scalar",)),
    Exercise("hw1.simple_ml.nn_epoch", 2, (
        "test_apps::test_numpy_backprop_matches_needle_autodiff",),
             requires=("hw0.simple_ml.epochs", "hw1.autograd.compute_gradient", "hw1.ops.log",
                       "hw1.ops.matmul", "hw1.ops.relu", "hw1.simple_ml.softmax_loss")),
    # ---------------------------------------------------------------- hw2: nn, optim, data
    Exercise("hw2.ops.logsumexp", 2, _ops("logsumexp") + (
        "test_ops::test_logsumexp_logsoftmax_stable_for_large_inputs[cpu*",),
             requires=("hw1.autograd.compute_gradient", "hw1.ops.divide", "hw2.ops.logsoftmax")),
    Exercise("hw2.ops.logsoftmax", 1, _ops("logsoftmax"),
             requires=("hw1.autograd.make_from_op",)),
    Exercise("hw2.init.rand", 1, ("test_init::test_rand_randn_follow_numpy_global_rng*",
                                  "test_init::test_randb_frequency_and_seeding*",
                                  "test_init::test_constants_and_like*",
                                  "test_init::test_one_hot*")),
    Exercise("hw2.init.fan", 2, ("test_init::test_xavier*", "test_init::test_kaiming*"),
             requires=("hw2.init.rand",)),
    Exercise("hw2.nn.linear", 2, ("test_nn_basic::test_linear_*",),
             requires=("hw1.autograd.compute_gradient", "hw1.ops.matmul", "hw2.init.fan")),
    Exercise("hw2.nn.sequential", 1, ("test_nn_basic::test_sequential_container_and_errors",),
             requires=("hw2.nn.linear",)),
    Exercise("hw2.nn.softmax_loss", 1, ("test_nn_basic::test_softmax_loss_*",),
             requires=("hw1.ops.divide_scalar", "hw2.nn.linear", "hw2.ops.logsumexp")),
    # graded against NumPy too: without PyTorch (make install WITH_TORCH=0) they still score
    Exercise("hw2.nn.batchnorm1d", 2, ("test_nn_basic::test_batchnorm_train_eval_match_*",),
             requires=("hw1.autograd.compute_gradient", "hw1.ops.divide", "hw1.ops.divide_scalar",
                       "hw1.ops.power_scalar", "hw1.ops.transpose", "hw2.init.rand")),
    Exercise("hw2.nn.layernorm1d", 2, ("test_nn_basic::test_layernorm_matches_*",),
             requires=("hw1.autograd.compute_gradient", "hw1.ops.divide", "hw1.ops.divide_scalar",
                       "hw1.ops.power_scalar", "hw2.init.rand")),
    Exercise("hw2.nn.dropout", 1, ("test_nn_basic::test_dropout_statistics_and_eval*",),
             requires=("hw1.autograd.compute_gradient", "hw1.ops.divide_scalar", "hw2.init.rand")),
    Exercise("hw2.optim.sgd", 2, ("test_optim::test_sgd_course_momentum_rule*",
                                  "test_optim::test_optimizers_match_torch[sgd*"),
             requires=("hw1.ops.relu", "hw2.nn.sequential", "hw2.nn.softmax_loss")),
    Exercise("hw2.optim.adam", 2, ("test_optim::test_adam_rule_step_by_step*",
                                   "test_optim::test_optimizers_match_torch[adam*"),
             requires=("hw1.ops.relu", "hw2.nn.sequential", "hw2.nn.softmax_loss")),
    Exercise("hw2.data.transforms", 1, ("test_data::test_random_flip_horizontal_matches_numpy",
                                        "test_data::test_random_crop_is_a_zero_filled_shift*")),
    Exercise("hw2.data.dataloader", 2, ("test_data::test_dataloader_batches_in_order",
                                        "test_data::test_shuffle_*")),
    Exercise("hw2.mlp_resnet", 3, ("test_apps::test_mlp_resnet_structure",
                                   "test_apps::test_mlp_resnet_epoch_reports_*",
                                   "test_apps::test_train_mnist_reads_*"),
             requires=("hw0.simple_ml.parse_mnist", "hw2.data.dataloader", "hw2.nn.batchnorm1d",
                       "hw2.nn.dropout", "hw2.nn.layernorm1d", "hw2.optim.adam", "hw2.optim.sgd")),
    # ---------------------------------------------------------------- hw3: NDArray backend
    Exercise("hw3.ndarray.views", 3, ("test_ndarray::test_views_match_numpy",
                                      "test_ndarray::test_make_strides_offset_and_views",
                                      "test_ndarray::test_elementwise_on_views_match_numpy")),
    Exercise("hw3.ndarray.flip", 1, ("test_ndarray::test_flip_and_pad",),
             requires=("hw3.ndarray.setitem",)),
    Exercise("hw3.ndarray.setitem", 2, (
        "test_ndarray::test_setitem_through_views_matches_numpy",),
             requires=("hw3.ndarray.views",)),
    Exercise("hw3.ndarray.reductions", 2, (
        "test_ndarray::test_reductions_on_views_match_numpy",),
             requires=("hw3.ndarray.views",)),
    Exercise("hw3.ndarray.matmul", 2, ("test_ndarray::test_matmul_on_views_matches_numpy",),
             requires=("hw3.ndarray.views",)),
    Exercise("hw3.ndarray.matmul_tiled", 2, (
        "test_course_compat::test_matmul_tiled_primitive_on_the_tiled_layout*",
        *(f"test_course_compat::test_ndarray_matmul_routes_aligned_shapes_through_matmul_tiled"
          f"[{shape}]" for shape in ("8-8-8", "16-32-8", "64-64-64"))),
             requires=("hw3.ndarray.matmul",)),
    # The NumPy backend's gather/scatter: the cpu cases (on cuda the CUDA backend gathers).
    Exercise("hw3.ndarray.gather_scatter", 1, (
        "test_ops_embedding::test_lookup_matches_numpy_indexing[*-cpu]",
        "test_ops_embedding::test_gradient_scatter_adds_repeated_rows[cpu]"),
             requires=("hw1.autograd.make_from_op", "hw3.ndarray.views")),
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
        *(f"test_cuda_backend::test_reductions[course-{shape}-*"
          for shape in ("(1,)", "(100003,)", "(2, 1, 3, 1, 2, 3, 2)", "(2, 3, 4, 5)",
                        "(3, 5000)", "(300, 40)", "(4224, 3)", "(5000, 7)", "(7, 20000)")),
        # the block reductions of the fused kernels (layernorm.cu's block_sum, softmax.cu's
        # block_merge): reduce_rows_block's tree, not shipped beside it (no kernel runs for
        # an empty row)
        *(f"test_cuda_fused::test_fused_softmax_logsumexp[{shape}-*"
          for shape in ("(1, 1)", "(3, 7)", "(5, 1000)", "(2, 3, 129)", "(64, 4097)",
                        "(2, 3, 1)")),
        "test_cuda_fused::test_fused_softmax_handles_infinities",
        "test_cuda_fused::test_fused_layer_norm[*"),
             requires=("hw2.ops.logsumexp",  # the fused softmax is compared with softmax_naive
                       "hw3.ndarray.matmul", "hw3.ndarray.reductions")),
    # ---------------------------------------------------------------- hw4: CNN, RNN, Transformer
    Exercise("hw4.ops.dilate", 1, _ops("dilate", "undilate"),
             requires=("hw1.autograd.make_from_op", "hw3.ndarray.setitem")),
    Exercise("hw4.ops.stack_split", 2, _ops("stack", "split") + (
        "test_ops::test_stack_split_round_trip",),
             requires=("hw1.autograd.compute_gradient", "hw3.ndarray.reductions",
                       "hw3.ndarray.setitem")),
    Exercise("hw4.ops.conv", 3, _ops("conv"),
             requires=("hw1.ops.transpose", "hw3.ndarray.flip", "hw3.ndarray.matmul",
                       "hw4.ops.dilate")),
    Exercise("hw4.nn.conv", 2, ("test_nn_conv::test_conv_*",),
             requires=("hw1.autograd.compute_gradient", "hw1.ops.broadcast_to", "hw2.init.fan",
                       "hw3.ndarray.reductions", "hw4.ops.conv")),
    Exercise("hw4.nn.rnn", 3, ("test_nn_sequence::test_cells_gradcheck*",
                               "test_nn_sequence::test_stacks_match_torch*",
                               "test_nn_sequence::test_stack_gradcheck*",
                               "test_nn_sequence::test_default_hidden_is_zeros"),
             requires=("hw1.ops.matmul", "hw1.ops.relu", "hw1.ops.tanh", "hw2.init.rand",
                       "hw3.ndarray.matmul", "hw3.ndarray.reductions", "hw4.ops.stack_split")),
    Exercise("hw4.nn.embedding", 1, ("test_nn_sequence::test_embedding*",),
             requires=("hw1.autograd.compute_gradient", "hw1.ops.matmul", "hw2.init.rand",
                       "hw3.ndarray.gather_scatter", "hw3.ndarray.matmul",
                       "hw3.ndarray.reductions")),
    Exercise("hw4.nn.transformer", 4, ("test_nn_transformer::test_*",),
             requires=("hw1.ops.relu", "hw2.nn.dropout", "hw2.nn.layernorm1d", "hw2.nn.sequential",
                       "hw2.ops.logsumexp", "hw3.ndarray.gather_scatter", "hw3.ndarray.matmul",
                       "hw3.ndarray.reductions")),
    Exercise("hw4.data.ptb", 2, ("test_data::test_ptb_corpus_batchify_get_batch",)),
    Exercise("hw4.models", 3, (
        "test_apps::test_resnet9_overfits_a_small_batch_with_the_cifar_loop",
        "test_apps::test_language_model_learns_a_periodic_sequence*"),
             requires=("hw2.data.dataloader", "hw2.nn.batchnorm1d", "hw2.optim.adam",
                       "hw3.ndarray.gather_scatter", "hw3.ndarray.reductions", "hw4.data.ptb",
                       "hw4.nn.conv", "hw4.nn.rnn", "hw4.nn.transformer")),
    # ---------------------------------------------------------------- collectives
    Exercise("collectives.reference", 3, ("test_reference::test_allreduce_references*",
                                          "test_reference::test_reduce_scatter_reference*",
                                          "test_reference::test_allgather_and_alltoall_*",
                                          "test_reference::test_ring_segments_circulate_*")),
    Exercise("collectives.mpi", 3, ("test_collectives::test_collectives_match_references*",
                                    "test_ring_exercise::test_naive_ring_allreduce_*"),
             requires=("collectives.reference",)),
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
    "needle/backend_ndarray/fused_ops.py::logsumexp_naive": "hw2.ops.logsumexp",  # GPU fallback
    "needle/backend_ndarray/fused_ops.py::dropout_naive": "hw2.nn.dropout",  # ops.dropout on CPU
    "needle/parallel/comm/algorithms/ring.py::ring_reduce_scatter": "collectives.mpi",
    "needle/parallel/comm/algorithms/ring.py::ring_gather": "collectives.mpi",
    "needle/parallel/comm/algorithms/latency_bound.py::recursive_doubling_allreduce":
        "collectives.mpi",
    "needle/parallel/comm/algorithms/latency_bound.py::binomial_broadcast": "collectives.mpi",
    "needle/parallel/comm/algorithms/latency_bound.py::binomial_reduce": "collectives.mpi",
}


# The course order: an exercise may require exercises of its own homework or of an earlier one.
HOMEWORKS: Tuple[str, ...] = ("hw0", "hw1", "hw2", "hw3", "hw4", "collectives")

# The array each homework's graded tests compute on (needle/backend_selection.py): hw1 and hw2
# on NumPy arrays, as in the course, so that they need nothing from hw3's NDArray; every other
# exercise on the NDArray. The grader (course/grade_plugin.py) runs each graded test on its own.
HOMEWORK_BACKEND: Dict[str, str] = {"hw1": "np", "hw2": "np"}


def backend_of(exercise: str) -> str:
    """The backend (``"np"`` or ``"nd"``) exercise ``exercise``'s graded tests run on."""
    return HOMEWORK_BACKEND.get(exercise.split(".")[0], "nd")


def test_files(names: Sequence[str], root: Path) -> List[str]:
    """The test modules (paths relative to ``root``) the rubric names for the exercises."""
    stems = {pattern.partition("::")[0] for ex in EXERCISES if ex.name in names
             for pattern in ex.tests}
    return sorted(str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py")
                  if p.stem in stems and "__pycache__" not in p.parts)


def requirements(name: str) -> Set[str]:
    """Every exercise ``name`` requires, directly or through another requirement."""
    by_name = {ex.name: ex for ex in EXERCISES}
    seen: Set[str] = set()
    todo = list(by_name[name].requires)
    while todo:
        req = todo.pop()
        if req not in seen:
            seen.add(req)
            todo.extend(by_name[req].requires if req in by_name else ())
    return seen


def order_problems() -> List[str]:
    """Requirements against the course order: an exercise requiring one of a later homework
    (or of a homework ``HOMEWORKS`` does not place)."""
    homework = {ex.name: ex.homework for ex in EXERCISES}
    problems = [f"{ex.name}: its homework {ex.homework} is not in the course order "
                f"{HOMEWORKS} (course/exercises.py)" for ex in EXERCISES
                if ex.homework not in HOMEWORKS]
    for ex in EXERCISES:
        for req in ex.requires:
            hw = homework.get(req)
            if ex.homework in HOMEWORKS and hw in HOMEWORKS and (
                    HOMEWORKS.index(hw) > HOMEWORKS.index(ex.homework)):
                problems.append(f"{ex.name} requires {req}, of {hw}, which the course "
                                f"teaches after {ex.homework}: a student at {ex.homework} "
                                f"cannot have written it")
    return problems


def requires_problems() -> List[str]:
    """What is wrong with the ``requires`` graph: unknown ids, self-loops, cycles, and
    requirements from a later homework (``order_problems``)."""
    names = {ex.name for ex in EXERCISES}
    problems = [f"{ex.name} requires {r}: no such exercise" for ex in EXERCISES
                for r in ex.requires if r not in names]
    problems += [f"{ex.name} requires itself (through {sorted(ex.requires)})"
                 for ex in EXERCISES if ex.name in requirements(ex.name)]
    return problems + order_problems()
