"""symred.jax: Genred and LazyTensor on jax.Array, inside jax.jit, jax.grad and jax.vmap.

    from symred.jax import Genred, LazyTensor, Vi, Vj, Pm

Each reduction is one XLA custom call through XLA's FFI: the handler (bindings/python/ffi/
symred-xla.c, built as libsymred_xla.so) receives XLA's buffers and runs the compiled symred
kernel on them in place, with no copy. The kernel is created at trace time from the static
formula, reduction, shapes and dtype, so a bad formula or a wrong shape raises while
tracing, with symred's message; a failure at run time (bad block-sparse ranges, say) comes
back through XLA's error API and JAX raises it as a Python exception.

Gradients. Every kernel run is a ``jax.custom_vjp`` function whose backward runs the
gradient kernels of the C library (``sr_kernel_grad``, docs/gradients.md) as further FFI
calls, through the same function: gradients nest to any order (``jax.hessian``,
``check_grads(order=2)``).

vmap. Every kernel run is also a ``jax.custom_batching.custom_vmap`` function whose rule lays
the batches end to end and runs them as **one** call with block-diagonal block-sparse ranges,
symred's batch dimensions (docs/ranges.md). A batched parameter (``vmap`` over a bandwidth,
say) becomes a variable of the output index, one value per row, in a kernel rebuilt from the
Genred (still one call); only a parameter declared by ``Var()``, and batches on the GPU, run
as a ``jax.lax.map`` loop.

Kernels live as long as the process: a jitted function holds their address, and JAX may keep
it compiled after the Genred that made it is gone. ``import symred`` never imports jax; this
module does, and raises ImportError without it.
"""

import ctypes
import os
import threading
from pathlib import Path

try:
    import jax
    import jax.numpy as jnp
    from jax.custom_batching import custom_vmap
except ImportError as e:  # pragma: no cover - exercised where jax is missing
    raise ImportError(
        "symred.jax needs JAX (pip install jax); symred itself and symred.numpy work without it"
    ) from e

import numpy as np

from . import _lib
from . import genred as _genred
from . import lazytensor as _lazy
from ._lib import SR_CAT_I, SR_CAT_J, SR_CAT_PARAM, SR_F32, SR_F64, KernelDesc, check, lib

__all__ = ["Genred", "LazyTensor", "Vi", "Vj", "Pm", "xla_lib_path"]

_SR_DTYPES = {np.dtype(np.float32): SR_F32, np.dtype(np.float64): SR_F64}
_SELECTING = ("Min", "Max", "Min_ArgMin", "Max_ArgMax", "KMin", "KMin_ArgKMin")
_INDEX_ONLY = ("ArgMin", "ArgMax", "ArgKMin")
_WITH_INDICES = _INDEX_ONLY + ("Min_ArgMin", "Max_ArgMax", "KMin_ArgKMin")
# Min, Max and KMin gradients need the selected indices: the forward runs the reduction that
# returns both, and Genred hands back the values only.
_WITH_ARG = {"Min": "Min_ArgMin", "Max": "Max_ArgMax", "KMin": "KMin_ArgKMin"}
_TARGET = "symred_reduce"

# ---- the FFI library --------------------------------------------------------------------


def _load_xla_lib():
    """libsymred_xla.so: $SYMRED_XLA_LIB, else next to the libsymred that was loaded (the
    build tree or the installed package), else in this package."""
    env = os.environ.get("SYMRED_XLA_LIB")
    if env:
        candidates = [env]
    else:
        here = Path(os.path.realpath(_lib.lib_path)).parent
        candidates = [str(here / "libsymred_xla.so"),
                      str(Path(_lib.lib_path).parent / "libsymred_xla.so"),
                      str(Path(__file__).resolve().parent / "libsymred_xla.so")]
    tried = []
    for path in candidates:
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path} ({e})")
    raise ImportError(
        "symred.jax: cannot load libsymred_xla.so, the XLA FFI handlers. CMake builds it next "
        "to libsymred.so when it finds jaxlib's headers (a Python that imports jax, or "
        "-DSYMRED_JAX_INCLUDE_DIR=...); or set SYMRED_XLA_LIB. Tried:\n  " + "\n  ".join(tried)
    )


_xla, xla_lib_path = _load_xla_lib()
jax.ffi.register_ffi_target(_TARGET, jax.ffi.pycapsule(_xla.symred_xla_cpu), platform="cpu")
try:  # a jaxlib without its CUDA plugin has no CUDA platform to register on
    jax.ffi.register_ffi_target(_TARGET, jax.ffi.pycapsule(_xla.symred_xla_cuda),
                                platform="CUDA")
except Exception:  # noqa: BLE001 - the CPU target is all this process can use then
    pass

# Handles of every Genred of this module: a compiled jax function holds the address of their
# kernels, so they are never freed (see the module docstring).
_alive = []
_alive_lock = threading.Lock()

# ---- kernels ----------------------------------------------------------------------------


class _Kernel:
    """A compiled sr_kernel and what the FFI calls and their derivatives need of it; its
    gradient kernels are created on demand in the same context. ``make`` rebuilds the same
    kernel from another Genred (see :meth:`promoted`): for a Genred's kernel its reduction,
    for a derived kernel how it derives from its parent."""

    def __init__(self, owner, ptr, red, axis, desc, expr=None, make=None):
        self.owner, self.ptr, self.red, self.axis = owner, ptr, red, axis
        self.desc, self.expr, self.make = desc, expr, make
        self.parent = None  # the kernel this one derives from (set by _new_derived)
        self.nargs = lib.sr_kernel_nargs(ptr)
        self.out_dim = lib.sr_kernel_out_dim(ptr)
        self.vars = _lib.kernel_vars(ptr)
        self._derived = {}

    def _new_derived(self, key, make):
        h = self.owner._h
        with h.lock:
            k = self._derived.get(key)
            if k is None:
                k = self._derived[key] = make(h)
                k.parent = self
            return k

    def grad(self, index):
        def make(h):
            out = ctypes.c_void_p()
            check(lib.sr_kernel_grad(self.ptr, index, ctypes.byref(out)), h.ctx,
                  f"gradient of {self.red} with respect to argument {index}")
            h.kernels[("grad", id(self), index)] = out
            reduced_cat = SR_CAT_J if self.axis == 1 else SR_CAT_I
            axis = 1 - self.axis if self.vars[index][0] == reduced_cat else self.axis
            return _Kernel(self.owner, out, "Sum", axis, self.desc,
                           make=lambda parent: parent.grad(index))

        return self._new_derived(("grad", index), make)

    def logsumexp(self):
        """SumSoftMaxWeight's log-normalizer, which its gradient kernel reads."""

        def make(h):
            dtype, device, acc = self.desc
            desc = KernelDesc(reduction=_genred.REDUCTIONS.index("LogSumExp"), axis=self.axis,
                              k=1, dtype=dtype, device=device, weight=None, acc=acc)
            out = ctypes.c_void_p()
            check(lib.sr_kernel_new(h.ctx, self.expr, ctypes.byref(desc), ctypes.byref(out)),
                  h.ctx, "the log-normalizer of SumSoftMaxWeight")
            h.kernels[("lse", id(self))] = out
            return _Kernel(self.owner, out, "LogSumExp", self.axis, self.desc,
                           make=lambda parent: parent.logsumexp())

        return self._new_derived(("lse",), make)

    def promoted(self, indices):
        """The same kernel with the parameters of the given indices turned into variables of
        the output index of the Genred's reduction (one value per output row: symred.Genred's
        batched parameters), or None when that Genred cannot (parameters declared by Var())."""
        owner, chain, k = self.owner, [], self
        while not isinstance(k.make, tuple):
            chain.append(k.make)
            k = k.parent
        try:
            g = owner._promoted(tuple(sorted(indices)))
        except ValueError:
            return None
        out = g._jax_kernel(*k.make)
        for make in reversed(chain):
            out = make(out)
        return out


class _Call:
    """What a kernel run needs besides its arrays: the kernel, nx, ny and the block-sparse
    ranges (None, or pykeops' 6-tuple as int64 NumPy arrays), all static at trace time."""

    __slots__ = ("kern", "nx", "ny", "ranges")

    def __init__(self, kern, nx, ny, ranges=None):
        self.kern, self.nx, self.ny, self.ranges = kern, int(nx), int(ny), ranges

    @property
    def nout(self):
        return self.nx if self.kern.axis == 1 else self.ny

    @property
    def nred(self):
        return self.ny if self.kern.axis == 1 else self.nx


def _index_dtype():
    return jnp.dtype(jnp.int64) if jax.config.jax_enable_x64 else jnp.dtype(jnp.int32)


def _ffi(call, args):
    """The custom call itself: the results of the kernel as a tuple (values, indices, or
    both)."""
    kern = call.kern
    dt = jnp.float64 if kern.desc[0] == SR_F64 else jnp.float32  # a kernel may read no array
    shape = (call.nout, kern.out_dim)
    results = []
    if kern.red not in _INDEX_ONLY:
        results.append(jax.ShapeDtypeStruct(shape, dt))
    if kern.red in _WITH_INDICES:
        results.append(jax.ShapeDtypeStruct(shape, _index_dtype()))
    attrs = dict(kernel=np.uint64(kern.ptr.value), context=np.uint64(kern.owner._h.ctx.value),
                 dtype=np.int64(kern.desc[0]),
                 nx=np.int64(call.nx), ny=np.int64(call.ny), nout=np.int64(call.nout))
    if call.ranges is not None:
        attrs.update(zip(_genred._RANGES_NAMES, call.ranges))
    return tuple(jax.ffi.ffi_call(_TARGET, results, vmap_method="sequential")(*args, **attrs))


def _run(call, *args):
    """One kernel run, batched by vmap into one call (see _batched)."""

    @custom_vmap
    def run(*a):
        return _ffi(call, a)

    @run.def_vmap
    def rule(axis_size, in_batched, *a):
        return _batched(call, axis_size, in_batched, a)

    return run(*args)


def _batched(call, B, in_batched, args):
    """vmap's rule: the B batches laid end to end, B * M output rows, and B * N reduced rows
    (N shared when no reduced-side array is batched and there are no ranges), run as one call
    with block-diagonal ranges (or the call's ranges repeated for each batch); the results are
    reshaped to (B, M, ...) and the indices made local to their batch again. A batched
    parameter becomes a variable of the output index of the Genred's reduction (the kernel of
    :meth:`_Kernel.promoted`); where it cannot (a parameter declared by Var()), and on the
    GPU, the batches run as a loop."""
    kern = call.kern
    outs_batched = (True,) * (int(kern.red not in _INDEX_ONLY) + int(kern.red in _WITH_INDICES))
    params = [i for i, b in enumerate(in_batched)
              if b and kern.vars.get(i, (None,))[0] == SR_CAT_PARAM]
    pk = kern.promoted(params) if params and kern.desc[1] != _lib.SR_DEVICE_CUDA else None
    if pk is not None:
        # Batched parameters as variables of the Genred's output index: one value per row.
        args = list(args)
        for i in params:
            rows = call.nx if pk.vars[i][0] == SR_CAT_I else call.ny
            args[i] = jnp.broadcast_to(args[i][:, None, :], (B, rows, args[i].shape[-1]))
        call, kern = _Call(pk, call.nx, call.ny, call.ranges), pk
    # The CUDA handler has no ranges (sr_kernel_run_device): batches loop there.
    elif params or kern.desc[1] == _lib.SR_DEVICE_CUDA:
        idx = [i for i, b in enumerate(in_batched) if b]

        def one(xs):
            a = list(args)
            for i, x in zip(idx, xs):
                a[i] = x
            return _run(call, *a)

        return jax.lax.map(one, [args[i] for i in idx]), outs_batched
    out_cat = SR_CAT_I if kern.axis == 1 else SR_CAT_J
    M, N = call.nout, call.nred
    shared = call.ranges is None and not any(
        b and kern.vars.get(i, (None,))[0] not in (None, out_cat, SR_CAT_PARAM)
        for i, b in enumerate(in_batched))
    flat = []
    for i, (a, b) in enumerate(zip(args, in_batched)):
        cat = kern.vars.get(i, (None,))[0]
        if cat is None:
            flat.append(a[0] if b else a)  # not read by the kernel
        elif cat == SR_CAT_PARAM or (cat != out_cat and shared):
            flat.append(a)
        else:
            a = a if b else jnp.broadcast_to(a, (B,) + a.shape)
            flat.append(a.reshape(B * a.shape[1], a.shape[2]))
    n_red = N if shared else B * N
    nx, ny = (B * M, n_red) if kern.axis == 1 else (n_red, B * M)
    if call.ranges is not None:
        ranges = _genred._batch_ranges(call.ranges, np.asarray, (B,), call.nx, call.ny)
    else:
        b = np.arange(B, dtype=np.int64)
        out_blocks = np.stack([b * M, (b + 1) * M], axis=1)
        if shared:
            red_iv = np.array([[0, N]], dtype=np.int64)
            red_t = (red_iv, np.array([B], dtype=np.int64), out_blocks)
            own = (out_blocks, b + 1, np.tile(red_iv, (B, 1)))
        else:
            red_iv = np.stack([b * N, (b + 1) * N], axis=1)
            red_t = (red_iv, b + 1, out_blocks)
            own = (out_blocks, b + 1, red_iv)
        ranges = own + red_t if kern.axis == 1 else red_t + own
    ranges = tuple(np.ascontiguousarray(r, dtype=np.int64) for r in ranges)
    outs = _run(_Call(kern, nx, ny, ranges), *flat)
    res = []
    for o in outs:
        o = o.reshape((B, M) + o.shape[1:])
        if jnp.issubdtype(o.dtype, jnp.integer) and not shared:
            off = (jnp.arange(B, dtype=o.dtype) * N)[:, None, None]
            o = o - off * (o >= 0)
        res.append(o)
    return tuple(res), outs_batched


def _reduce_impl(call, *args):
    return _run(call, *args)


_reduce = jax.custom_vjp(_reduce_impl, nondiff_argnums=(0,))


def _reduce_fwd(call, *args):
    # Through _reduce itself, not _run: under an outer derivative (second order) the forward
    # is differentiated too.
    outs = _reduce(call, *args)
    return outs, (args, outs)


def _reduce_bwd(call, res, cts):
    """The gradients of a kernel run with respect to its arrays: the gradient kernel of each
    variable (sr_kernel_grad) run on the forward arrays, the incoming gradient and what the
    reduction's contract adds (docs/gradients.md), through _reduce again so that the backward
    is differentiable too."""
    args, outs = res
    kern = call.kern
    zeros = [jnp.zeros_like(a) for a in args]
    if kern.red in _INDEX_ONLY:
        return tuple(zeros)  # indices do not move with the inputs
    values = outs[0]
    G = cts[0]
    extra = [G]
    if kern.red == "LogSumExp":
        extra.append(values)
    elif kern.red == "SumSoftMaxWeight":
        lse = kern.logsumexp()
        extra += [values, _reduce(_Call(lse, call.nx, call.ny, call.ranges),
                                  *args[: lse.nargs])[0]]
    elif kern.red in _SELECTING:
        extra += [outs[1].astype(values.dtype),
                  jnp.arange(call.nred, dtype=values.dtype)[:, None]]
    grads = list(zeros)
    for i, a in enumerate(args):
        if i not in kern.vars:
            continue
        gk = kern.grad(i)
        g = _reduce(_Call(gk, call.nx, call.ny, call.ranges), *(list(args) + extra)[: gk.nargs])
        g = g[0]
        if kern.vars[i][0] == SR_CAT_PARAM:
            g = g.sum(0)  # one partial gradient per output row
        grads[i] = g.reshape(a.shape)
    return tuple(grads)


_reduce.defvjp(_reduce_fwd, _reduce_bwd)

# ---- Genred -----------------------------------------------------------------------------


class Genred(_genred.Genred):
    """``Genred`` on jax arrays: the arguments of :class:`symred.Genred` (pykeops' formula,
    aliases, reduction_op, axis, opt_arg, formula2, ...), called on jax.Arrays (all float32
    or all float64) or tracers, inside or outside ``jax.jit``, returning jax.Arrays. Indices
    are int64 with ``jax_enable_x64``, int32 without (JAX has no int64 then).

    ``backend``: ``"auto"`` (the GPU when JAX runs on one, else symred's default CPU
    backend), ``"CPU"``, ``"GPU"``, ``"reference"``. ``ranges``: pykeops' 6-tuple of
    block-sparse ranges as NumPy (concrete) integer arrays; the C library checks their values
    when the call runs.
    """

    _ARRAY_NAME = "jax array"

    @staticmethod
    def _is_array(a):
        return isinstance(a, jax.Array)

    @staticmethod
    def _array_dtype(a):
        dt = np.dtype(a.dtype)
        return dt if dt in _SR_DTYPES else None

    @staticmethod
    def _from_numbers(a, dt):
        return jnp.asarray(a, dtype=dt)

    @staticmethod
    def _contiguous(a, dt):
        return a  # XLA's buffers are dense, and the dtype was checked

    @staticmethod
    def _expand(a, shape):
        return jnp.broadcast_to(a, shape)

    @staticmethod
    def _like(values, a):
        return jnp.asarray(values, dtype=a.dtype)

    @staticmethod
    def _ranges_array(a):
        if isinstance(a, jax.core.Tracer):
            raise TypeError("ranges must be concrete (NumPy) integer arrays: they are part of "
                            "the compiled call, not traced values")
        return np.asarray(a)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # A compiled jax function may outlive this object and still hold its kernels.
        self._finalizer.detach()
        with _alive_lock:
            _alive.append(self._h)
        self._jax_kernels = {}

    def _jax_kernel(self, sr_dtype, device):
        with self._h.lock:
            jk = self._jax_kernels.get((sr_dtype, device))
            if jk is None:
                red = _WITH_ARG.get(self.reduction_op, self.reduction_op)
                ptr = self._kernel(sr_dtype, device, _genred.REDUCTIONS.index(red))
                jk = _Kernel(self, ptr, red, self.axis, (sr_dtype, device, self._acc),
                             self._expr, make=(sr_dtype, device))
                self._jax_kernels[(sr_dtype, device)] = jk
            return jk

    def _jax_device(self, backend):
        device = self._device(backend)
        if jax.default_backend() == "gpu":
            if device not in (_lib.SR_DEVICE_AUTO, _lib.SR_DEVICE_CUDA):
                raise ValueError(f"backend={backend!r} runs on the CPU, but JAX runs on the GPU "
                                 f"here: use backend='auto' or 'GPU'")
            return _lib.SR_DEVICE_CUDA
        return device

    def __call__(self, *args, backend="auto", device_id=-1, ranges=None, out=None):
        """Runs the reduction on jax arrays given in alias-index order (leading batch
        dimensions as :class:`symred.Genred`: one call)."""
        device = self._jax_device(backend)
        if out is not None:
            raise ValueError("out= is not supported by symred.jax: jax arrays are immutable")
        args = [jnp.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
        full = self._batch_shape(args)
        if full is not None:
            return self._call_batched(args, full, backend, device_id, ranges)
        rg = _genred._ranges_struct(ranges, self._ranges_array)[1] if ranges is not None else None
        arrays, dt, nx, ny = self._prepare(args)
        if self.dtype_acc == "float32" and dt == np.float64:
            raise ValueError("dtype_acc='float32' is not allowed with float64 data")
        reduced = ny if self.axis == 1 else nx
        if self.reduction_op in _genred._K_REDUCTIONS and self.opt_arg > reduced:
            raise ValueError(f"{self.reduction_op}: K = {self.opt_arg} exceeds the {reduced} "
                             f"reduced rows")
        kern = self._jax_kernel(_SR_DTYPES[np.dtype(dt)], device)
        arrays = list(arrays[: kern.nargs]) + [None] * max(0, kern.nargs - len(arrays))
        arrays = [a if a is not None else jnp.zeros((1,), dt) for a in arrays]
        outs = _reduce(_Call(kern, nx, ny, tuple(rg) if rg is not None else None), *arrays)
        red = self.reduction_op
        values = outs[0] if red not in _INDEX_ONLY else None
        idx = outs[-1] if red in _INDEX_ONLY or red in _genred._VALUES_AND_INDICES else None
        return self._shape_output(values, idx, nx if self.axis == 1 else ny)


# ---- LazyTensor -------------------------------------------------------------------------


class LazyTensor(_lazy.LazyTensor):
    """``LazyTensor`` on jax arrays (shapes, operations and reductions as
    :class:`symred.LazyTensor`); reductions return jax arrays, work inside ``jax.jit`` and
    are differentiable and batched as :class:`Genred`."""

    _ARRAY_TYPE = jax.Array
    _ARRAY_NAME = "jax array"
    _GENRED = Genred
    _KERNELSOLVE = None

    @staticmethod
    def _normalize_array(x):
        if np.dtype(x.dtype) not in _SR_DTYPES:
            raise TypeError(f"LazyTensor(jax array of shape {tuple(x.shape)}): dtype "
                            f"{np.dtype(x.dtype).name} is not supported; use float32 or float64")
        return x

    @staticmethod
    def _dtype_name(dt):
        return np.dtype(dt).name

    @staticmethod
    def _param_array(values, dt):
        return jnp.asarray(values, dtype=dt if dt is not None else jnp.float32)


def Vi(x):
    """A variable indexed by i from an ``(n, d)`` jax array: ``LazyTensor(x, axis=0)``."""
    return _lazy._vi_vj(LazyTensor, x, 0)


def Vj(x):
    """A variable indexed by j from an ``(m, d)`` jax array: ``LazyTensor(x, axis=1)``."""
    return _lazy._vi_vj(LazyTensor, x, 1)


def Pm(x):
    """A parameter: a ``(d,)`` or 0-D jax array, a list of numbers, or a number."""
    return _lazy._pm(LazyTensor, x)
