"""The Chrome trace format checker refuses what Perfetto would misdraw, naming the event."""
import pytest

from needle.profiler import TraceFormatError, check_trace


def _x(name, ts, dur, tid=0):
    return {"name": name, "ph": "X", "pid": 0, "tid": tid, "ts": ts, "dur": dur}


GOOD = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "rank 0"}},
        _x("outer", 0.0, 10.0), _x("inner", 1.0, 2.0), _x("next", 3.5, 1.0),
        {"name": "memory cpu", "ph": "C", "pid": 0, "tid": 0, "ts": 2.0, "args": {"b": 5}},
        {"name": "peak", "ph": "i", "s": "p", "pid": 0, "tid": 0, "ts": 9.0},
        _x("other thread", 0.5, 100.0, tid=1)]


def test_a_good_trace_passes():
    assert check_trace({"traceEvents": GOOD})["traceEvents"] == GOOD


@pytest.mark.parametrize("bad,why", [
    ({"ph": "X", "pid": 0, "tid": 0, "ts": 0, "dur": 1}, "needs 'name'"),
    ({"name": "a", "ph": "B", "pid": 0, "tid": 0, "ts": 0}, "phase 'B'"),
    ({"name": "a", "ph": "X", "pid": "0", "tid": 0, "ts": 0, "dur": 1}, "'pid' of type int"),
    ({"name": "a", "ph": "X", "pid": 0, "tid": 0, "ts": 0}, "'dur' >= 0"),
    ({"name": "a", "ph": "X", "pid": 0, "tid": 0, "ts": 0, "dur": -1}, "'dur' >= 0"),
    ({"name": "a", "ph": "C", "pid": 0, "tid": 0, "ts": 0, "args": {"b": "x"}}, "numbers"),
    ({"name": "a", "ph": "i", "pid": 0, "tid": 0, "ts": 0, "s": "q"}, "scope"),
    ({"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {}}, "args.name"),
    ({"name": "a", "ph": "X", "pid": 0, "tid": 0, "ts": None, "dur": 1}, "numeric 'ts'"),
])
def test_keys_and_types_per_phase(bad, why):
    with pytest.raises(TraceFormatError, match=rf"traceEvents\[7\].*{why}"):
        check_trace({"traceEvents": GOOD + [bad]})


def test_time_goes_backwards_on_a_thread():
    with pytest.raises(TraceFormatError, match=r"traceEvents\[2\] \(b\): ts 1.0 is before"):
        check_trace({"traceEvents": [_x("a", 5.0, 1.0), _x("c", 6.0, 1.0), _x("b", 1.0, 1.0)]})


def test_events_that_overlap_without_nesting():
    with pytest.raises(TraceFormatError, match=r"\(inner\) ends at 12.0 after the event it "
                                               r"starts in, traceEvents\[0\] \(outer\)"):
        check_trace({"traceEvents": [_x("outer", 0.0, 10.0), _x("inner", 5.0, 7.0)]})


def test_not_a_trace_object():
    with pytest.raises(TraceFormatError, match="'traceEvents' list"):
        check_trace({"events": []})
