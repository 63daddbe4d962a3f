"""Optimizer hyperparameters and schedule settings are checked where they are set: a nan, inf,
negative (where meaningless) or wrongly typed value raises naming the optimizer, the parameter
and the value, at construction, when a schedule or ``load_state_dict`` sets it."""
import math

import numpy as np
import pytest

import needle as ndl
from needle import nn, optim
from needle.optim.hyper import Hyper

NAN, INF = float("nan"), float("inf")


def _params():
    return [nn.Parameter(ndl.init.ones(3))]


def _good(cls):
    return dict(lr=0.1) if cls is optim.Adafactor else {}


# (optimizer, parameter, bad value, what the error says after "Opt: param value must be")
BAD = [(cls, "lr", v, r"a finite number >= 0") for cls in (optim.SGD, optim.Adam, optim.AdamW)
       for v in (NAN, INF, -INF, -0.1)]
BAD += [(optim.SGD, "momentum", v, r"a finite number in \[0, 1\)") for v in (NAN, -0.5, 1, 1.5)]
BAD += [(cls, k, v, r"a finite number in \[0, 1\)") for cls in (optim.Adam, optim.AdamW)
        for k in ("beta1", "beta2") for v in (NAN, INF, -0.1, 1.0)]
BAD += [(cls, k, v, r"a finite number >= 0") for cls in (optim.SGD, optim.Adam, optim.AdamW)
        for k in ("weight_decay",) for v in (NAN, INF, -1e-4)]
BAD += [(cls, "eps", v, r"a finite number >= 0") for cls in (optim.Adam, optim.AdamW)
        for v in (NAN, INF, -1e-8)]
BAD += [(optim.Adafactor, k, v, rule) for k, v, rule in (
    ("lr", NAN, r"a finite number >= 0"), ("lr", -1.0, r"a finite number >= 0"),
    ("beta1", 1.0, r"a finite number in \[0, 1\)"), ("eps1", -1.0, r"a finite number >= 0"),
    ("eps2", INF, r"a finite number >= 0"), ("clip_threshold", 0.0, r"a finite number > 0"),
    ("decay_rate", 0.8, r"a finite number <= 0"), ("weight_decay", NAN, r"a finite number >= 0"),
    ("relative_step", 1, r"True or False"), ("scale_parameter", "yes", r"True or False"))]
# wrong types: a string, a bool, a container, a tensor, None where a number is needed
BAD += [(optim.SGD, "lr", v, r"a finite number, not " + t) for v, t in (
    ("0.1", "str"), (True, "bool"), ([0.1], "list"), (None, "NoneType"),
    (ndl.Tensor([0.1]), "Tensor"), (np.array([0.1]), "ndarray"))]
BAD += [(optim.Adam, "beta2", "0.999", r"a finite number, not str"),
        (optim.Adafactor, "lr", "0.1", r"a finite number or None, not str")]


@pytest.mark.parametrize("cls, name, value, rule", BAD,
                         ids=[f"{c.__name__}-{k}={v!r}"[:60] for c, k, v, _ in BAD])
def test_a_bad_hyperparameter_is_named_at_construction(cls, name, value, rule):
    with pytest.raises(ValueError, match=rf"^{cls.__name__}: {name} .* must be {rule}"):
        cls(_params(), **{**_good(cls), name: value})


@pytest.mark.parametrize("cls", [optim.SGD, optim.Adam, optim.AdamW, optim.Adafactor])
def test_a_bad_hyperparameter_set_later_is_named_and_the_old_value_kept(cls):
    opt = cls(_params(), **_good(cls))
    with pytest.raises(ValueError, match=rf"^{cls.__name__}: lr nan must be a finite number"):
        opt.lr = NAN
    assert opt.lr == 0.1 if cls is optim.Adafactor else opt.lr == cls(_params()).lr
    opt.lr = 0.0  # a schedule may end at 0: the parameters stay where they are
    assert opt.lr == 0.0


def test_good_values_are_kept_as_python_numbers():
    """NumPy scalars (an np.float32 learning rate) become Python floats, ints become floats,
    and a step reads them as plain instance attributes."""
    opt = optim.Adam(_params(), lr=np.float32(0.5), beta1=0, beta2=np.float64(0.9), eps=0)
    assert type(opt.lr) is float and opt.lr == 0.5 and opt.beta1 == 0.0 and opt.eps == 0.0
    assert type(opt.beta2) is float and opt.__dict__["lr"] == 0.5
    assert not hasattr(Hyper, "__get__")  # no call in step() for reading a hyperparameter
    sgd = optim.SGD(_params(), lr=1, momentum=0.0, weight_decay=np.int64(0))
    assert sgd.lr == 1.0 and sgd.weight_decay == 0.0
    ada = optim.Adafactor(_params())
    assert ada.lr is None and ada.beta1 is None and ada.relative_step is True


def test_adam_step_count_is_a_whole_number():
    opt = optim.Adam(_params())
    for bad in (-1, 1.5, NAN, "3"):
        with pytest.raises(ValueError, match=r"^Adam: t .* must be a whole number"):
            opt.t = bad
    opt.t = 3.0
    assert opt.t == 3 and type(opt.t) is int


def test_load_state_dict_refuses_a_bad_saved_hyperparameter():
    opt = optim.SGD(_params(), lr=0.1, momentum=0.9)
    state = opt.state_dict()
    state["hyper"]["momentum"] = 1.0
    with pytest.raises(ValueError, match=r"^SGD: momentum 1.0 must be a finite number in \[0, 1\)"):
        opt.load_state_dict(state)
    state["hyper"]["momentum"] = 0.5
    opt.load_state_dict(state)
    assert opt.momentum == 0.5


def test_a_schedule_that_would_set_a_bad_lr_is_refused():
    """A gamma of nan, inf or below 0 made every scheduled lr nan, inf or negative."""
    for bad in (NAN, INF, -0.5):
        with pytest.raises(ValueError, match=r"^StepLR: gamma .* must be a finite number >= 0"):
            optim.StepLR(optim.SGD(_params()), step_size=2, gamma=bad)
    opt = optim.SGD(_params(), lr=1e300)
    sched = optim.StepLR(opt, step_size=1, gamma=1e300)  # the first lr overflows to inf
    with pytest.raises(ValueError, match=r"^SGD: lr inf must be a finite number >= 0"):
        sched.step()


@pytest.mark.parametrize("make, words", [
    (lambda o: optim.StepLR(o, step_size=NAN), r"StepLR: step_size nan must be a whole number"),
    (lambda o: optim.StepLR(o, step_size=2.5), r"StepLR: step_size 2.5 must be a whole number"),
    (lambda o: optim.StepLR(o, step_size=0), r"StepLR: step_size 0 must be a whole number >= 1"),
    (lambda o: optim.CosineAnnealing(o, T_max=INF), r"CosineAnnealing: T_max inf must be"),
    (lambda o: optim.CosineAnnealing(o, T_max=5, eta_min=-1.0),
     r"CosineAnnealing: eta_min -1.0 must be a finite number >= 0"),
    (lambda o: optim.LinearWarmup(o, NAN), r"LinearWarmup: warmup_steps nan must be"),
    (lambda o: optim.LinearWarmup(o, 0), r"LinearWarmup: warmup_steps 0 must be"),
])
def test_schedule_settings_are_named(make, words):
    with pytest.raises(ValueError, match="^" + words):
        make(optim.SGD(_params()))


def test_schedule_state_is_checked_on_load():
    sched = optim.StepLR(optim.SGD(_params()), step_size=2)
    with pytest.raises(ValueError, match=r"last_step -1 must be a whole number >= 0"):
        sched.load_state_dict({"last_step": -1, "base_lr": 0.1})
    with pytest.raises(ValueError, match=r"base_lr nan must be a finite number >= 0"):
        sched.load_state_dict({"last_step": 1, "base_lr": NAN})


@pytest.mark.parametrize("max_norm", [NAN, INF, 0.0, -1.0])
def test_clip_grad_norm_refuses_a_max_norm_that_never_clips(max_norm):
    """max_norm=nan compared False with everything: the gradients were silently left alone."""
    p = nn.Parameter(ndl.init.ones(3))
    p.grad = ndl.init.ones(3) * 100
    with pytest.raises(ValueError, match=r"^clip_grad_norm: max_norm .* must be a finite number"):
        optim.clip_grad_norm([p], max_norm)
    assert math.isclose(optim.clip_grad_norm([p], 1.0), math.sqrt(3) * 100, rel_tol=1e-5)
    assert np.linalg.norm(p.grad.numpy()) <= 1.0 + 1e-5
