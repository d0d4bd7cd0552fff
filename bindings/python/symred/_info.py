"""symred.info(): what this installation of symred uses, for bug reports and set-up checks.

The library path and version come from the loaded library; the CUDA status from the library
itself (it is asked for a CUDA kernel, and its error says why there is none). The C API has no
query for the JIT compiler, the cache directory or BLIS, so those are worked out here by the
same rules the library follows (src/jit/cache.c, src/cpu/gemm.c), and say so.
"""

import ctypes
import os
import shutil
import sys

from ._lib import SR_DEVICE_CUDA, SR_F32, SR_OK, KernelDesc, ctx_error, lib, lib_path, version


def _compiler():
    cc = os.environ.get("SYMRED_CC") or "cc"
    where = shutil.which(cc)
    how = "SYMRED_CC" if os.environ.get("SYMRED_CC") else "default; set SYMRED_CC to change"
    return f"{cc} ({how}; {where if where else 'NOT FOUND on PATH: the CPU JIT cannot compile'})"


def _cache_dir():
    env = os.environ.get("SYMRED_CACHE_DIR")
    if env == "off":
        return "disabled (SYMRED_CACHE_DIR=off)"
    if env:
        return f"{env} (SYMRED_CACHE_DIR)"
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg.startswith("/"):
        return os.path.join(xdg, "symred") + " (XDG_CACHE_HOME)"
    if os.environ.get("HOME"):
        return os.path.join(os.environ["HOME"], ".cache", "symred")
    return "none (HOME unset): compiled kernels are not cached"


def _blis():
    var = "SYMRED_GEMM" if os.environ.get("SYMRED_GEMM") else "SYMRED_BLIS"
    if os.environ.get(var) == "off":
        return f"off ({var}=off)"
    name = os.environ.get("SYMRED_BLIS_LIB") or "libblis.so.4"
    try:
        ctypes.CDLL(name)
    except OSError as e:
        return f"{name} not loadable ({e}); the gemm-epilogue path uses its own kernel or none"
    return f"{name} loadable (the library dlopens it for the gemm-epilogue path)"


def _cuda():
    """Asks the library for a small CUDA kernel; its error message says why it cannot."""
    ctx, expr, kern = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    if lib.sr_ctx_new(ctypes.byref(ctx)) != SR_OK:
        return "unknown (sr_ctx_new failed)"
    try:
        aliases = (ctypes.c_char_p * 2)(b"x = Vi(1)", b"y = Vj(1)")
        if lib.sr_parse(ctx, b"SqDist(x, y)", aliases, 2, ctypes.byref(expr)) != SR_OK:
            return f"unknown ({ctx_error(ctx)})"
        red = ctypes.c_int()
        lib.sr_reduction_from_name(b"Sum", ctypes.byref(red))
        desc = KernelDesc(reduction=red.value, axis=1, k=1, dtype=SR_F32, device=SR_DEVICE_CUDA)
        if lib.sr_kernel_new(ctx, expr, ctypes.byref(desc), ctypes.byref(kern)) != SR_OK:
            return f"not available: {ctx_error(ctx)}"
        lib.sr_kernel_free(kern)
        return "available (a CUDA kernel was created)"
    finally:
        lib.sr_ctx_free(ctx)


def info(file=None):
    """Prints the library path and version, the JIT's compiler, the cache directory, and the
    BLIS and CUDA status; returns them as a dict."""
    from . import __version__

    rows = {
        "symred": f"{__version__} (package at {os.path.dirname(os.path.abspath(__file__))})",
        "library": f"{lib_path}" + (" (SYMRED_LIB)" if os.environ.get("SYMRED_LIB") else ""),
        "library version": version(),
        "JIT compiler": _compiler(),
        "cache directory": _cache_dir(),
        "BLIS": _blis(),
        "CUDA": _cuda(),
    }
    out = file if file is not None else sys.stdout
    for key, value in rows.items():
        print(f"{key + ':':17} {value}", file=out)
    return rows
