"""Upper bounds on what one training step asks of the GPU (``benchmarks/bench_step_counts.py``):
kernel launches, CuPy library calls, allocations, copies, synchronisations and Python calls per
phase, counted on the emulator (the counts are a GPU's: they follow the program, not the card).
A change that adds work to a step fails here, naming the kernels and calls of that phase."""
import pytest

import needle as ndl
from benchmarks.bench_step_counts import PHASES, measure

pytestmark = [pytest.mark.cuda, pytest.mark.slow]

# model -> phase -> kind -> the most allowed per step: the counts measured when they were
# last lowered (``python benchmarks/bench_step_counts.py``), Python calls with 5% slack (the
# cycle collector's timing moves a few __del__ calls between phases). Before the work that
# cut them: LM 377 launches, 5 syncs, 6 uploads, 553 buffers, 29.6k Python calls per step;
# ResNet9 686 launches, 762 buffers, 41.0k Python calls. The optimizer's Python calls rose by
# two per parameter (1533 -> 1600 LM, 419 -> 475 ResNet9) when each gradient's device began
# to be checked against its parameter's (a gradient on another device was stepped silently).
BOUNDS = {
    "lm": {"forward": dict(launch=78, library=40, alloc=1, h2d=1, d2h=0, sync=0, buffers=150,
                           python_calls=4262),
           "backward": dict(launch=159, library=79, alloc=4, h2d=0, d2h=0, sync=0,
                            buffers=248, python_calls=8100),
           "optimizer": dict(launch=2, library=0, alloc=0, h2d=1, d2h=0, sync=0, buffers=0,
                             python_calls=1680)},
    "resnet9": {"forward": dict(launch=55, library=14, alloc=1, h2d=1, d2h=0, sync=0,
                                buffers=77, python_calls=2697),
                "backward": dict(launch=77, library=39, alloc=9, h2d=0, d2h=0, sync=0,
                                 buffers=107, python_calls=4661),
                "optimizer": dict(launch=2, library=0, alloc=0, h2d=1, d2h=0, sync=0,
                                  buffers=0, python_calls=499)},
}

# With the course's reductions (reduce.cu: the student release, which has no reduce_fast.cu,
# or NEEDLE_CUDA_REDUCE=course) a reduction over a middle axis copies its input transposed
# first: these many more library calls (the copies) and buffers per step, as measured.
COURSE_REDUCE_EXTRA = {"lm": {"backward": dict(library=9, buffers=9)},
                       "resnet9": {"backward": dict(library=2, buffers=2)}}


def bound(model: str, phase: str, kind: str) -> int:
    """The most ``kind`` allowed in ``phase`` of ``model``'s step on this reduction path."""
    extra = 0
    if ndl.cuda().mod.get_reduce_kernel() == "course":
        extra = COURSE_REDUCE_EXTRA[model].get(phase, {}).get(kind, 0)
    return BOUNDS[model][phase][kind] + extra


@pytest.fixture(scope="module")
def emulated() -> None:
    if not getattr(ndl.cuda().mod, "EMULATED", False):
        pytest.skip("counts are read at the emulator's CuPy surface (a GPU run has none)")


@pytest.mark.parametrize("model", sorted(BOUNDS))
def test_a_training_step_stays_within_its_counts(emulated: None, model: str) -> None:
    got = measure(model)
    over = []
    for phase in PHASES:
        for kind in BOUNDS[model][phase]:
            n, most = got[phase][kind], bound(model, phase, kind)
            if n > most:
                names = got[phase]["by_name"].get(kind, {})
                top = ", ".join(f"{k} x{v}" for k, v in sorted(names.items(),
                                                              key=lambda kv: -kv[1])[:12])
                over.append(f"{model} {phase}: {n} {kind} > {most}" + (f" ({top})" if top
                                                                      else ""))
    assert not over, "a step asks more of the GPU than before:\n" + "\n".join(over)


# needle.compile(mode="reduce-overhead"): the forward and backward replayed as one CUDA graph;
# outside it only the two arguments' copies into the graph's static inputs (the ids or images,
# and the labels). Python calls as measured with 5% slack.
GRAPH_BOUNDS = {"lm": dict(graph=1, launch=2, library=0, alloc=0, h2d=0, d2h=0, sync=0,
                           buffers=0, python_calls=112),
                "resnet9": dict(graph=1, launch=2, library=0, alloc=0, h2d=0, d2h=0, sync=0,
                                buffers=0, python_calls=80)}


@pytest.mark.parametrize("model", sorted(GRAPH_BOUNDS))
def test_a_compiled_step_replays_as_one_graph_launch(emulated: None, model: str) -> None:
    got = measure(model, "reduce-overhead")["compiled"]
    over = [f"{kind}: {got[kind]} > {bound} ({got['by_name'].get(kind, {})})"
            for kind, bound in GRAPH_BOUNDS[model].items() if got[kind] > bound]
    assert got["graph"] == 1, got["by_name"]
    assert not over, f"{model}, a replayed compiled step:\n" + "\n".join(over)
