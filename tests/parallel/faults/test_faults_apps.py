"""Fault injection, tools: the training app refuses options that do not apply and input that
cannot work, at start-up, naming it; ``--plot`` draws what was measured or says it has nothing;
``python -m needle.estimate`` answers at once for a huge model."""
import subprocess
import sys
import time
import types

import pytest
from mpi_helpers import ROOT, worker_env

from apps import train_parallel as tp

pytestmark = pytest.mark.faults


def parse(*argv):
    p = tp.parser()
    return tp.finish_args(p, p.parse_args(list(argv)))


@pytest.mark.parametrize("argv,message", [
    (["--strategy", "ddp", "--steps", "0"], "--steps must be at least 1, not 0"),
    (["--strategy", "tp", "--batch", "0"], "--batch must be at least 1, not 0"),
    (["--strategy", "tp", "--sequence-parallel"], "--sequence-parallel does not apply"),
    (["--strategy", "3d", "--sequence-parallel"], "no strategy supports it yet"),
    (["--strategy", "ddp", "--microbatches", "8"], "--microbatches does not apply to "
                                                   "--strategy ddp (it is for pp, 3d)"),
    (["--strategy", "tp", "--bucket-mb", "4"], "--bucket-mb does not apply to --strategy tp"),
    (["--strategy", "ps", "--staleness", "3"], "--staleness applies to --consistency ssp"),
    (["--strategy", "fsdp", "--lr", "0"], "--lr must be > 0"),
    (["--strategy", "pp", "--batch", "6", "--microbatches", "4"],
     "--microbatches 4 does not divide the 6 rows of --batch 6"),
])
def test_options_that_cannot_work_are_refused_at_start_up(capsys, argv, message):
    with pytest.raises(SystemExit):
        parse(*argv)
    assert message in capsys.readouterr().err


def test_each_family_gets_its_own_default_steps():
    """Both families register --steps (60 and 20): neither silently wins for the other."""
    assert parse("--strategy", "ddp").steps == 60 and parse("--strategy", "tp").steps == 20
    assert parse("--strategy", "ddp").batch == 32 and parse("--strategy", "pp").batch == 16
    assert parse("--strategy", "tp", "--steps", "3").steps == 3


def test_batch_larger_than_the_data_is_refused_naming_it():
    from apps.data_parallel_strategies import Digits
    args = types.SimpleNamespace(batch=720, seed=0, dtype="float32")
    task = Digits(args, None)
    with pytest.raises(ValueError, match="--batch 720 is more than the .* training examples "
                                         "each of the 2 ranks gets"):
        task.batches(0, 2)


def test_plot_draws_what_each_strategy_measured_or_says_nothing(tmp_path):
    mp_out = {"strategy": "tp", "ranks": 2, "losses": [3.0, 2.5, 2.0]}
    ps_out = {"strategy": "ps-bsp", "ranks": 3, "history": [],
              "worker_histories": {1: [(0.1, 2.0), (0.2, 1.5)], 2: [(0.1, 2.1)]},
              "bytes_sent": [10, 20, 30]}
    for name, out in (("tp", mp_out), ("ps", ps_out)):
        path = tmp_path / f"{name}.png"
        assert tp.plot(out, str(path)) and path.stat().st_size > 0
    assert [k for k in tp._loss_curves(ps_out)] == ["worker rank 1", "worker rank 2"]
    assert not tp.plot({"strategy": "x", "ranks": 2}, str(tmp_path / "none.png"))
    assert not (tmp_path / "none.png").exists()


def test_estimate_of_a_million_layers_answers_at_once():
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "needle.estimate", "--layers", "1000000"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=worker_env(), stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    assert time.monotonic() - start < 20, "the estimate must be closed-form, not per parameter"
    L, h, V, s = 1_000_000, 768, 50257, 1024  # the defaults: GPT-2 small, a million layers
    psi = 12 * L * h * h + 13 * L * h + V * h + s * h  # Narayanan et al. 2021, eq. (2) terms
    line = next(x for x in res.stdout.splitlines() if x.startswith("optimizer_state"))
    assert int(line.split()[1].replace(",", "")) == 8 * psi  # Adam: m and v in fp32
