"""Upper bounds on what one training step asks of the GPU (``benchmarks/bench_step_counts.py``):
kernel launches, CuPy library calls, allocations, copies, synchronisations and Python calls per
phase, counted on the emulator (the counts are a GPU's: they follow the program, not the card).
A change that adds work to a step fails here, naming the kernels and calls of that phase."""
import pytest

import needle as ndl
from benchmarks.bench_step_counts import PHASES, measure

pytestmark = [pytest.mark.cuda, pytest.mark.slow]

# model -> phase -> kind -> the most allowed per step
BOUNDS = {
    "lm": {"forward": dict(launch=93, library=40, alloc=171, h2d=6, d2h=3, sync=3,
                           python_calls=7776),
           "backward": dict(launch=148, library=152, alloc=314, h2d=0, d2h=2, sync=2,
                            python_calls=15567),
           "optimizer": dict(launch=136, library=0, alloc=68, h2d=0, d2h=0, sync=0,
                             python_calls=6289)},
    "resnet9": {"forward": dict(launch=249, library=38, alloc=280, h2d=1, d2h=1, sync=1,
                                python_calls=12736),
                "backward": dict(launch=357, library=101, alloc=438, h2d=0, d2h=0, sync=0,
                                 python_calls=24925),
                "optimizer": dict(launch=80, library=0, alloc=44, h2d=0, d2h=0, sync=0,
                                  python_calls=3337)},
}


@pytest.fixture(scope="module")
def emulated() -> None:
    if not getattr(ndl.cuda().mod, "EMULATED", False):
        pytest.skip("counts are read at the emulator's CuPy surface (a GPU run has none)")


@pytest.mark.parametrize("model", sorted(BOUNDS))
def test_a_training_step_stays_within_its_counts(emulated: None, model: str) -> None:
    got = measure(model)
    over = []
    for phase in PHASES:
        for kind, bound in BOUNDS[model][phase].items():
            n = got[phase][kind]
            if n > bound:
                names = got[phase]["by_name"].get(kind, {})
                top = ", ".join(f"{k} x{v}" for k, v in sorted(names.items(),
                                                              key=lambda kv: -kv[1])[:12])
                over.append(f"{model} {phase}: {n} {kind} > {bound}" + (f" ({top})" if top
                                                                       else ""))
    assert not over, "a step asks more of the GPU than before:\n" + "\n".join(over)
