"""Turning what the debug tools record (op details, settings, reports) into strict JSON."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np


def json_safe(v: Any) -> Any:
    """Containers as dicts (string keys) and lists, numpy scalars as Python ones, non-finite floats as the
    strings "inf" / "-inf" / "nan", a regex as its pattern, anything else as its repr."""
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [json_safe(x) for x in v]
    if isinstance(v, np.generic):
        return json_safe(v.item())
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, re.Pattern):
        return v.pattern
    return repr(v)
