"""Op kernels in numpy, written once for any float dtype: `ref` runs them in float64, `cpu` in float32.

Each kernel reads its sources through the backend (`load`, `weight_matmul`) and writes the result through
it (`store`), so the same code serves the oracle (which keeps float64 shadows and exact float64 weights) and
the fast path (which multiplies the quantized bytes directly). Arrays are shaped (ne3, ne2, ne1, ne0) like
the tensors' numpy views. One file per family: `base.py` (the registry and the backend interface), `dense.py`,
`attention.py`, `hybrid.py`; importing this package registers every kernel in `KERNELS`.
"""

from kazeia.backends.numpy_ops import attention, dense, hybrid  # noqa: F401 - they register their kernels
from kazeia.backends.numpy_ops.base import KERNELS, Kernel, NumpyOps, broadcast_to, kernel
from kazeia.backends.numpy_ops.dense import (
    GLU_ACTIVATIONS,
    UNARY_FUNCS,
    freq_factors,
    gelu_tanh,
    glu_halves,
    mrope_angles,
    mrope_stream,
    rope_angles,
    scatter_rows,
)
from kazeia.backends.numpy_ops.hybrid import delta_rule

__all__ = ["GLU_ACTIVATIONS", "KERNELS", "UNARY_FUNCS", "Kernel", "NumpyOps", "broadcast_to", "delta_rule",
           "freq_factors", "gelu_tanh", "glu_halves", "kernel", "mrope_angles", "mrope_stream", "rope_angles",
           "scatter_rows"]
