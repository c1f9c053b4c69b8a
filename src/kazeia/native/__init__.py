"""The machinery every native kernel family needs, in the spirit of Triton's language / compiler / runtime split:

- the language: `irkit` (LLVM IR by llvmlite's builder; a kernel's ABI is derived from its argument list) and
  `idioms` (block readers, transpose8, tree8);
- the compiler: `compile` (the object-code cache keyed by the family's sources, the ORC link, `Library` and the
  kernels it declares, `available()` and the one switch to the portable path, `portable_only()`);
- the runtime: `pool` (the worker threads and their mailbox protocol, `pool_ir`), `buffers` (addresses, per-thread
  scratch), `threads` (the one -t), `portable` (numba, set up on first use, for the portable twins).

No kernel lives here: each family (IR, typed front, portable twin) is one file of its backend's `kernels/`.
"""

from kazeia.native.buffers import GrowingScratch, ThreadScratch, kept_ptr, ptr
from kazeia.native.compile import Library, NativeFn, available, portable_only
from kazeia.native.pool import address, run, run_rows
from kazeia.native.threads import set_threads

__all__ = ["GrowingScratch", "Library", "NativeFn", "ThreadScratch", "address", "available", "kept_ptr",
           "portable_only", "ptr", "run", "run_rows", "set_threads"]
