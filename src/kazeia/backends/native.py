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

import ctypes
import hashlib
import importlib
import importlib.util
import os
import re
import threading
from pathlib import Path

from kazeia.backends import simd_pool  # the mailbox layout only (its emitter imports llvmlite when it builds)

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


_FROM_IMPORT = re.compile(rb"^[ \t]*from[ \t]+(kazeia(?:\.\w+)*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)
_PLAIN_IMPORT = re.compile(rb"^[ \t]*import[ \t]+(kazeia(?:\.\w+)+)", re.M)


def _imported(src: bytes) -> list[str]:
    """The kazeia modules a source imports: `import kazeia.a.b`, `from kazeia.a import x` (kazeia.a, and
    kazeia.a.x when kazeia.a is a package holding a module x), at any indentation."""
    out = [m.decode() for m in _PLAIN_IMPORT.findall(src)]
    for mod, names in _FROM_IMPORT.findall(src):
        mod = mod.decode()
        out.append(mod)
        spec = importlib.util.find_spec(mod)  # (imports mod's parents, never mod itself)
        if spec is not None and spec.submodule_search_locations is not None:
            out += [f"{mod}.{n}" for n in re.findall(r"\w+", names.decode())
                    if importlib.util.find_spec(f"{mod}.{n}") is not None]
    return out


def _emitter_sources(module: str) -> list[bytes]:
    """The source of the emitter and of every kazeia module it imports (irkit, the emitter parts it is built
    from), recursively and read without importing any of them: all of them shape the IR."""
    seen, todo, out = set(), [module], []
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        spec = importlib.util.find_spec(mod)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        src = Path(spec.origin).read_bytes()
        out.append(mod.encode() + b"\0" + src)
        todo += _imported(src)
    return sorted(out)


def _source_digest(module: str) -> str:
    """Hash of the sources of the emitter and the kazeia modules it imports, llvmlite's version and the host
    CPU."""
    import llvmlite
    import llvmlite.binding as llvm

    h = hashlib.sha256()
    for src in _emitter_sources(module):
        h.update(src)
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


class _Pool:
    """Worker threads that wait for jobs in native code (simd_pool.py: a mailbox per worker, spun on for SPIN
    pauses after a job posted with `linger`, then a semaphore), each running its ctypes kernel without the GIL."""

    STACK = 32 << 20  # the kernels keep their quantized activations on the stack
    SPIN = 40_000     # idle pauses (with a sched_yield every 32) after a lingering job: ~2 ms here
    WOKEN_SPIN = 1_000  # pauses a worker woken by its semaphore looks for the job it was woken for

    def __init__(self, n: int) -> None:
        import numpy as np

        self.mb = mb = simd_pool
        self.lib = library("kazeia.backends.simd_pool")
        self.slots = np.zeros((n, mb.SLOT_WORDS), dtype=np.int64)  # one mailbox per worker
        self.ptrs = [self.slots.ctypes.data + 8 * mb.SLOT_WORDS * i for i in range(n)]
        self.wake = [threading.Semaphore(0) for _ in range(n)]
        self.job = 0
        self.busy = threading.Lock()  # one poster at a time (a second concurrent caller runs alone)
        old = threading.stack_size(self.STACK)
        try:
            for i in range(n):
                threading.Thread(target=self._serve, args=(i,), daemon=True, name=f"kazeia-native-{i}").start()
        finally:
            threading.stack_size(old)

    def _serve(self, i: int) -> None:
        serve, exchange, pending = self.lib["pool_serve"], self.lib["pool_exchange"], self.lib["pool_pending"]
        p, wake, sleeping = self.ptrs[i], self.wake[i], self.mb.SLEEPING
        while True:
            serve(p, self.WOKEN_SPIN)  # returns once the wait after its last job passed that job's LINGER
            exchange(p, sleeping, 1)
            if pending(p) and exchange(p, sleeping, 0) == 1:
                continue  # a job came in between: nobody released the semaphore for it
            wake.acquire()

    def run(self, fn, args: tuple, n: int, linger: bool) -> None:
        """fn(*args) on this thread and on n workers (n <= len(workers)); returns when all have finished."""
        if len(args) > self.mb.MAX_ARGS or not self.busy.acquire(blocking=False):
            fn(*args)
            return
        try:
            self.job += 1
            job, mb, exchange = self.job, self.mb, self.lib["pool_exchange"]
            addr = address(fn)
            for w in range(n):
                post(self.slots[w], job, addr, args, self.SPIN if linger else 0)
                if exchange(self.ptrs[w], mb.SLEEPING, 0) == 1:
                    self.wake[w].release()
            fn(*args)
            finish = self.lib["pool_finish"]
            for w in range(n):
                finish(self.ptrs[w], job)  # cancels a job no worker took; else waits for it
        finally:
            self.busy.release()


def post(slot, job: int, addr: int, args: tuple, linger: int) -> None:
    """Write job `job` (the kernel at `addr` with integer `args`, then `linger` idle pauses) into a worker's
    mailbox (simd_pool.py's layout): FN, LINGER and ARGS first, then STATE, then SEQ (x86 keeps stores in
    order: a worker that sees the new SEQ sees the rest)."""
    mb = simd_pool
    slot[mb.ARGS:mb.ARGS + len(args)] = args
    slot[mb.FN] = addr
    slot[mb.LINGER] = linger
    slot[mb.STATE] = job
    slot[mb.SEQ] = job


_addresses: dict[int, tuple[object, int]] = {}


def address(fn) -> int:
    """The machine address of a ctypes function (kept per function object)."""
    hit = _addresses.get(id(fn))
    if hit is None or hit[0] is not fn:
        hit = _addresses[id(fn)] = (fn, ctypes.cast(fn, ctypes.c_void_p).value)
    return hit[1]


def _forget_pool() -> None:
    """In a forked child the workers do not exist: make a new pool on first use."""
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_pool)


def run(fn, args: tuple, parallel: bool = True, linger: bool = False) -> None:
    """Run a chunked kernel (one whose threads claim work from counters passed in `args`, zeroed by the
    caller: irkit.chunked) on this thread and, when `parallel`, on `threads()-1` workers too. A worker that
    has not taken the job by the time this thread has claimed every chunk is not waited for (the job is
    cancelled); one that has taken it is waited for. `args` are integers and pointers only. `linger`: the
    workers wait for the next job spinning for ~2 ms (a decode step's GEMVs), else they sleep at once (after
    a prefill kernel a spinning worker would take a core from BLAS's threads)."""
    global _pool
    t = _n_threads if parallel else 1
    if t <= 1:
        fn(*args)
        return
    if _pool is None or len(_pool.ptrs) < t - 1:
        _pool = _Pool(t - 1)
    _pool.run(fn, args, t - 1, linger)
