"""Nonsense configurations get an error naming the field and the rule."""
import pytest

from needle.plan import Layout, Setup, cluster, model, plan
from needle.plan.__main__ import main

A100 = cluster.preset("dgx-a100-80g")
GPT2 = model.preset("gpt2-small")


@pytest.mark.parametrize("argv,words", [
    (["--layers", "12", "--hidden", "768", "--heads", "7", "--seq", "64", "--vocab", "100"],
     ["heads must divide hidden", "768", "7"]),
    (["--model", "gpt2-small", "--layers", "0"], ["layers", "positive"]),
    (["--model", "gpt2-small", "--hidden", "-768"], ["hidden", "positive"]),
    (["--params", "0"], ["params", "> 0"]),
    (["--params", "1e9", "--gpus", "0"], ["gpus", "positive"]),
    (["--params", "1e9", "--gpus", "12", "--gpus-per-node", "8"], ["gpus=12", "multiple"]),
    (["--params", "1e9", "--gpu-memory", "0"], ["gpu_memory", "> 0"]),
    (["--model", "gpt2-small", "--batch", "-4"], ["batch", "positive"]),
    (["--model", "gpt2-small", "--batch", "6", "--microbatch", "4"],
     ["batch=6", "microbatch=4"]),
    (["--model", "nope"], ["unknown model preset", "gpt2-small"]),
    (["--model", "gpt2-small", "--gpus-per-node", "0"], ["gpus-per-node", "positive"]),
    (["--params", "inf"], ["params", "finite"]),
    (["--model", "gpt2-small", "--efficiency", "1.5"], ["efficiency", "at most 1"]),
    (["--model", "gpt2-small", "--heads", "0"], ["heads", "positive"]),
    (["--model", "gpt2-small", "--microbatch", "0"], ["microbatch", "positive"]),
    (["--layers", "12"], ["missing", "hidden"]),
])
def test_cli_names_the_field_and_the_rule(argv, words, capsys):
    try:
        status = main(argv)
    except SystemExit as exit_:  # the parser's own errors (--params inf)
        status = exit_.code
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m needle.plan: error: ")
    for w in words:
        assert w in err, (w, err)


@pytest.mark.parametrize("lay,words", [
    (Layout(tp=16), ["tp=16", "larger than a node", "TP across nodes"]),
    (Layout(dp=8, microbatch=2), ["batch=8", "dp x microbatch", "8 x 2"]),
    (Layout(tp=2, pp=5), ["pp x chunks", "layers=12"]),
    (Layout(dp=0), ["dp", "positive"]),
    (Layout(dp=4, pp=6), ["4 x 1 x 6 = 24", "16 GPUs"]),
    (Layout(zero=4), ["zero", "0, 1, 2 or 3"]),
])
def test_explicit_layouts_are_checked(lay, words):
    with pytest.raises(ValueError) as info:
        plan(GPT2, Setup(batch=8), cluster.preset("dgx-a100-80g", nodes=2), layouts=[lay])
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_tp_not_dividing_heads():
    spec = model.preset("gpt2-xl")  # 25 heads
    with pytest.raises(ValueError, match="tp=2 must divide heads=25"):
        plan(spec, Setup(batch=8), A100, layouts=[Layout(dp=4, tp=2)])


def test_enumeration_lists_tp_across_nodes_as_why_not():
    preds = plan(GPT2, Setup(batch=32), cluster.preset("dgx-a100-80g", nodes=2))
    assert any(p.why_not and "TP across nodes" in p.why_not for p in preds)
    assert not any(p.fits and p.layout.tp > 8 for p in preds)
