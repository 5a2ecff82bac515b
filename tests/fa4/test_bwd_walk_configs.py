"""bench/check_bwd.py's with_knob, which the GPU tests of the walk orders and the q_starts shifts
(tests/fa4/test_bwd_walk_down_gpu.py, test_bwd_q_starts_gpu.py) resolve their configs through: it
must refuse a case whose config the knob does not change or that violations() refuses, rather than
let the test run the default under the knob's name.

Every case of those suites is run on the CPU, through this helper, by
tests/fa4/test_gpu_configs_dry.py (test_bwd_gpu's 'last_cta' cases too, through default_for); this
file used to re-enumerate their products and check them here, which drifted from the suites whenever
a parametrize list changed.
"""

import pytest

from tests.fa4 import cpu_kernels


@pytest.mark.parametrize("knob,value,causal", [("q_starts", 4, True), ("walk_down", True, False)])
def test_with_knob_refuses_a_case_that_would_not_run_the_knob(knob, value, causal):
    """q_starts under a causal bound at Sq = Sk (the bound spreads the runs already) and walk_down
    without a bound are infeasible: the helper says so rather than test the default."""
    with pytest.raises(ValueError, match="infeasible"):
        cpu_kernels.check_bwd().with_knob((1, 1000, 1000, 4, 4), 128, causal, False, knob, value)


def test_with_knob_refuses_the_default_value():
    """A knob set to the value the problem's default already has would test the default."""
    check_bwd = cpu_kernels.check_bwd()
    shape = (1, 1000, 2500, 8, 2)
    base = check_bwd.default_for(shape, 128, True, False)
    with pytest.raises(ValueError, match="would not run the knob"):
        check_bwd.with_knob(shape, 128, True, False, "walk_down", base.walk_down)
