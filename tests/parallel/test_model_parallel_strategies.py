"""apps/model_parallel_strategies.py: each strategy trains the character transformer a few steps
on the virtual cluster and the loss goes down."""
import argparse

import pytest

from apps.model_parallel_strategies import STRATEGIES, add_arguments
from needle.parallel import virtual


def _args(**kw):
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--steps", "4", "--batch", "8", "--seq-len", "8", "--d-model", "16",
                         "--heads", "2", "--layers", "2", "--chars", "20000", "--lr", "1e-2"])
    for k, v in kw.items():
        setattr(args, k, v)
    return args


@pytest.mark.parametrize("strategy,k,kw", [
    ("tp", 2, {}), ("pp", 2, {"schedule": "1f1b"}), ("pp", 2, {"schedule": "interleaved"}),
    ("3d", 8, {"dp": 2, "pp": 2, "tp": 2}), ("moe", 2, {})])
def test_strategy_trains(strategy, k, kw):
    out = virtual.run(k, STRATEGIES[strategy], _args(**kw))
    assert out[0]["last_loss"] < out[0]["first_loss"]
    assert all(o["last_loss"] == out[0]["last_loss"] for o in out)   # one loss on every rank
