"""The planner's memory rules for needle's strategies, worked by hand: in-flight microbatches
of a pipeline stage, FSDP's buffers over a backward, the spans read off a real graph."""
import numpy as np
import pytest

import needle as ndl
from benchmarks.needle_strategies import UnitSpan, fsdp_buffer_bytes, fsdp_unit_spans
from needle import nn
from needle.plan.gpu_memory import in_flight_microbatches


@pytest.mark.parametrize("schedule,p,m,stage,expected", [
    ("1f1b", 4, 8, 0, 4), ("1f1b", 4, 8, 3, 1), ("1f1b", 4, 2, 0, 2), ("1f1b", 2, 4, 1, 1),
    ("gpipe", 4, 8, 3, 8), ("gpipe", 2, 3, 0, 3)])
def test_in_flight_microbatches(schedule, p, m, stage, expected):
    """1F1B: stage r runs p - r forwards before its first backward (capped by m); GPipe: m."""
    assert in_flight_microbatches(schedule, p, m, stage) == expected


def test_in_flight_microbatches_names_a_bad_stage():
    with pytest.raises(ValueError, match="stage"):
        in_flight_microbatches("1f1b", 2, 4, 2)


def test_fsdp_buffers_two_units_by_hand():
    """N = 2. Unit A (10 elements, 2 parameters) runs first in forward, B (6, 1) second.
    Backward: B gathered at 0, its gradient at 1; A gathered at 2, gradients at 3 and 9.
    cols: A 5, B 3. Live (elements): B's flat 6 at 0, + bucket 2 (3 + 1) = 8 at 1 -> 14,
    B freed and its row (4) received at 1.5 -> 12, A gathered (10) at 2 -> 22, A's bucket
    2 (5 + 2) = 14 at 3 -> 36: the peak, 36 x 4 bytes; A freed at 9.5."""
    spans = [UnitSpan(10, 2, gather=2, first_grad=3, last_grad=9),
             UnitSpan(6, 1, gather=0, first_grad=1, last_grad=1)]
    assert fsdp_buffer_bytes(spans, 2) == 36 * 4
    # A's gradients all come before B is gathered, but A's bucket launches (and its row is
    # received) only after B's, the reducer's first bucket: A flat 10 at 0, + bucket 14 at 1
    # -> 24, A freed at 2.5 -> 14, B flat 6 at 3 -> 20, B bucket 8 at 4 -> 28, at 4.5 B freed
    # (-6) and both rows (4 + 7) -> 33, the peak.
    early = [UnitSpan(10, 2, gather=0, first_grad=1, last_grad=2),
             UnitSpan(6, 1, gather=3, first_grad=4, last_grad=4)]
    assert fsdp_buffer_bytes(early, 2) == 33 * 4


def test_fsdp_unit_spans_follow_backward_order():
    """Two Linear units in a chain: backward reaches the second unit first (its output is
    nearer the loss), and each unit's gradients come after its gather."""
    np.random.seed(0)
    a, b = nn.Linear(3, 4), nn.Linear(4, 2)
    x = ndl.Tensor(np.ones((5, 3), np.float32), requires_grad=False)
    ha = a(x)
    hb = b(ha)
    loss = (hb * hb).sum()
    sa, sb = fsdp_unit_spans(loss, [(ha, a.parameters()), (hb, b.parameters())])
    assert (sa.numel, sa.nparams, sb.numel, sb.nparams) == (16, 2, 10, 2)
    assert sb.gather < sb.first_grad <= sb.last_grad < sa.gather < sa.first_grad <= sa.last_grad
    with pytest.raises(ValueError, match="not in the loss's graph"):
        fsdp_unit_spans(loss, [(ha, nn.Linear(2, 2).parameters())])
