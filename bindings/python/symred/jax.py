"""symred.jax: Genred and LazyTensor on jax.Array, inside jax.jit, jax.grad and jax.vmap.

    from symred.jax import Genred, LazyTensor, Vi, Vj, Pm

Each reduction is one XLA custom call through XLA's FFI: the handler (bindings/python/ffi/
symred-xla.c, built as libsymred_xla.so) receives XLA's buffers and runs the compiled symred
kernel on them in place, with no copy. The kernel is created at trace time from the static
formula, reduction, shapes and dtype, so a bad formula or a wrong shape raises while
tracing, with symred's message; a failure at run time (bad block-sparse ranges, say) comes
back through XLA's error API and JAX raises it as a Python exception.

Derivatives. Every kernel run is one JAX primitive, ``symred_reduce``, with a forward-mode
rule, a transpose rule and a batching rule (docs/jax.md). Its JVP is another kernel run: the
tangent kernel of the C library (``sr_kernel_jvp``) of the variables that have a tangent,
which is linear in the tangents; its transpose runs the gradient kernels (``sr_kernel_grad``,
docs/gradients.md). So ``jax.jvp``, ``jax.jacfwd``, ``jax.grad``, ``jax.vjp``, ``jax.jacrev``
and ``jax.hessian`` all work, and nest to any order (every derivative is a kernel run through
the same primitive).

vmap. The batching rule lays the batches end to end and runs them as **one** call with
block-diagonal block-sparse ranges, symred's batch dimensions (docs/ranges.md). A batched
parameter (``vmap`` over a bandwidth, say) becomes a variable of the output index, one value
per row, in a kernel rebuilt from the Genred (still one call); only a parameter declared by
``Var()``, and batches on the GPU, run as a ``jax.lax.map`` loop.

Sharding. Under ``jax.jit`` on arrays sharded over a mesh, XLA partitions each kernel run by
symred's rules (``jax.experimental.custom_partitioning``, symred/_jax_partition.py): per shard
when the output rows are sharded, partial results combined by the reduction's rule when the
reduced rows are (docs/scale-out.md). Calls with block-sparse ranges, vmap's among them, are
not partitioned.

KernelSolve. (alpha I + K) a = b by conjugate gradients in JAX over the Genred's Sum
(``jax.scipy.sparse.linalg.cg``): jit, implicit derivatives, and under vmap one call per
iteration for all batches.

Lifetime. A jitted function holds the kernels' addresses, and JAX may keep it compiled after
the Genred that made it is gone: each Genred's context and kernels belong to a reference-counted
keeper in the FFI library, held by the Genred and by every XLA executable that calls its
kernels (taken when XLA builds the executable, released when XLA destroys it), and freed with
the last of them (:func:`keepers_alive` counts them). ``import symred`` never imports jax; this
module does, and raises ImportError without it.
"""

import ctypes
import os
import weakref
from pathlib import Path

try:
    import jax
    import jax.numpy as jnp
    from jax.extend.core import Primitive
    from jax._src import core as _jcore  # shard_map's varying axes (no public API yet)
    from jax._src import dispatch as _jdispatch
    from jax.interpreters import ad, batching, mlir
except ImportError as e:  # pragma: no cover - exercised where jax is missing
    raise ImportError(
        "symred.jax needs JAX (pip install jax); symred itself and symred.numpy work without it"
    ) from e

import numpy as np

from . import _lib
from . import genred as _genred
from . import lazytensor as _lazy
from . import solve as _solve
from ._lib import SR_CAT_I, SR_CAT_J, SR_CAT_PARAM, SR_F32, SR_F64, KernelDesc, check, lib

__all__ = ["Genred", "KernelSolve", "LazyTensor", "Vi", "Vj", "Pm", "keepers_alive",
           "xla_lib_path"]

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
_xla.symred_xla_keeper_new.restype = ctypes.c_void_p
_xla.symred_xla_keeper_adopt.restype = ctypes.c_int
_xla.symred_xla_keeper_adopt.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
_xla.symred_xla_keeper_release.argtypes = [ctypes.c_void_p]
_xla.symred_xla_keepers_alive.restype = ctypes.c_long


def _stages(handler):
    # The same handler runs the instantiate stage (the executable takes a reference to the
    # Genred's keeper) and the execute stage.
    cap = jax.ffi.pycapsule(handler)
    return {"instantiate": cap, "execute": cap}


jax.ffi.register_ffi_target(_TARGET, _stages(_xla.symred_xla_cpu), platform="cpu")
try:  # a jaxlib without its CUDA plugin has no CUDA platform to register on
    jax.ffi.register_ffi_target(_TARGET, _stages(_xla.symred_xla_cuda), platform="CUDA")
except Exception:  # noqa: BLE001 - the CPU target is all this process can use then
    pass


def _hand_over(h, keeper):
    """A Genred's finalizer: its context and kernels go to its keeper, which frees them once
    no XLA executable refers to them either (bindings/python/ffi/symred-xla.c, Lifetime)."""
    with h.lock:
        ptrs = [k.value for k in h.kernels.values()]
        h.kernels.clear()
    arr = (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
    if _xla.symred_xla_keeper_adopt(keeper, h.ctx, arr, len(ptrs)) != 0:
        _genred._Handle.close(lib, h.ctx, dict(enumerate(arr[: len(ptrs)])))
    _xla.symred_xla_keeper_release(keeper)


def keepers_alive():
    """The number of Genreds of this module whose context and kernels are not freed yet:
    alive, or referred to by an XLA executable (JAX's caches keep those until
    ``jax.clear_caches()`` or their own eviction)."""
    return _xla.symred_xla_keepers_alive()

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
        self.jvp_mask = None  # for a tangent kernel: the variables of the parent it derives
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

    def jvp(self, mask):
        """The tangent kernel along the variables of the bit mask ``mask`` (sr_kernel_jvp):
        the forward arrays, one tangent per forward index, then the forward output and the
        auxiliary array; same axis."""

        def make(h):
            out = ctypes.c_void_p()
            check(lib.sr_kernel_jvp(self.ptr, mask, ctypes.byref(out)), h.ctx,
                  f"forward-mode derivative of {self.red}")
            h.kernels[("jvp", id(self), mask)] = out
            k = _Kernel(self.owner, out, "Sum", self.axis, self.desc,
                        make=lambda parent: parent.jvp(mask))
            k.jvp_mask = mask
            return k

        return self._new_derived(("jvp", mask), make)

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
        owner, chain, k, indices = self.owner, [], self, set(indices)
        while not isinstance(k.make, tuple):
            chain.append(k.make)
            if k.jvp_mask is not None:  # a tangent (index n + v) goes with its variable v
                indices = {i % k.parent.nargs for i in indices}
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
                 keeper=np.uint64(kern.owner._keeper),
                 dtype=np.int64(kern.desc[0]),
                 nx=np.int64(call.nx), ny=np.int64(call.ny), nout=np.int64(call.nout))
    if call.ranges is not None:
        attrs.update(zip(_genred._RANGES_NAMES, call.ranges))
    return tuple(jax.ffi.ffi_call(_TARGET, results, vmap_method="sequential")(*args, **attrs))


_reduce_p = Primitive("symred_reduce")
_reduce_p.multiple_results = True


# JAX's tracking of the mesh axes a value varies over inside shard_map (jax 0.10's names;
# without them, results are typed as before and shard_map needs check_vma=False).
_VMA = all(hasattr(_jcore, n) for n in ("auto_insert_reshard", "standard_vma_rule",
                                        "ManualAxisType", "get_cur_mesh_sharding"))


def _reduce(call, *args):
    """One kernel run: the results as a tuple (values, indices, or both). Inside
    ``shard_map`` the arrays are first made to vary over the same mesh axes (JAX's pvary,
    whose transpose sums the cotangent of a replicated array over them)."""
    if _VMA:
        args = _jcore.auto_insert_reshard(*args)
    return tuple(_reduce_p.bind(*args, call=call))


def _aval(shape, dt, vma):
    """A result's abstract value; inside ``shard_map`` it varies over the mesh axes ``vma``
    over which the arguments vary."""
    if not vma:
        return jax.core.ShapedArray(shape, dt)
    mat = _jcore.ManualAxisType(varying=vma)
    return jax.core.ShapedArray(shape, dt, sharding=_jcore.get_cur_mesh_sharding(),
                                manual_axis_type=mat)


def _reduce_abstract(*args, call):
    kern = call.kern
    vma = _jcore.standard_vma_rule(_reduce_p.name, *args) if _VMA else frozenset()
    dt = jnp.float64 if kern.desc[0] == SR_F64 else jnp.float32
    shape = (call.nout, kern.out_dim)
    outs = []
    if kern.red not in _INDEX_ONLY:
        outs.append(_aval(shape, dt, vma))
    if kern.red in _WITH_INDICES:
        outs.append(_aval(shape, _index_dtype(), vma))
    return outs


_reduce_p.def_impl(lambda *args, call: _ffi(call, args))
_reduce_p.def_abstract_eval(_reduce_abstract)


def _lower(ctx, *args, call):
    """The custom call, wrapped so that XLA partitions it over the mesh of sharded arguments
    (symred/_jax_partition.py); on one device it is the custom call alone."""
    from . import _jax_partition  # imports this module

    return mlir.lower_fun(lambda *a: _jax_partition.partitioned(call, a),
                          multiple_results=True)(ctx, *args)


mlir.register_lowering(_reduce_p, _lower)
# custom_partitioning needs the devices when it lowers (no public API to say so yet).
_jdispatch.prim_requires_devices_during_lowering.add(_reduce_p)


def _reduce_batch(args, dims, *, call):
    B = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    in_batched = [d is not None for d in dims]
    args = [jnp.moveaxis(a, d, 0) if b else a for a, d, b in zip(args, dims, in_batched)]
    outs, _ = _batched(call, B, in_batched, args)
    return list(outs), [0] * len(outs)


batching.primitive_batchers[_reduce_p] = _reduce_batch


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
    in_batched = list(in_batched)
    params = [i for i, b in enumerate(in_batched)
              if b and kern.vars.get(i, (None,))[0] == SR_CAT_PARAM]
    pk = kern.promoted(params) if params and kern.desc[1] != _lib.SR_DEVICE_CUDA else None
    if pk is not None:
        # Batched parameters as variables of the Genred's output index: one value per row;
        # in a tangent kernel a parameter and its tangent go together, so an unbatched one
        # promoted with a batched one is repeated for every batch.
        args = list(args)
        for i, (cat, _) in pk.vars.items():
            if kern.vars[i][0] != SR_CAT_PARAM or cat == SR_CAT_PARAM:
                continue
            rows = call.nx if cat == SR_CAT_I else call.ny
            a = args[i] if in_batched[i] else args[i][None]
            args[i] = jnp.broadcast_to(a[:, None, :], (B, rows, a.shape[-1]))
            in_batched[i] = True
        call, kern = _Call(pk, call.nx, call.ny, call.ranges), pk
    # The CUDA handler has no ranges (sr_kernel_run_device): batches loop there.
    elif params or kern.desc[1] == _lib.SR_DEVICE_CUDA:
        idx = [i for i, b in enumerate(in_batched) if b]

        def one(xs):
            a = list(args)
            for i, x in zip(idx, xs):
                a[i] = x
            return _reduce(call, *a)

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
    outs = _reduce(_Call(kern, nx, ny, ranges), *flat)
    res = []
    for o in outs:
        o = o.reshape((B, M) + o.shape[1:])
        if jnp.issubdtype(o.dtype, jnp.integer) and not shared:
            off = (jnp.arange(B, dtype=o.dtype) * N)[:, None, None]
            o = o - off * (o >= 0)
        res.append(o)
    return tuple(res), outs_batched


def _extras(call, args, outs):
    """What the gradient and tangent kernels of a reduction read after the forward arrays and
    the incoming gradient or the tangents (docs/gradients.md): the forward output (values,
    or indices as values) and the log-normalizer or the reduced index."""
    kern = call.kern
    values = outs[0]
    if kern.red == "LogSumExp":
        return [values]
    if kern.red == "SumSoftMaxWeight":
        lse = kern.logsumexp()
        return [values, _reduce(_Call(lse, call.nx, call.ny, call.ranges),
                                *args[: lse.nargs])[0]]
    if kern.red in _SELECTING:
        return [outs[1].astype(values.dtype), jnp.arange(call.nred, dtype=values.dtype)[:, None]]
    return []


def _placeholder(kern):
    return jnp.zeros((1,), jnp.float64 if kern.desc[0] == SR_F64 else jnp.float32)


def _reduce_jvp(primals, tangents, *, call):
    """Forward mode: the tangent of the values is the tangent kernel (sr_kernel_jvp) of the
    variables whose tangent is not a symbolic zero, run through the same primitive; it is
    linear in the tangents (its transpose is _reduce_transpose). Indices have no tangent."""
    outs = _reduce(call, *primals)
    kern = call.kern
    touts = [ad.Zero(jax.typeof(o).to_tangent_aval()) for o in outs]
    if kern.red in _INDEX_ONLY:
        return outs, touts
    n = kern.nargs
    dargs, mask = [_placeholder(kern)] * n, 0
    for i, t in enumerate(tangents[:n]):
        if type(t) is not ad.Zero and i in kern.vars:
            dargs[i] = t
            mask |= 1 << i
    if mask:
        extra = _extras(call, primals, outs) + [_placeholder(kern)] * 2
        jk = kern.jvp(mask)
        args = (list(primals[:n]) + dargs + extra)[: jk.nargs]
        touts[0] = _reduce(_Call(jk, call.nx, call.ny, call.ranges), *args)[0]
    return outs, touts


def _reduce_transpose(cts, *args, call):
    """Reverse mode: the transpose of a tangent kernel run with respect to its tangents is
    the parent kernel's gradient kernels (sr_kernel_grad) with the cotangent as incoming
    gradient, run through the same primitive (so that the backward is differentiable too).
    The tangent kernel's arguments after the tangents (forward output, log-normalizer or
    reduced index) are the gradient kernel's after the incoming gradient."""
    kern = call.kern
    undefined = [i for i, a in enumerate(args) if ad.is_undefined_primal(a)]
    parent = kern.parent
    n = parent.nargs if parent is not None else 0
    if kern.jvp_mask is None or any(i < n or i >= 2 * n for i in undefined):
        raise NotImplementedError(f"symred.jax: cannot transpose a {kern.red} kernel run with "
                                  f"respect to arguments {undefined}: only tangent kernels "
                                  f"are linear in their tangents")
    out = [None] * len(args)
    ct = cts[0]
    if type(ct) is ad.Zero:
        return out
    extra = [ct] + list(args[2 * n: 2 * n + 2])
    for i in undefined:
        v = i - n
        gk = parent.grad(v)
        gargs = (list(args[:n]) + extra + [_placeholder(kern)] * 2)[: gk.nargs]
        g = _reduce(_Call(gk, call.nx, call.ny, call.ranges), *gargs)[0]
        if parent.vars[v][0] == SR_CAT_PARAM:
            g = g.sum(0)  # one partial gradient per output row
        out[i] = g.reshape(args[i].aval.shape)
    return out


ad.primitive_jvps[_reduce_p] = _reduce_jvp
ad.primitive_transposes[_reduce_p] = _reduce_transpose

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
    def _cast(a, dt):
        return a.astype(dt)

    @staticmethod
    def _expand(a, shape):
        return jnp.broadcast_to(a, shape)

    @staticmethod
    def _like(values, a):
        return jnp.asarray(values, dtype=a.dtype)

    @staticmethod
    def _log(a):
        return jnp.log(a)

    @staticmethod
    def _constant(a):
        return jax.lax.stop_gradient(a)

    @staticmethod
    def _ranges_array(a):
        if isinstance(a, jax.core.Tracer):
            raise TypeError("ranges must be concrete (NumPy) integer arrays: they are part of "
                            "the compiled call, not traced values")
        return np.asarray(a)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # A compiled jax function may outlive this object and still hold its kernels: they
        # go to a keeper that the executables referring to them hold too.
        keeper = _xla.symred_xla_keeper_new()
        if not keeper:
            raise MemoryError("symred.jax: symred_xla_keeper_new failed")
        self._keeper = keeper
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _hand_over, self._h, keeper)
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
        if self._weighted_lse:
            return self._extended_call(args, None, backend=backend, device_id=device_id,
                                       ranges=ranges)
        full = self._batch_shape(args)
        if full is not None:
            return self._call_batched(args, full, backend, device_id, ranges)
        rg = _genred._ranges_struct(ranges, self._ranges_array)[1] if ranges is not None else None
        arrays, dt, nx, ny = self._prepare(args)
        self._check_acc(dt)
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


class KernelSolve(Genred, _solve.KernelSolve):
    """``KernelSolve`` on jax arrays: the arguments of :class:`symred.KernelSolve` (a formula
    ``F(x, y) * b`` linear in the variable ``varinvalias``, axis, dtype, accuracy options);
    the call returns ``a`` with ``(alpha I + K) a = b`` for the symmetric K of F.

    The solve is conjugate gradients in JAX (``jax.scipy.sparse.linalg.cg``, a
    ``lax.custom_linear_solve``) whose operator is this Genred's Sum, one custom call per
    iteration: it runs under ``jax.jit``; ``jax.grad``/``jax.jvp`` with respect to b and to
    the kernel's arrays go through the implicit derivative (further solves), not through the
    iterations; under ``jax.vmap`` every iteration's product runs all batches as one call
    (the Genred's batching rule: symred's batch dimensions), the loop running until every
    batch has converged. pykeops' tolerance: stop at |r|^2 < size(b) eps^2, or after
    ``max_iter`` iterations (0: 10 size(b) + 10) without an error (a traced loop cannot
    raise: check the residual where it matters). K must be symmetric (the caller passes the
    same data for x and y); ``check_symmetry`` is accepted and not checked here."""

    def __call__(self, *args, backend="auto", device_id=-1, alpha=1e-10, eps=1e-6,
                 ranges=None, max_iter=0, check_symmetry=True):
        self._solve_checks(args, ranges)
        args = [jnp.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
        _, _, nx, ny = self._prepare(args)
        if nx != ny:
            raise ValueError(f"KernelSolve: K must be square, but the i-variables have {nx} "
                             f"rows and the j-variables {ny}")
        b = args[self.varinvpos]
        iters = _genred._int_arg("max_iter", max_iter, 0, _genred._INT32_MAX)

        def matvec(a):
            full = list(args)
            full[self.varinvpos] = a
            return alpha * a + Genred.__call__(self, *full, backend=backend,
                                               device_id=device_id)

        return jax.scipy.sparse.linalg.cg(
            matvec, b, tol=0.0, atol=float(eps) * float(np.sqrt(b.size)),
            maxiter=iters if iters > 0 else 10 * int(b.size) + 10)[0]


# ---- LazyTensor -------------------------------------------------------------------------


class LazyTensor(_lazy.LazyTensor):
    """``LazyTensor`` on jax arrays (shapes, operations and reductions as
    :class:`symred.LazyTensor`); reductions return jax arrays, work inside ``jax.jit`` and
    are differentiable and batched as :class:`Genred`."""

    _ARRAY_TYPE = jax.Array
    _ARRAY_NAME = "jax array"
    _GENRED = Genred
    _KERNELSOLVE = KernelSolve

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


Vi, Vj, Pm = _lazy._constructors(LazyTensor, "jax array")
