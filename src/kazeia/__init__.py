"""kazeia: GGUF models op by op, a software model of ggml's Hexagon (HTP) backend, and op-level forensics."""

__version__ = "0.1.0"
