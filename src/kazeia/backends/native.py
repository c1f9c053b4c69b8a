"""Native SIMD kernels: LLVM IR emitted from Python (simd_*.py), compiled by llvmlite for this CPU, cached on
disk as object code, linked in-process by LLVM's ORC JIT and called through ctypes.

- `available()`: the host has AVX2, FMA and F16C (what the kernels use) and `KAZEIA_SIMD` is not "0". When it
  is False, the callers use the portable numba kernels instead.
- `library(name)`: the compiled functions of one emitter module (`kazeia.backends.simd_cpu`, ...), as
  ctypes functions taking integers (pointers, sizes) and returning nothing or a number. The object code is
  cached in `$KAZEIA_CACHE_DIR/native` (default ~/.cache/kazeia/native), keyed by the emitter's source, the
  irkit source, llvmlite's version and the host CPU; a hit imports neither llvmlite.ir nor the emitter and
  compiles nothing (~5 ms), a miss builds and compiles the module (~0.2-1 s) and stores it.
- `run(fn, args, parallel)`: runs a chunked kernel on this thread and `threads()-1` workers
  (ctypes releases the GIL during each call); the threads claim chunks of rows from one atomic counter, so
  a thread that the OS deschedules (the machine is shared) delays nobody. Every output row is computed
  whole by one thread, so results do not depend on the thread count or on who took which chunk.
"""

from __future__ import annotations

import collections
import ctypes
import hashlib
import importlib
import importlib.util
import os
import threading
from pathlib import Path

_libs: dict[str, dict[str, ctypes._CFuncPtr]] = {}
_jit = None
_trackers: list = []
_available: bool | None = None
NEEDED = ("avx2", "fma", "f16c")
# "large": every reference to a constant, another section or a process symbol is a 64-bit absolute address.
# With the small model a rip-relative 32-bit offset must reach them, and the JIT's memory manager may place a
# library's sections (or libc) more than 2 GB apart once a multi-GB GGUF is mapped: LLVM then aborts the
# process (RuntimeDyldELF: isInt<32>(RealOffset)). The hot loops keep their constants in registers.
CODE_MODEL = "large"


def available() -> bool:
    """True when the native AVX2 kernels can be used here (read once)."""
    global _available
    if _available is None:
        if os.environ.get("KAZEIA_SIMD", "1") == "0":
            _available = False
        else:
            try:
                import llvmlite.binding as llvm

                feats = llvm.get_host_cpu_features()
                _available = all(feats.get(f, False) for f in NEEDED)
            except Exception:  # noqa: BLE001 - no llvmlite / unknown host: the portable path
                _available = False
    return _available


def cache_dir() -> Path:
    base = os.environ.get("KAZEIA_CACHE_DIR")
    return Path(base) if base else Path.home() / ".cache" / "kazeia" / "native"


def _source_digest(module: str) -> str:
    """Hash of the emitter's and irkit's source files, llvmlite's version and the host CPU."""
    import llvmlite
    import llvmlite.binding as llvm

    h = hashlib.sha256()
    for mod in (module, "kazeia.backends.irkit"):
        spec = importlib.util.find_spec(mod)
        h.update(Path(spec.origin).read_bytes())
    h.update(llvmlite.__version__.encode())
    h.update(CODE_MODEL.encode())
    h.update(llvm.get_host_cpu_name().encode())
    h.update(llvm.get_host_cpu_features().flatten().encode())
    return h.hexdigest()[:24]


def _target_machine():
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                        opt=3, reloc="pic", codemodel=CODE_MODEL)


def _compile(module: str, tm) -> tuple[bytes, dict]:
    """Build the emitter's IR module and compile it to object code. Returns (object bytes, signatures)."""
    import llvmlite.binding as llvm

    emitter = importlib.import_module(module)
    irmod, sigs = emitter.build()
    irmod.triple = tm.triple
    irmod.data_layout = str(tm.target_data)
    mod = llvm.parse_assembly(str(irmod))
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = False  # the kernels are written with explicit vectors
    pto.slp_vectorization = False
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return tm.emit_object(mod), sigs


def _link(name: str, obj: bytes, symbols: list[str], tm) -> dict[str, int]:
    import llvmlite.binding as llvm

    global _jit
    if _jit is None:
        _jit = llvm.create_lljit_compiler(tm)
    lib = llvm.JITLibraryBuilder().add_object_img(obj).add_current_process()
    for s in symbols:
        lib.export_symbol(s)
    tracker = lib.link(_jit, name)
    _trackers.append(tracker)
    return {s: tracker[s] for s in symbols}


_CT = {"p": ctypes.c_void_p, "i": ctypes.c_int64, "f": ctypes.c_float, "d": ctypes.c_double, "v": None}


def library(module: str) -> dict[str, ctypes._CFuncPtr]:
    """The functions of emitter `module` as ctypes callables (compiled or loaded from the cache once)."""
    lib = _libs.get(module)
    if lib is not None:
        return lib
    import json

    tm = _target_machine()
    key = _source_digest(module)
    d = cache_dir()
    obj_path, sig_path = d / f"{module}-{key}.o", d / f"{module}-{key}.json"
    try:
        obj, sigs = obj_path.read_bytes(), json.loads(sig_path.read_text())
    except (OSError, ValueError):
        obj, sigs = _compile(module, tm)
        _store(d, obj_path, obj, sig_path, json.dumps(sigs))
    addrs = _link(module.replace(".", "_"), obj, list(sigs), tm)
    lib = {}
    for fname, sig in sigs.items():  # sig: "v:ppii" = returns void, takes two pointers and two int64
        ret, args = sig.split(":")
        proto = ctypes.CFUNCTYPE(_CT[ret], *[_CT[c] for c in args])
        lib[fname] = proto(addrs[fname])
    _libs[module] = lib
    return lib


def _store(d: Path, obj_path: Path, obj: bytes, sig_path: Path, sigs: str) -> None:
    """Write the cache files atomically (another process may be reading or writing them); errors ignored."""
    try:
        d.mkdir(parents=True, exist_ok=True)
        for path, data in ((obj_path, obj), (sig_path, sigs.encode())):
            tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
    except OSError:
        pass


# --- threads -------------------------------------------------------------------------------------------

_n_threads = 2 if (os.cpu_count() or 1) >= 2 else 1
_pool: _Pool | None = None


def threads() -> int:
    return _n_threads


def set_threads(n: int) -> None:
    global _n_threads
    _n_threads = max(1, min(int(n), os.cpu_count() or 1))


class _Job:
    __slots__ = ("fn", "args", "started", "cancelled", "done")

    def __init__(self, fn, args: tuple) -> None:
        self.fn, self.args = fn, args
        self.started = self.cancelled = False
        self.done = threading.Semaphore(0)


class _Pool:
    """Worker threads, each taking jobs from its queue and running their ctypes call (without the GIL)."""

    STACK = 32 << 20  # the kernels keep their quantized activations on the stack

    def __init__(self, n: int) -> None:
        self.queues = [collections.deque() for _ in range(n)]
        self.wake = [threading.Semaphore(0) for _ in range(n)]
        old = threading.stack_size(self.STACK)
        try:
            for i in range(n):
                threading.Thread(target=self._run, args=(i,), daemon=True, name=f"kazeia-native-{i}").start()
        finally:
            threading.stack_size(old)

    def _run(self, i: int) -> None:
        q, wake = self.queues[i], self.wake[i]
        while True:
            wake.acquire()
            job = q.popleft()
            if job.cancelled:  # the caller finished every chunk before this thread got here
                continue
            job.started = True  # (set and read with the GIL held: no race with the caller's check)
            try:
                job.fn(*job.args)
            finally:
                job.done.release()


def run(fn, args: tuple, parallel: bool = True) -> None:
    """Run a chunked kernel (one whose threads claim work from counters passed in `args`, zeroed by the
    caller: irkit.chunked) on this thread and, when `parallel`, on `threads()-1` workers too. A worker that
    has not started by the time this thread has claimed every chunk is not waited for (it then finds no
    work); one that has started is waited for."""
    global _pool
    t = _n_threads if parallel else 1
    if t <= 1:
        fn(*args)
        return
    if _pool is None or len(_pool.queues) < t - 1:
        _pool = _Pool(t - 1)
    jobs = [_Job(fn, args) for _ in range(t - 1)]
    for w, job in enumerate(jobs):
        _pool.queues[w].append(job)
        _pool.wake[w].release()
    fn(*args)
    for job in jobs:
        if not job.started:
            job.cancelled = True
        else:
            job.done.acquire()
