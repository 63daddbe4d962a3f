"""needle.profiler on one process: ops, modules, backward, memory, kernels, compiled programs,
data loading, optimizer steps, record_function, the schedule, the tables and the trace."""
import gc
import json

import numpy as np
import pytest

import needle as ndl
from needle import nn, profiler
from needle.backend_ndarray import fused_elementwise_cpu
from needle.process_state import switches
from needle.profiler import ProfilerAction, schedule


def _t(*shape, device=None):
    return ndl.Tensor(np.random.randn(*shape), device=device, dtype="float32",
                      requires_grad=False)


def _named(prof, cat):
    return [e for e in prof.events() if e.cat == cat]


def test_ops_are_grouped_under_their_module_path_forward_and_backward():
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    paths = {type(m).__name__ + n for n, m in model.named_modules()}
    x = _t(4, 3)
    with profiler.profile() as prof:
        model(x).sum().backward()
    modules = [e.name for e in _named(prof, "module")]
    assert modules == ["Sequential", "modules.0 (Linear)", "modules.1 (ReLU)",
                       "modules.2 (Linear)"]
    assert {"Linearmodules.0", "ReLUmodules.1", "Linearmodules.2"} <= paths
    matmuls = [e for e in _named(prof, "op") if e.name == "MatMul"]
    first = matmuls[0]
    assert first.args["input_shapes"] == ((4, 3), (3, 5))
    assert first.args["module"] == "modules.0 (Linear)"
    assert first.args["dtype"] == "float32" and first.args["device"] == "cpu()"
    grads = [e for e in _named(prof, "backward") if e.name == "MatMulBackward"]
    assert sorted(g.args["module"] for g in grads) == ["modules.0 (Linear)",
                                                       "modules.2 (Linear)"]
    # the ops a gradient runs are timed inside it, and say which module they belong to
    inside = [e for e in _named(prof, "op")
              if grads[0].ts <= e.ts and e.end <= grads[0].end]
    assert inside and all(e.args["module"] == grads[0].args["module"] for e in inside)


def test_bytes_allocated_and_freed_per_op_and_the_peak():
    a, b = _t(4, 5), _t(4, 5)
    with profiler.profile() as prof:
        c = a + b            # 80 bytes
        d = c * 2.0          # 80 more: the peak, reached in MulScalar
        del c, d             # both freed
    ops = {e.name: e for e in _named(prof, "op")}
    assert ops["EWiseAdd"].args["bytes_allocated"] == 4 * 5 * 4
    assert ops["MulScalar"].args["bytes_allocated"] == 4 * 5 * 4
    peak = prof.record.peaks["cpu"]
    assert (peak.allocated, peak.at) == (160, "MulScalar")
    assert [s.allocated for s in prof.record.samples] == [80, 160, 80, 0]


def test_shapes_and_memory_can_be_left_out():
    a, b = _t(4, 5), _t(4, 5)
    with profiler.profile(record_shapes=False, profile_memory=False) as prof:
        c = a + b
        del c
    (op,) = _named(prof, "op")
    assert op.name == "EWiseAdd" and op.args["dtype"] == "float32"
    assert "input_shapes" not in op.args and "bytes_allocated" not in op.args
    assert prof.record.samples == [] and prof.record.peaks == {}
    assert "ops by self time" in prof.summary()


def test_recording_leaves_nothing_for_the_garbage_collector_to_scan():
    """The hot path logs numbers and strings (shapes interned): a tracked object per op would
    make each collection slower the longer the recording, charged to the program's ops."""
    a = _t(4, 4)
    with profiler.profile():
        with profiler.record_function("warm"):
            a + a  # its shapes are interned now
        gc.collect()
        gc.disable()
        try:
            before = len(gc.get_objects())
            for _ in range(500):
                a + a
            grown = len(gc.get_objects()) - before
        finally:
            gc.enable()
    assert grown < 50, grown


def test_events_past_max_events_are_counted_as_dropped():
    a = _t(3)
    with profiler.profile(max_events=2) as prof:
        for _ in range(5):
            a + a
    assert len(_named(prof, "op")) == 2
    assert prof.record.dropped == 3 and "3 events dropped" in prof.summary()


def test_a_gradient_computed_outside_any_module_is_named_after_its_op():
    x = ndl.Tensor(np.ones((2, 3)), dtype="float32", requires_grad=True)
    with profiler.profile() as prof:
        (x * 2.0).sum().backward()
    grads = {e.name: e for e in _named(prof, "backward")}
    assert {"SummationBackward", "MulScalarBackward"} <= set(grads)
    assert all(g.args["module"] == "" for g in grads.values())
    # a gradient's ops are timed inside it
    inside = [e for e in _named(prof, "op") if grads["MulScalarBackward"].ts <= e.ts
              and e.end <= grads["MulScalarBackward"].end]
    assert [e.name for e in inside] == ["MulScalar"]


@pytest.mark.skipif(not ndl.cuda().enabled(), reason="no CUDA device and no emulator")
def test_kernel_launches_on_cuda_are_recorded_inside_their_op():
    a, b = _t(8, 8, device=ndl.cuda()), _t(8, 8, device=ndl.cuda())
    with profiler.profile() as prof:
        a + b  # (a matmul calls cuBLAS, which launches no kernel of needle's)
    kernels = _named(prof, "kernel")
    assert kernels and all(k.args["op"] == "EWiseAdd" for k in kernels)
    emulated = getattr(ndl.cuda().mod, "EMULATED", False)
    assert all(k.args["emulated"] == emulated for k in kernels)
    assert all(len(k.args["grid"]) >= 1 and len(k.args["block"]) >= 1 for k in kernels)
    assert prof.record.peaks["cuda:0"].allocated == 8 * 8 * 4


def test_compiled_programs_steps_and_fused_kernels(monkeypatch):
    monkeypatch.setattr(fused_elementwise_cpu, "ENGINE", "numpy")  # no numba build here
    f = ndl.compile(lambda x: ((x * 2.0 + 1.0).exp() * x).sum())
    x = _t(16, 16)
    f(x)
    f(x)  # compiled now: the third call replays the plan
    with profiler.profile() as prof:
        f(x)
    assert len(_named(prof, "compiled_program")) == 1
    steps = _named(prof, "program_step")
    assert any(s.args["fused"] for s in steps), [s.name for s in steps]


def test_data_loading_optimizer_step_and_user_ranges():
    ds = ndl.data.NDArrayDataset(np.ones((8, 3), dtype=np.float32))
    model = nn.Linear(3, 1)
    opt = ndl.optim.Adam(model.parameters(), lr=0.1)

    @profiler.record_function("decorated")
    def step(batch):
        model(batch[0]).sum().backward()
        opt.step()
    with profiler.profile() as prof:
        for batch in ndl.data.DataLoader(ds, batch_size=4):
            with profiler.record_function("iteration"):
                step(batch)
    names = [e.name for e in prof.events()]
    assert names.count("DataLoader.__next__") == 3  # two batches, then StopIteration
    assert names.count("Optimizer.step#Adam.step") == 2
    assert names.count("iteration") == names.count("decorated") == 2
    it = next(e for e in prof.events() if e.name == "iteration")
    inner = next(e for e in prof.events() if e.name == "decorated")
    assert it.ts <= inner.ts and inner.end <= it.end


def test_record_function_does_nothing_outside_a_profile():
    with profiler.record_function("alone"):
        y = _t(2) + _t(2)
    assert y.shape == (2,)
    assert switches.profiler is None
    with pytest.raises(ValueError, match="non-empty str"):
        profiler.record_function("")


def test_schedule_is_torch_profilers():
    act = schedule(wait=1, warmup=1, active=2, repeat=2, skip_first=1)
    N, W, R, S = (ProfilerAction.NONE, ProfilerAction.WARMUP, ProfilerAction.RECORD,
                  ProfilerAction.RECORD_AND_SAVE)
    assert [act(i) for i in range(11)] == [N, N, W, R, S, N, W, R, S, N, N]
    with pytest.raises(ValueError, match="active must be an int >= 1"):
        schedule(wait=0, warmup=0, active=0)


def test_profile_with_schedule_records_the_active_steps_only():
    saved = []
    sched = schedule(wait=1, warmup=1, active=2, repeat=1)
    with profiler.profile(schedule=sched, on_trace_ready=lambda p: saved.append(p.events())
                          ) as prof:
        for i in range(6):
            with profiler.record_function(f"work {i}"):
                _t(2) + _t(2)
            prof.step()
    assert len(saved) == 1
    names = [e.name for e in saved[0] if e.cat in ("user_annotation", "profiler_step")]
    assert sorted(names) == ["ProfilerStep#2", "ProfilerStep#3", "work 2", "work 3"]


def test_tables_and_summary():
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    with profiler.profile() as prof:
        model(_t(4, 3)).sum().backward()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=5)
    assert "MatMul" in table or "Sequential" in table
    rows = {r.key: r for r in prof.key_averages()}
    seq = rows["Sequential"]
    # a module's self time is its time minus that of the modules and ops inside it
    inside = [e for e in prof.events() if e.cat == "module" and e.name != "Sequential"]
    assert seq.self_cpu_time_total <= seq.cpu_time_total - sum(e.dur for e in inside) / 1e3 + 1e-6
    by_shape = prof.key_averages(group_by_input_shape=True)
    assert any(r.input_shapes == "((4, 3), (3, 5))" for r in by_shape)
    text = prof.summary()
    assert "ops by self time" in text and "us per op" in text and "memory peak" in text
    with pytest.raises(ValueError, match="sort_by must be one of"):
        prof.key_averages().table(sort_by="cuda_time")


def test_exported_trace_follows_the_format(tmp_path):
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    with profiler.profile() as prof:
        with profiler.record_function("step"):
            model(_t(4, 3)).sum().backward()
    path = prof.export_chrome_trace(str(tmp_path / "t.json"))
    trace = profiler.check_trace(path)
    phases = {e["ph"] for e in trace["traceEvents"]}
    assert phases == {"M", "X", "C", "i"}
    assert json.loads(open(path).read()) == trace


def test_hooks_are_off_after_the_block_even_on_an_error():
    with pytest.raises(RuntimeError, match="boom"):
        with profiler.profile():
            raise RuntimeError("boom")
    assert switches.profiler is None
    with profiler.profile() as prof:
        _t(2) + _t(2)
    assert [e.name for e in prof.events()] == ["EWiseAdd"]
    _t(2) + _t(2)  # after the block: recorded nowhere
    assert len(prof.events()) == 1


def test_a_nested_profile_is_refused_and_the_outer_keeps_recording():
    """A profile inside another on the same thread took the thread's recorder: the outer one
    silently lost every event after the inner block. Now the inner one is refused, named, and
    the outer records on; a profile on another thread (a virtual rank) is not nested."""
    import threading
    with profiler.profile() as outer:
        _t(2) + _t(2)
        with pytest.raises(RuntimeError, match=r"already being profiled by an enclosing "
                                               r"profile\(\); nested profilers are refused"):
            with profiler.profile():
                pass
        with pytest.raises(RuntimeError, match="already started on this thread"):
            outer.start()
        inner_thread = []

        def other_thread():
            with profiler.profile() as p:
                _t(3) * _t(3)
            inner_thread.append([e.name for e in p.events()])
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        _t(2) - _t(2)
    # the add before the inner block, the subtraction (add of a negation) after it
    assert sorted(e.name for e in outer.events() if e.cat == "op") == ["EWiseAdd", "EWiseAdd",
                                                                       "Negate"]
    assert inner_thread == [["EWiseMul"]]
    assert switches.profiler is None
    with profiler.profile() as again:  # the thread is free after the block
        _t(2) + _t(2)
    assert [e.name for e in again.events()] == ["EWiseAdd"]


def test_a_profile_whose_trace_handler_raises_frees_the_thread():
    def boom(prof):
        raise OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        with profiler.profile(schedule=schedule(wait=0, warmup=0, active=1, repeat=1),
                              on_trace_ready=boom) as prof:
            _t(2) + _t(2)
            prof.step()
    with profiler.profile() as again:
        _t(2) + _t(2)
    assert [e.name for e in again.events()] == ["EWiseAdd"]


def test_results_before_anything_was_recorded_say_so():
    prof = profiler.profile()
    with pytest.raises(RuntimeError, match="nothing recorded yet"):
        prof.key_averages()
    with pytest.raises(ValueError, match="on_trace_ready"):
        profiler.profile(on_trace_ready=print)


def test_plots_draw_a_row_per_rank_and_a_memory_line(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from needle.profiler import plot
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    with profiler.profile() as prof:
        model(_t(4, 3)).sum().backward()
    path = prof.export_chrome_trace(str(tmp_path / "t.json"))
    ax = plot.plot_timeline(path)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0 compute"]
    ax = plot.plot_memory(path)
    assert [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")
            ] == ["rank 0 memory cpu"]
