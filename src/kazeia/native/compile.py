"""Native kernels: LLVM IR emitted from Python by a kernel family, compiled by llvmlite for this CPU, cached on disk
as object code, linked in-process by LLVM's ORC JIT and called through ctypes.

A kernel family is one module (backends/cpu/kernels/*.py, backends/htp/kernels/*.py) that declares its library
and its kernels at the top, each beside the function that emits its IR:

    LIB = Library(__name__)
    ROUND = LIB.kernel("round_f16_hw", _round_kernel, par=True)      # ROUND.fn, ROUND.par: ctypes functions
    DOT = LIB.kernels("hvx_dot", _hvx_dot, KINDS, par=True)         # DOT["q4_0"].fn, ...

Its fronts call `ROUND.fn(...)` (or `pool.run_rows(ROUND, ...)`): reached by import, never by a string key, and
every prototype comes from the emitted argument list (irkit.abi). `par=True` also emits the chunked twin
(irkit.chunked) that the thread pool shares.

- `available()`: the host has AVX2, FMA and F16C (what the kernels use), KAZEIA_SIMD is not "0" and the portable
  path was not chosen (`portable_only()`, the one switch: tests compare the two with it). When it is False the
  fronts use their family's portable numba twin or numpy.
- The object code of a library is cached in `$KAZEIA_CACHE_DIR/native` (default ~/.cache/kazeia/native), keyed
  by the family's source and every kazeia module it imports (recursively), llvmlite's version and the host CPU;
  a hit imports neither llvmlite.ir nor emits anything (~5 ms), a miss emits and compiles (~0.2-1 s).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.util
import json
import os
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from kazeia import settings

NEEDED = ("avx2", "fma", "f16c")
NOT_AVX2 = ("avx512", "avxvnni", "avxifma", "avxneconvert", "amx", "avx10", "evex512")  # KAZEIA_ISA=avx2 turns off
# "large": every reference to a constant, another section or a process symbol is a 64-bit absolute address.
# With the small model a rip-relative 32-bit offset must reach them, and the JIT's memory manager may place a
# library's sections (or libc) more than 2 GB apart once a multi-GB GGUF is mapped: LLVM then aborts the
# process (RuntimeDyldELF: isInt<32>(RealOffset)). The hot loops keep their constants in registers.
CODE_MODEL = "large"

_features: dict[str, bool] | None = None
_portable = False  # portable_only(): the one switch to the portable twins
_jit = None
_trackers: list = []
_loading = threading.Lock()  # a library is compiled and linked once, whichever thread asks first


def _host_features() -> dict[str, bool]:
    """The host CPU's LLVM features, read once ({} where llvmlite is missing or cannot say)."""
    global _features
    if _features is None:
        try:
            import llvmlite.binding as llvm

            _features = {k: bool(v) for k, v in llvm.get_host_cpu_features().items()}
            if settings.get().isa == "avx2":  # KAZEIA_ISA=avx2: what an AVX2-only host compiles, on this one
                _features = {k: v and not k.startswith(NOT_AVX2) for k, v in _features.items()}
        except Exception:  # noqa: BLE001 - no llvmlite / unknown host: the portable path
            _features = {}
    return _features


_host_ok: bool | None = None


def host_ok() -> bool:
    """The host CPU has what the kernels use and llvmlite is there (read once, with the features: `available` is
    asked before every native call of a decode)."""
    global _host_ok
    if _host_ok is None:
        _host_ok = all(host_has(f) for f in NEEDED)
    return _host_ok


def host_has(feature: str) -> bool:
    """The host CPU has this LLVM feature ("avx512f", ...): also for an emitter that picks its register tiling by
    the vector width it gets (never its summation order)."""
    return _host_features().get(feature, False)


def f32_lanes() -> int:
    """float32 lanes of the widest vector the kernels emit on this host: 16 (zmm, AVX-512) or 8 (ymm). Which
    outputs run side by side, never a summation order."""
    return 16 if host_has("avx512f") else 8


def available() -> bool:
    """True when the native kernels run here (else every front takes its portable twin)."""
    return not _portable and settings.get().simd and host_ok()


@contextlib.contextmanager
def portable_only(on: bool = True) -> Iterator[None]:
    """Run the portable twins (numba, numpy) instead of the native kernels inside the block: the one switch (what
    KAZEIA_SIMD=0 does for a whole process). Kernels bound before it keep what they bound."""
    global _portable
    old, _portable = _portable, on
    try:
        yield
    finally:
        _portable = old


def cache_dir() -> Path:
    d = settings.get().cache_dir
    return Path(d) if d else Path.home() / ".cache" / "kazeia" / "native"


# --- the cache key ------------------------------------------------------------------------------------------

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
    """The source of the family and of every kazeia module it imports (irkit, the idioms it is built from),
    recursively and read without importing any of them: all of them may shape the IR."""
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
    """Hash of the sources of the family and the kazeia modules it imports, llvmlite's version and the host CPU."""
    import llvmlite
    import llvmlite.binding as llvm

    h = hashlib.sha256()
    for src in _emitter_sources(module):
        h.update(src)
    h.update(llvmlite.__version__.encode())
    h.update(CODE_MODEL.encode())
    h.update(llvm.get_host_cpu_name().encode())
    h.update(_feature_string().encode())
    return h.hexdigest()[:24]


def _feature_string() -> str:
    """The features the kernels are compiled with: the host's, less what KAZEIA_ISA turns off."""
    return ",".join(("+" if v else "-") + k for k, v in sorted(_host_features().items()))


# --- compile and link ---------------------------------------------------------------------------------------

def _target_machine():
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=_feature_string(),
                                        opt=3, reloc="pic", codemodel=CODE_MODEL)


def _compile(lib: Library, tm) -> tuple[bytes, dict]:
    """Emit the library's IR module and compile it to object code. Returns (object bytes, signatures)."""
    import llvmlite.binding as llvm

    irmod, sigs = lib.build()
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


_CT = {"p": ctypes.c_void_p, "i": ctypes.c_int64, "f": ctypes.c_float, "d": ctypes.c_double, "v": None}


def prototype(sig: str):
    """The ctypes function type of an irkit.abi signature ("v:ppii" = returns void, two pointers, two int64)."""
    ret, args = sig.split(":")
    return ctypes.CFUNCTYPE(_CT[ret], *[_CT[c] for c in args])


# --- libraries and their kernels ----------------------------------------------------------------------------

class Library:
    """The compiled kernels of one kernel-family module (one object file). Kernels are declared with `kernel` /
    `kernels` in the order they are emitted; `functions()` compiles (or loads from the cache) once."""

    def __init__(self, module: str, ir_name: str | None = None) -> None:
        """`module`: the family's module name (its source keys the cache); `ir_name`: the LLVM module's name."""
        self.module = module
        self.ir_name = ir_name or "kazeia_" + module.rsplit(".", 1)[-1]
        self._emitters: list[tuple[str, Callable, tuple, bool]] = []  # (name, emit, emit's extra args, par)
        self._fns: dict[str, ctypes._CFuncPtr] | None = None

    def kernel(self, name: str, emit: Callable, *args, par: bool = False) -> NativeFn:
        """Declare kernel `name`, emitted by `emit(ir_module, *args)` (which must define a function of that
        name); `par`: also `<name>_par`, its chunked twin for the thread pool."""
        self._emitters.append((name, emit, args, par))
        return NativeFn(self, name, par)

    def kernels(self, stem: str, emit: Callable, kinds: tuple[str, ...], par: bool = False) -> dict[str, NativeFn]:
        """Kernels `<stem>_<kind>`, each emitted by `emit(ir_module, kind)`, as {kind: NativeFn}."""
        return {kind: self.kernel(f"{stem}_{kind}", emit, kind, par=par) for kind in kinds}

    def build(self):
        """(the LLVM IR module of every declared kernel, {exported name: irkit.abi signature})."""
        from llvmlite import ir

        from kazeia.native.irkit import abi, chunked

        module = ir.Module(name=self.ir_name)
        sigs: dict[str, str] = {}
        for name, emit, args, par in self._emitters:
            emit(module, *args)
            fn = module.globals.get(name)
            if not isinstance(fn, ir.Function) or fn.is_declaration:
                raise RuntimeError(f"{self.module}: the emitter of {name} defined no function of that name")
            sigs[name] = abi(fn)
            if par:
                sigs[name + "_par"] = abi(chunked(module, fn, name + "_par"))
        return module, sigs

    def functions(self) -> dict[str, ctypes._CFuncPtr]:
        """The library's functions as ctypes callables (compiled or loaded from the cache once per process)."""
        fns = self._fns
        if fns is not None:
            return fns
        with _loading:
            if self._fns is None:
                self._fns = self._load()
        return self._fns

    def _load(self) -> dict[str, ctypes._CFuncPtr]:
        tm = _target_machine()
        key = _source_digest(self.module)
        d = cache_dir()
        obj_path, sig_path = d / f"{self.module}-{key}.o", d / f"{self.module}-{key}.json"
        try:
            obj, sigs = obj_path.read_bytes(), json.loads(sig_path.read_text())
        except (OSError, ValueError):
            obj, sigs = _compile(self, tm)
            _store(d, obj_path, obj, sig_path, json.dumps(sigs))
        addrs = _link(self.module.replace(".", "_"), obj, list(sigs), tm)
        return {name: prototype(sig)(addrs[name]) for name, sig in sigs.items()}


class NativeFn:
    """One declared kernel of a library: `fn` the ctypes function, `par` its chunked twin (if declared)."""

    __slots__ = ("lib", "name", "has_par")

    def __init__(self, lib: Library, name: str, par: bool) -> None:
        self.lib, self.name, self.has_par = lib, name, par

    @property
    def fn(self) -> ctypes._CFuncPtr:
        return self.lib.functions()[self.name]

    @property
    def par(self) -> ctypes._CFuncPtr:
        if not self.has_par:
            raise AttributeError(f"{self.name} was declared without a chunked twin (par=True)")
        return self.lib.functions()[self.name + "_par"]

    def __repr__(self) -> str:
        return f"NativeFn({self.lib.module}.{self.name})"
