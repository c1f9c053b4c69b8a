"""The cumulative judge: an op whose inputs drifted is not blamed for its own error, unless that error is far more
than the drift explains (a stale or wrong read: #25876's ADD measured 6e7 times its inputs' NMSE)."""

from __future__ import annotations

import math

from kazeia.debug.compare.cumulative import AMPLIFICATION, _beyond_drift


def test_only_an_error_far_beyond_the_inputs_drift_is_the_ops_own():
    assert _beyond_drift(30.3, 5.18e-7)  # field-reports.md section 5
    assert not _beyond_drift(1.14e-7, 1.15e-7)  # RMS_NORM carrying its input's drift
    assert not _beyond_drift(1.9, 1.92)  # a matmul after a wrong input
    assert not _beyond_drift(AMPLIFICATION * 1e-8, 1e-8)
    assert _beyond_drift(AMPLIFICATION * 1e-8 * 1.01, 1e-8)
    for nmse, inputs in ((1.0, None), (None, 1e-7), (1.0, 0.0), (1.0, math.inf), (math.inf, math.nan)):
        assert not _beyond_drift(nmse, inputs)
