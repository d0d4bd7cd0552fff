"""Loading libsymred.so and declaring the C functions the bindings use.

Everything that touches ctypes lives here: the library search, the prototypes (argtypes and
restype for every function used, so that no pointer is ever truncated to an int), the two
structs of the kernel API, and the translation of a failing status into a Python exception
that carries sr_ctx_error()'s message.
"""

import ctypes
import ctypes.util
import os
import sys
import sysconfig
from pathlib import Path

__all__ = [
    "SymredError",
    "SymredValueError",
    "SymredRuntimeError",
    "lib",
    "lib_path",
    "check",
]

# ---- Exceptions --------------------------------------------------------------------------------


class SymredError(Exception):
    """An error reported by the C library.

    ``status`` is the C status code (negative int) and ``status_name`` its name without the
    ``SR_`` prefix (``"EPARSE"``); the message is sr_ctx_error()'s text. Errors about bad
    formulas, dimensions or arguments are also ValueErrors (:class:`SymredValueError`); the
    others (no device, out of memory, memory budget, internal errors) are RuntimeErrors
    (:class:`SymredRuntimeError`).
    """

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status
        self.status_name = STATUS_NAMES.get(status, "UNKNOWN") if status is not None else None


class SymredValueError(SymredError, ValueError):
    """A C error caused by the input: SR_EPARSE, SR_EDIM or SR_EINVAL."""


class SymredRuntimeError(SymredError, RuntimeError):
    """Any other C error: SR_ENODEV (no GPU / no CUDA backend), SR_ENOMEM, SR_EBUDGET, ..."""


# Mirrors SR_STATUS_MAP in include/symred.h (the values are ABI).
STATUS_NAMES = {
    0: "OK",
    -1: "EINVAL",
    -2: "ENOMEM",
    -3: "EPARSE",
    -4: "EDIM",
    -5: "EOVERFLOW",
    -6: "EBUDGET",
    -7: "ECOMPILE",
    -8: "ENODEV",
    -9: "ENOTSUP",
    -10: "EIO",
    -11: "EINTERNAL",
    -12: "ENOCONV",
    -13: "ETIMEDOUT",
}
SR_OK = 0
SR_EINVAL = -1
SR_EPARSE = -3
SR_EDIM = -4
SR_EBUDGET = -6
SR_ENODEV = -8
SR_ENOTSUP = -9
SR_ENOCONV = -12
SR_ETIMEDOUT = -13
_VALUE_ERRORS = {SR_EINVAL, SR_EPARSE, SR_EDIM}

# Mirrors sr_dtype, sr_device and sr_cat.
SR_F32, SR_F64, SR_F16, SR_BF16 = 0, 1, 2, 3
SR_DEVICE_AUTO, SR_DEVICE_CPU, SR_DEVICE_CUDA, SR_DEVICE_REFERENCE = 0, 1, 2, 3
SR_CAT_I, SR_CAT_J, SR_CAT_PARAM = 0, 1, 2


# ---- Structs -----------------------------------------------------------------------------------


class KernelDesc(ctypes.Structure):
    """struct sr_kernel_desc."""

    _fields_ = [
        ("reduction", ctypes.c_int),
        ("axis", ctypes.c_int),
        ("k", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("device", ctypes.c_int),
        ("weight", ctypes.c_void_p),
        ("acc", ctypes.c_int),
    ]


# enum sr_acc
ACC_DEFAULT, ACC_BLOCK, ACC_KAHAN, ACC_F64 = 0, 1, 2, 3


class RunDesc(ctypes.Structure):
    """struct sr_run_desc."""

    _fields_ = [
        ("nx", ctypes.c_int64),
        ("ny", ctypes.c_int64),
        ("nargs", ctypes.c_int),
        ("args", ctypes.POINTER(ctypes.c_void_p)),
        ("out", ctypes.c_void_p),
        ("out_idx", ctypes.c_void_p),
    ]


class Ranges(ctypes.Structure):
    """struct sr_ranges: pykeops' 6-tuple of block-sparse ranges, int64 arrays."""

    _P = ctypes.POINTER(ctypes.c_int64)
    _fields_ = [
        ("nranges_i", ctypes.c_int64),
        ("ranges_i", _P),
        ("slices_i", _P),
        ("nredranges_j", ctypes.c_int64),
        ("redranges_j", _P),
        ("nranges_j", ctypes.c_int64),
        ("ranges_j", _P),
        ("slices_j", _P),
        ("nredranges_i", ctypes.c_int64),
        ("redranges_i", _P),
    ]


class ParseVar(ctypes.Structure):
    """struct sr_parse_var: one variable of a parsed formula and its aliases."""

    _fields_ = [
        ("index", ctypes.c_int),
        ("dim", ctypes.c_int),
        ("cat", ctypes.c_int),
        ("alias", ctypes.c_int),
    ]


class ParseDesc(ctypes.Structure):
    """struct sr_parse_desc: sr_parse_ex's option and variable table."""

    _fields_ = [
        ("gradin_cat", ctypes.c_int),
        ("vars", ctypes.POINTER(ParseVar)),
        ("vars_cap", ctypes.c_int),
        ("nvars", ctypes.c_int),
    ]


class PlanInfo(ctypes.Structure):
    """struct sr_plan_info (version 3; size is set before each call)."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("strategy", ctypes.c_int),
        ("inner", ctypes.c_int),
        ("name", ctypes.c_char_p),
        ("backend", ctypes.c_char_p),
        ("device", ctypes.c_int),
        ("tile_rows", ctypes.c_int),
        ("tile_cols", ctypes.c_int),
        ("threads", ctypes.c_int),
        ("workspace_bytes", ctypes.c_int64),
        ("workspace_per_thread", ctypes.c_int64),
        ("tier", ctypes.c_int),
        ("compiling", ctypes.c_int),
        ("fallback", ctypes.c_char_p),
        ("device_why", ctypes.c_char_p),
        ("module", ctypes.c_char_p),
        ("module_cache", ctypes.c_char_p),
        ("module_path", ctypes.c_char_p),
        ("compile_ms", ctypes.c_double),
        ("compile_error", ctypes.c_char_p),
        ("plans", ctypes.c_int),
        ("est_ns", ctypes.c_double),
        ("simplified", ctypes.c_int),
        ("formula", ctypes.c_void_p),
        ("rewrite", ctypes.c_char_p),
        ("hoisted", ctypes.c_int),
        ("flops_per_pair", ctypes.c_double),
        ("flops_per_pair_given", ctypes.c_double),
        ("bytes_per_pair", ctypes.c_double),
        ("acc", ctypes.c_int),
        ("io_native", ctypes.c_int),
        ("eval_block", ctypes.c_int),
        ("loop_mode", ctypes.c_int),
        ("rows_per_pass", ctypes.c_int),
        ("tile_isa", ctypes.c_char_p),
        ("product", ctypes.c_char_p),
        ("b_hoisted", ctypes.c_int),
        ("rerank", ctypes.c_int),
        ("dot_dim", ctypes.c_int),
        ("dot_mr", ctypes.c_int),
        ("dot_nr", ctypes.c_int),
        ("dot_kc", ctypes.c_int),
        ("scale_in_exp", ctypes.c_int),
        ("b_padded", ctypes.c_int),
        ("split_why", ctypes.c_char_p),
        ("split_parts", ctypes.c_int),
        ("split_strategy", ctypes.c_int * 2),
        ("split_est_ns", ctypes.c_double * 2),
        ("split_whole", ctypes.c_int),
        ("split_whole_est_ns", ctypes.c_double),
    ]


class SolveDesc(ctypes.Structure):
    """struct sr_solve_desc."""

    _fields_ = [
        ("b_index", ctypes.c_int),
        ("alpha", ctypes.c_double),
        ("eps", ctypes.c_double),
        ("max_iter", ctypes.c_int),
        ("check_symmetry", ctypes.c_int),
    ]


# ---- Finding the library -----------------------------------------------------------------------

_LIBNAME = "libsymred.so"


def _checkout_root():
    # This file is <root>/bindings/python/symred/_lib.py in a checkout.
    return Path(__file__).resolve().parents[3]


def _build_tree_candidates():
    """libsymred.so in the build trees of the checkout: build/, then build-ci/, then the
    other build*/ directories in name order."""
    root = _checkout_root()
    out = [root / "build" / _LIBNAME, root / "build-ci" / _LIBNAME]
    try:
        others = sorted(p for p in root.glob("build*") if p.name not in ("build", "build-ci"))
    except OSError:
        others = []
    out += [p / _LIBNAME for p in others if p.is_dir()]
    return [str(p) for p in out]


def _installed_candidates():
    """The library next to the package (a wheel may bundle it), what the dynamic linker
    finds (ctypes.util.find_library), then the usual library directories."""
    out = [str(Path(__file__).resolve().parent / _LIBNAME)]
    found = ctypes.util.find_library("symred")
    if found:
        out.append(found)
    dirs = []
    for var in ("LIBDIR",):
        d = sysconfig.get_config_var(var)
        if d:
            dirs.append(d)
    multiarch = sysconfig.get_config_var("MULTIARCH")
    for prefix in (sys.prefix, "/usr/local", "/usr"):
        if multiarch:
            dirs.append(os.path.join(prefix, "lib", multiarch))
        dirs += [os.path.join(prefix, "lib64"), os.path.join(prefix, "lib")]
    for d in dirs:
        for name in (_LIBNAME, _LIBNAME + ".0"):
            p = os.path.join(d, name)
            if p not in out:
                out.append(p)
    return out


def _load():
    tried = []
    env = os.environ.get("SYMRED_LIB")
    if env:
        path = os.path.join(env, _LIBNAME) if os.path.isdir(env) else env
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            # An explicit choice that fails is an error, not a reason to load something else.
            raise ImportError(
                f"symred: SYMRED_LIB={env!r} could not be loaded ({e}). Point SYMRED_LIB at "
                f"libsymred.so (or its directory), or unset it to search the installed location "
                f"and the build trees."
            ) from None
    for path in _installed_candidates() + _build_tree_candidates():
        is_bare_name = os.sep not in path
        if not is_bare_name and not os.path.exists(path):
            tried.append(f"{path} (not found)")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path} ({e})")
    raise ImportError(
        "symred: cannot find libsymred.so. Build it with CMake (cmake -S . -B build && "
        "cmake --build build), install it, or set SYMRED_LIB to its path. Tried:\n  "
        + "\n  ".join(tried)
    )


def _declare(lib):
    """argtypes and restype of every C function the bindings call."""
    c_int, c_char_p, c_void_p = ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p
    P = ctypes.POINTER
    protos = {
        "sr_version": (c_char_p, []),
        "sr_status_str": (c_char_p, [c_int]),
        "sr_ctx_new": (c_int, [P(c_void_p)]),
        "sr_ctx_free": (None, [c_void_p]),
        "sr_ctx_error": (c_char_p, [c_void_p]),
        "sr_parse": (c_int, [c_void_p, c_char_p, P(c_char_p), c_int, P(c_void_p)]),
        "sr_parse_ex": (c_int, [c_void_p, c_char_p, P(c_char_p), c_int, P(ParseDesc),
                                P(c_void_p)]),
        "sr_expr_print": (ctypes.c_size_t, [c_void_p, c_char_p, ctypes.c_size_t]),
        "sr_expr_dim": (c_int, [c_void_p]),
        "sr_expr_category": (c_int, [c_void_p]),
        "sr_reduction_name": (c_char_p, [c_int]),
        "sr_reduction_from_name": (c_int, [c_char_p, P(c_int)]),
        "sr_reduction_combine": (c_int, [c_int, P(c_int), P(c_int)]),
        "sr_kernel_new": (c_int, [c_void_p, c_void_p, P(KernelDesc), P(c_void_p)]),
        "sr_kernel_free": (None, [c_void_p]),
        "sr_kernel_nargs": (c_int, [c_void_p]),
        "sr_kernel_out_dim": (c_int, [c_void_p]),
        "sr_kernel_var": (c_int, [c_void_p, c_int, P(c_int), P(c_int)]),
        "sr_kernel_run_ex": (c_int, [c_void_p, P(RunDesc)]),
        "sr_kernel_run_device": (c_int, [c_void_p, P(RunDesc), ctypes.c_uint64, c_int]),
        "sr_kernel_run_ranges": (c_int, [c_void_p, P(RunDesc), P(Ranges)]),
        "sr_kernel_grad": (c_int, [c_void_p, c_int, P(c_void_p)]),
        "sr_kernel_jvp": (c_int, [c_void_p, ctypes.c_uint64, P(c_void_p)]),
        "sr_kernel_vjp": (c_int, [c_void_p, P(RunDesc), c_void_p, c_void_p, c_void_p,
                                  P(c_void_p)]),
        "sr_kernel_run_lse": (c_int, [c_void_p, P(RunDesc), c_void_p]),
        "sr_kernel_vjp_ranges": (c_int, [c_void_p, P(RunDesc), P(Ranges), c_void_p, c_void_p,
                                         c_void_p, P(c_void_p)]),
        "sr_kernel_run_lse_ranges": (c_int, [c_void_p, P(RunDesc), P(Ranges), c_void_p]),
        "sr_kernel_explain": (c_char_p, [c_void_p]),
        "sr_kernel_plan": (c_int, [c_void_p, P(PlanInfo)]),
        "sr_strategy_name": (c_char_p, [c_int]),
        "sr_kernel_eval_block": (
            c_int,
            [c_void_p, ctypes.c_int64, ctypes.c_int64, P(c_void_p), ctypes.c_int64,
             ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, c_void_p],
        ),
        "sr_kernel_solve": (
            c_int,
            [c_void_p, P(SolveDesc), ctypes.c_int64, P(c_void_p), c_void_p, c_void_p],
        ),
    }
    missing = []
    for name, (restype, argtypes) in protos.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.restype = restype
        fn.argtypes = argtypes
    if missing:
        raise ImportError(
            f"symred: the library at {lib_path} lacks {', '.join(missing)}; it is older than "
            f"these bindings, rebuild it"
        )


lib, lib_path = _load()
_declare(lib)


def version():
    """The version string of the loaded C library."""
    return lib.sr_version().decode()


# sr_device and sr_acc values, as kernel_plan names them.
_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "reference"}
_ACC_NAMES = {0: None, 1: "block", 2: "kahan", 3: "f64"}


# sr_plan_info.eval_block's values.
_EVAL_BLOCK = {0: "reference", 1: "generated", 2: "tile interpreter"}


def kernel_plan(kernel):
    """The plan of a compiled kernel (an sr_kernel pointer), from sr_kernel_plan: a dict with
    ``strategy`` (its name: "direct", "gemm-epilogue", "fused two-product", "symmetric fused
    two-product", "sum split", "reduction rewrite" or "reference"), ``inner`` (the strategy of
    the pair work: a composed kernel's inner kernel's, else ``strategy``), ``backend``
    ("cpu-jit", "reference", "cuda"), ``device`` ("cpu", "cuda" or "reference"),
    ``tile_rows``, ``tile_cols`` (0 where not tiled), ``threads``, ``workspace_bytes`` (all
    threads), ``workspace_per_thread``, ``tier`` (0: an interpreter serves the calls, 1:
    compiled code), ``compiling`` (a background compile is pending), ``fallback`` (why the
    kernel runs on a fallback, or None) and ``device_why`` (how the device was decided: named
    by the kernel, or the planner's choice for device "auto"); then, where the library fills them (sr_plan_info's
    second version; absent from an older library's answer): ``module`` ("compiled", "memory",
    "disk" or None), ``module_cache``, ``module_path``, ``compile_ms``, ``compile_error``,
    ``plans`` (the candidates the planner chose among), ``est_ns`` (the chosen one's estimate
    per pair), ``simplified``, ``formula`` (the formula run, printed), ``rewrite``, ``hoisted``,
    ``flops_per_pair``, ``flops_per_pair_given``, ``bytes_per_pair``, ``acc`` ("block",
    "kahan", "f64" or None), ``io_native``, ``eval_block`` (what Genred.eval_block runs:
    "generated", "tile interpreter" or "reference"), ``loop_mode``, ``rows_per_pass``,
    ``tile_isa``, ``product`` ("avx512", "avx2", "blis" or None), ``b_hoisted`` and
    ``rerank``; then (the third version): ``dot_dim`` (the values of the inner product a tile
    product computes F from, 0: none), ``dot_mr``, ``dot_nr``, ``dot_kc`` (its AVX-512
    blocking), ``scale_in_exp``, ``b_padded`` (BLIS's padded width of B, 0: not padded),
    ``split_why`` (why a sum split the formula admits is not applied, or None) and
    ``split_parts`` with ``split_strategies`` and ``split_est_ns`` (the parts' strategy names and
    estimates, one per part weighed) and ``split_whole`` / ``split_whole_est_ns`` (F whole's best
    plan, None / 0 when not weighed)."""
    info = PlanInfo(size=ctypes.sizeof(PlanInfo))
    st = lib.sr_kernel_plan(kernel, ctypes.byref(info))
    if st != 0:
        raise make_error(st, None, "sr_kernel_plan")

    def name(s):
        n = lib.sr_strategy_name(s)
        return n.decode() if n else str(s)

    def text(b):
        return b.decode(errors="replace") if b else None

    plan = {
        "strategy": name(info.strategy),
        "inner": name(info.inner),
        "backend": info.backend.decode() if info.backend else None,
        "device": _DEVICE_NAMES.get(info.device, str(info.device)),
        "tile_rows": info.tile_rows,
        "tile_cols": info.tile_cols,
        "threads": info.threads,
        "workspace_bytes": info.workspace_bytes,
        "workspace_per_thread": info.workspace_per_thread,
        "tier": info.tier,
        "compiling": bool(info.compiling),
        "fallback": info.fallback.decode() if info.fallback else None,
        "device_why": info.device_why.decode() if info.device_why else None,
    }
    if info.size < PlanInfo.rerank.offset + PlanInfo.rerank.size:  # the first version only
        return plan
    formula = None
    if info.formula:
        buf = ctypes.create_string_buffer(1 << 16)
        lib.sr_expr_print(info.formula, buf, len(buf))
        formula = buf.value.decode(errors="replace")
    plan.update({
        "module": text(info.module), "module_cache": text(info.module_cache),
        "module_path": text(info.module_path), "compile_ms": info.compile_ms,
        "compile_error": text(info.compile_error), "plans": info.plans, "est_ns": info.est_ns,
        "simplified": bool(info.simplified), "formula": formula, "rewrite": text(info.rewrite),
        "hoisted": info.hoisted, "flops_per_pair": info.flops_per_pair,
        "flops_per_pair_given": info.flops_per_pair_given, "bytes_per_pair": info.bytes_per_pair,
        "acc": _ACC_NAMES.get(info.acc, str(info.acc)), "io_native": bool(info.io_native),
        "eval_block": _EVAL_BLOCK.get(info.eval_block), "loop_mode": bool(info.loop_mode),
        "rows_per_pass": info.rows_per_pass, "tile_isa": text(info.tile_isa),
        "product": text(info.product), "b_hoisted": bool(info.b_hoisted),
        "rerank": bool(info.rerank),
    })
    if info.size < ctypes.sizeof(PlanInfo):  # an older library: no third version
        return plan
    parts = info.split_parts
    plan.update({
        "dot_dim": info.dot_dim, "dot_mr": info.dot_mr, "dot_nr": info.dot_nr,
        "dot_kc": info.dot_kc, "scale_in_exp": bool(info.scale_in_exp),
        "b_padded": info.b_padded, "split_why": text(info.split_why), "split_parts": parts,
        "split_strategies": [name(info.split_strategy[i]) for i in range(parts)],
        "split_est_ns": [info.split_est_ns[i] for i in range(parts)],
        "split_whole": name(info.split_whole) if info.split_whole_est_ns > 0 else None,
        "split_whole_est_ns": info.split_whole_est_ns,
    })
    return plan


def ctx_error(ctx):
    msg = lib.sr_ctx_error(ctx)
    return msg.decode(errors="replace") if msg else ""


def make_error(status, ctx, what=None):
    """The exception for a failing status: sr_ctx_error's message, else the status text."""
    msg = ctx_error(ctx) if ctx else ""
    if not msg:
        msg = (lib.sr_status_str(status) or b"error").decode()
    if what:
        msg = f"{what}: {msg}"
    cls = SymredValueError if status in _VALUE_ERRORS else SymredRuntimeError
    return cls(msg, status)


def check(status, ctx, what=None):
    """Raises the exception for status unless it is SR_OK."""
    if status != SR_OK:
        raise make_error(status, ctx, what)


def parse(ctx, text, aliases, gradin_cat=SR_CAT_I, what="formula"):
    """Parses formula text with its aliases (sr_parse_ex) in the context ``ctx``: the sr_expr
    (a c_void_p) and the variable table, a list of (index, dim, cat, alias) in index order,
    alias the position of the declaring alias or -1. ``gradin_cat`` is the category of
    GradFromPos(F, v, I)'s gradient input (the reduction's output category). Errors raise
    SymredValueError naming ``what`` and the text."""
    arr = (ctypes.c_char_p * max(1, len(aliases)))(*[a.encode() for a in aliases])
    cap = 16
    while True:
        table = (ParseVar * cap)()
        desc = ParseDesc(gradin_cat=gradin_cat, vars=table, vars_cap=cap)
        out = ctypes.c_void_p()
        st = lib.sr_parse_ex(ctx, text.encode(), arr, len(aliases), ctypes.byref(desc),
                             ctypes.byref(out))
        check(st, ctx, f"{what} {text!r}")
        if desc.nvars <= cap:
            break
        cap = desc.nvars
    if not out.value:
        raise SymredValueError(f"{what} {text!r}: the parser returned no expression")
    return out, [(v.index, v.dim, v.cat, v.alias) for v in table[:desc.nvars]]


def declared_vars(aliases):
    """The variable table (as :func:`parse` gives it) of alias declarations alone, read by the
    C parser in a context of its own."""
    ctx = ctypes.c_void_p()
    if lib.sr_ctx_new(ctypes.byref(ctx)) != SR_OK or not ctx.value:
        raise MemoryError("symred: sr_ctx_new failed")
    try:
        return parse(ctx, "0", aliases, what="aliases")[1]
    finally:
        lib.sr_ctx_free(ctx)


def kernel_vars(ptr):
    """{index: (cat, dim)} of the variables a kernel reads (sr_kernel_var): gradient kernels'
    come from sr_grad, so the bindings do not know them otherwise. An index missing from the
    result is unused."""
    out = {}
    cat, dim = ctypes.c_int(), ctypes.c_int()
    for v in range(lib.sr_kernel_nargs(ptr)):
        check(lib.sr_kernel_var(ptr, v, ctypes.byref(cat), ctypes.byref(dim)), None,
              "sr_kernel_var")
        if dim.value:
            out[v] = (cat.value, dim.value)
    return out
