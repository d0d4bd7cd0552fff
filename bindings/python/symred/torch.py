"""symred.torch: Genred and LazyTensor on torch tensors, differentiable, as pykeops.torch.

    from symred.torch import Genred, LazyTensor, Vi, Vj, Pm

Inputs and outputs are torch tensors. Contiguous CPU tensors go to the C library by pointer
(``data_ptr()``), with no copy; CUDA tensors go by device pointer through
``sr_kernel_run_device`` to a kernel created for the GPU (the output is allocated on the same
GPU), so the data never leaves the card.

Gradients. Every reduction is a ``torch.autograd.Function`` (:class:`_Reduce`) holding a
compiled kernel. Its backward asks the C library for the gradient kernel of each input that
needs one (``sr_kernel_grad``, whose calling contract is in docs/gradients.md: the forward
arrays, then the incoming gradient, then the forward output or indices, then the
log-normalizer or the reduced index) and runs it through :class:`_Reduce` again. A gradient
kernel is an ordinary Sum kernel, so the backward is itself differentiable: with
``create_graph=True`` the second derivative asks for the gradient kernel of the gradient
kernel, and so on to any order. Parameter gradients come back as one partial sum per output
row and are summed here; gradients of the Arg reductions are zero (their indices do not move).

Under PyTorch 2.x the Functions take part in torch.func (grad, vjp, jacrev) and torch.vmap:
their vmap rule runs the vmapped dimension as batch dimensions, in one launch
(docs/torch.md). PyTorch 1.13 gets the same Functions in the older ctx style.

``import symred`` never imports torch; this module does, and raises ImportError without it.
"""

import ctypes
import os
import sys
import threading

try:
    import torch
except ImportError as e:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        "symred.torch needs PyTorch (Debian: apt-get install python3-torch); symred itself "
        "and symred.numpy work without it"
    ) from e

import numpy as np

from . import _generic
from . import _lib
from . import _torch_cluster as cluster
from . import _torch_utils as utils
from . import genred as _genred
from . import lazytensor as _lazy
from . import solve as _solve
from ._lib import (SR_BF16, SR_CAT_PARAM, SR_F16, SR_F32, SR_F64, KernelDesc, RunDesc, SolveDesc,
                   check, lib)

__all__ = ["Genred", "KernelSolve", "LazyTensor", "ComplexLazyTensor", "Vi", "Vj", "Pm", "cluster",
           "utils", "generic_sum", "generic_logsumexp", "generic_argmin", "generic_argkmin"]

# ``from symred.torch.cluster import ...``, ``.utils`` (pykeops' paths): this module is not a
# package.
# pykeops keeps KernelSolve in ``pykeops.torch.operations``: here, this module.
sys.modules[__name__ + ".cluster"] = cluster
sys.modules[__name__ + ".utils"] = utils
sys.modules[__name__ + ".operations"] = sys.modules[__name__]

_SR_DTYPES = {torch.float32: SR_F32, torch.float64: SR_F64, torch.float16: SR_F16,
              torch.bfloat16: SR_BF16}
_HALF = (torch.float16, torch.bfloat16)
_NP_TO_TORCH = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64,
                np.dtype(np.float16): torch.float16}
if _genred._ml_dtypes is not None:
    _NP_TO_TORCH[np.dtype(_genred._ml_dtypes.bfloat16)] = torch.bfloat16
_SELECTING = ("Min", "Max", "Min_ArgMin", "Max_ArgMax", "KMin", "KMin_ArgKMin")
_INDEX_ONLY = ("ArgMin", "ArgMax", "ArgKMin")
_WITH_INDICES = _INDEX_ONLY + ("Min_ArgMin", "Max_ArgMax", "KMin_ArgKMin")

# A Min, Max or KMin gradient needs the selected indices: the forward runs the reduction
# that returns both, and Genred hands back the values only.
_WITH_ARG = {"Min": "Min_ArgMin", "Max": "Max_ArgMax", "KMin": "KMin_ArgKMin"}


class _Kernel:
    """A compiled sr_kernel and what the autograd Functions need of it.

    ``owner`` is the Genred whose context holds the kernel: keeping it here keeps the context
    (and so the kernel) alive as long as an autograd graph refers to this object. Gradient
    kernels are created on demand, once per variable, in the same context and freed with it.
    """

    def __init__(self, owner, ptr, red, axis, desc, expr=None, derived=None):
        self.owner, self.ptr, self.red, self.axis = owner, ptr, red, axis
        self.desc = desc  # (sr dtype, sr device, accumulation) of the kernel
        self.expr = expr  # the forward formula, for SumSoftMaxWeight's log-normalizer
        # How this kernel comes from the owner's: None for the owner's own, else
        # (parent kernel, "grad", variable index), (parent kernel, "jvp", variable mask) or
        # (parent kernel, "lse", None).
        self.derived = derived
        self.nargs = lib.sr_kernel_nargs(ptr)
        self.out_dim = lib.sr_kernel_out_dim(ptr)
        self.vars = _lib.kernel_vars(ptr)
        self._derived = {}
        # False once sr_kernel_vjp declined the kernel (no fused backward for its form).
        self.fused_vjp = True

    def _new_derived(self, key, make):
        h = self.owner._h
        with h.lock, _omp_threads():  # the kernel is planned for the threads it finds
            k = self._derived.get(key)
            if k is None:
                k = make(h)
                self._derived[key] = k
            return k

    def grad(self, index):
        """The gradient kernel with respect to variable ``index`` (sr_kernel_grad)."""

        def make(h):
            out = ctypes.c_void_p()
            check(lib.sr_kernel_grad(self.ptr, index, ctypes.byref(out)), h.ctx,
                  f"gradient of {self.red} with respect to argument {index}")
            h.kernels[("grad", id(self), index)] = out
            cat = self.vars[index][0]
            reduced_cat = _lib.SR_CAT_J if self.axis == 1 else _lib.SR_CAT_I
            axis = 1 - self.axis if cat == reduced_cat else self.axis
            return _Kernel(self.owner, out, "Sum", axis, self.desc, derived=(self, "grad", index))

        return self._new_derived(("grad", index), make)

    def jvp(self, mask):
        """The tangent kernel along the variables of the bit mask ``mask`` (sr_kernel_jvp):
        reads the forward arrays, then one tangent per forward index, then the forward
        output and the auxiliary array of docs/gradients.md; same axis."""

        def make(h):
            out = ctypes.c_void_p()
            check(lib.sr_kernel_jvp(self.ptr, mask, ctypes.byref(out)), h.ctx,
                  f"forward-mode derivative of {self.red}")
            h.kernels[("jvp", id(self), mask)] = out
            return _Kernel(self.owner, out, "Sum", self.axis, self.desc,
                           derived=(self, "jvp", mask))

        return self._new_derived(("jvp", mask), make)

    def logsumexp(self):
        """The LogSumExp kernel of the same formula and axis: SumSoftMaxWeight's
        log-normalizer, which its gradient kernel reads."""

        def make(h):
            dtype, device, acc = self.desc
            desc = KernelDesc(reduction=_genred.REDUCTIONS.index("LogSumExp"), axis=self.axis,
                              k=1, dtype=dtype, device=device, weight=None, acc=acc)
            out = ctypes.c_void_p()
            check(lib.sr_kernel_new(h.ctx, self.expr, ctypes.byref(desc), ctypes.byref(out)),
                  h.ctx, "the log-normalizer of SumSoftMaxWeight")
            h.kernels[("lse", id(self))] = out
            return _Kernel(self.owner, out, "LogSumExp", self.axis, self.desc,
                           derived=(self, "lse", None))

        return self._new_derived(("lse",), make)

    def float32(self):
        """The float32 kernel of the same reduction (for a kernel of the owner's own)."""
        return self.owner._torch_kernel(SR_F32, self.desc[1])

    def promoted(self, indices):
        """The same kernel with the parameters of the given indices read as variables of the
        owner's output index: the owner Genred's promoted copy (batched parameters, one value
        per batch, see symred.Genred), then the same gradient / log-normalizer steps. A
        gradient with respect to a parameter is one partial sum per output row either way,
        so the promoted kernel's outputs have the same shape. ValueError when the owner
        cannot promote them (a parameter written as Var() in the formula)."""
        if self.derived is None:
            return self.owner._promoted(indices)._torch_kernel(*self.desc[:2])
        parent, op, index = self.derived
        if op == "jvp":  # a tangent's index n + v is promoted with its variable v
            parent = parent.promoted(tuple(sorted({i % parent.nargs for i in indices})))
            return parent.jvp(index)
        parent = parent.promoted(indices)
        return parent.grad(index) if op == "grad" else parent.logsumexp()

    def promotion(self, indices):
        """The parameters to promote together with those of ``indices`` (see promoted): in a
        tangent kernel, a parameter and its tangent become variables together, the one
        batched and the other repeated per batch."""
        if self.derived is None:
            return tuple(sorted(indices))
        parent, op, _ = self.derived
        if op != "jvp":
            return tuple(i for i in parent.promotion(indices) if i in self.vars)
        n = parent.nargs
        base = parent.promotion(tuple(sorted({i % n for i in indices})))
        both = set(base) | {n + i for i in base}
        return tuple(sorted(i for i in both if i in self.vars))


def _load_gomp():
    """libgomp, which libsymred's CPU kernels (and Debian's torch) use: the same loaded copy."""
    try:
        gomp = ctypes.CDLL("libgomp.so.1")
        gomp.omp_get_max_threads.restype = ctypes.c_int
        gomp.omp_set_num_threads.argtypes = [ctypes.c_int]
        return gomp
    except (OSError, AttributeError):
        return None


_gomp = _load_gomp()


def _wanted_threads():
    env = os.environ.get("SYMRED_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


_THREADS = _wanted_threads()


class _omp_threads:
    """Creates or runs a kernel with symred's thread count. torch calls omp_set_num_threads()
    with its own intra-op count (1 on our 2-core VMs), and symred plans its kernels and sizes
    its OpenMP teams from omp_get_max_threads(): without this, importing torch halved
    symred's speed here. The setting is per calling thread in libgomp, and is restored
    afterwards."""

    def __enter__(self):
        self.saved = _gomp.omp_get_max_threads() if _gomp is not None else None
        if self.saved is not None and self.saved < _THREADS:
            _gomp.omp_set_num_threads(_THREADS)
        return self

    def __exit__(self, *exc):
        if self.saved is not None and self.saved < _THREADS:
            _gomp.omp_set_num_threads(self.saved)


def _pointer(t):
    return t.data_ptr() if t is not None else None


def _run(kern, nx, ny, ranges, args):
    """Runs the kernel on tensors (None for an unused index) with block-sparse ranges (None,
    or the (struct, arrays) of _genred._ranges_struct); returns (values, indices)."""
    # The kernel reads row-major arrays: a view (an expanded parameter under torch.vmap, a
    # tangent) is copied; a contiguous tensor goes as it is.
    args = [a.contiguous() if a is not None else None for a in args[: kern.nargs]]
    args += [None] * max(0, kern.nargs - len(args))
    first = next((a for a in args if a is not None), None)
    device = first.device if first is not None else torch.device("cpu")
    dtype = first.dtype if first is not None else torch.float32
    nout = nx if kern.axis == 1 else ny
    values = idx = None
    if kern.red not in _INDEX_ONLY:
        values = torch.empty((nout, kern.out_dim), dtype=dtype, device=device)
    if kern.red in _WITH_INDICES:
        idx = torch.empty((nout, kern.out_dim), dtype=torch.int64, device=device)
    if device.type == "cuda" and (ranges is not None or dtype in _HALF):
        return _run_ranges_via_host(kern, nx, ny, ranges, args, values, idx)
    ptrs = (ctypes.c_void_p * max(1, kern.nargs))(*[_pointer(a) for a in args])
    run = RunDesc(nx=nx, ny=ny, nargs=kern.nargs, args=ptrs, out=_pointer(values),
                  out_idx=_pointer(idx))
    if device.type == "cuda":
        # symred launches on its own stream of the primary context, which torch shares: the
        # inputs must be written before it reads them.
        torch.cuda.current_stream(device).synchronize()
        mask = 0
        for v, a in enumerate(args[:64]):
            if a is not None:
                mask |= 1 << v
        st = lib.sr_kernel_run_device(kern.ptr, ctypes.byref(run), mask, 1)
    else:
        with _omp_threads():
            if ranges is None:
                st = lib.sr_kernel_run_ex(kern.ptr, ctypes.byref(run))
            else:
                st = lib.sr_kernel_run_ranges(kern.ptr, ctypes.byref(run),
                                              ctypes.byref(ranges[0]))
    check(st, kern.owner._h.ctx)
    return values, idx


def _run_ranges_via_host(kern, nx, ny, ranges, args, values, idx):
    """CUDA tensors with block-sparse ranges (or None), or of a 16-bit dtype.
    sr_kernel_run_device (device pointers) has no ranges variant and takes float32 and float64
    only, but sr_kernel_run_ranges runs a CUDA kernel on host arrays (the library
    copies them to the GPU and the results back): the tensors go through host copies, and the
    results are copied into the GPU outputs ``values`` / ``idx``. Correct but not zero-copy
    (docs/torch.md); never run on a GPU by its author."""
    host = [a.detach().cpu() if a is not None else None for a in args]  # waits for the GPU
    hv = torch.empty(values.shape, dtype=values.dtype) if values is not None else None
    hi = torch.empty(idx.shape, dtype=idx.dtype) if idx is not None else None
    ptrs = (ctypes.c_void_p * max(1, kern.nargs))(*[_pointer(a) for a in host])
    run = RunDesc(nx=nx, ny=ny, nargs=kern.nargs, args=ptrs, out=_pointer(hv),
                  out_idx=_pointer(hi))
    rg = ctypes.byref(ranges[0]) if ranges is not None else None
    st = lib.sr_kernel_run_ranges(kern.ptr, ctypes.byref(run), rg)
    check(st, kern.owner._h.ctx)
    if values is not None:
        values.copy_(hv)
    if idx is not None:
        idx.copy_(hi)
    return values, idx


# PyTorch 2.x's torch.func transforms (grad, vjp, jacrev, vmap, ...) accept an autograd
# Function whose forward takes no ctx, with a separate setup_context, and a vmap rule;
# PyTorch 1.13 has neither and calls forward(ctx, ...).
_FUNC_STYLE = hasattr(torch.autograd.Function, "setup_context")


def _autograd_function(name, doc, forward, setup_context, backward, vmap=None, jvp=None):
    """A torch.autograd.Function from its parts: PyTorch 2.x style (forward without ctx,
    setup_context, and ``vmap`` as the vmap rule when given) where torch has it, so that
    torch.func and torch.vmap take it; else forward(ctx, ...) doing both steps. ``jvp``,
    when given, is the forward-mode rule (torch.func.jvp, jacfwd, torch.autograd.forward_ad)."""
    body = {"__doc__": doc, "backward": staticmethod(backward)}
    if jvp is not None:
        body["jvp"] = staticmethod(jvp)
    if _FUNC_STYLE:
        body.update(forward=staticmethod(forward), setup_context=staticmethod(setup_context),
                    generate_vmap_rule=False)
        if vmap is not None:
            body["vmap"] = staticmethod(vmap)
    else:
        def forward_with_ctx(ctx, *inputs):
            output = forward(*inputs)
            setup_context(ctx, inputs, output)
            return output

        body["forward"] = staticmethod(forward_with_ctx)
    return type(name, (torch.autograd.Function,), body)


def _fused_applies(kern, ranges, values):
    """Whether sr_kernel_vjp / sr_kernel_run_lse may take this call (they decline the rest)."""
    return (kern.red == "SumSoftMaxWeight" and kern.fused_vjp
            and values.device.type == "cpu" and values.dtype in (torch.float32, torch.float64))


def _run_lse(kern, nx, ny, ranges, args):
    """The forward of attention with its log-normalizer (sr_kernel_run_lse, or _ranges with
    block-sparse ranges), for the fused backward: (values, lse), or None where the library
    declines (then the kernel runs)."""
    args = [a.contiguous() if a is not None else None for a in args[: kern.nargs]]
    args += [None] * max(0, kern.nargs - len(args))
    first = next(a for a in args if a is not None)
    nout = nx if kern.axis == 1 else ny
    values = torch.empty((nout, kern.out_dim), dtype=first.dtype)
    lse = torch.empty((nout,), dtype=first.dtype)
    ptrs = (ctypes.c_void_p * max(1, kern.nargs))(*[_pointer(a) for a in args])
    run = RunDesc(nx=nx, ny=ny, nargs=kern.nargs, args=ptrs, out=_pointer(values), out_idx=None)
    with _omp_threads():
        if ranges is None:
            st = lib.sr_kernel_run_lse(kern.ptr, ctypes.byref(run), _pointer(lse))
        else:
            st = lib.sr_kernel_run_lse_ranges(kern.ptr, ctypes.byref(run),
                                              ctypes.byref(ranges[0]), _pointer(lse))
    if st in (_lib.SR_ENOTSUP, _lib.SR_EBUDGET):
        if st == _lib.SR_ENOTSUP:
            kern.fused_vjp = False
        return None
    check(st, kern.owner._h.ctx)
    return values, lse


def _reduce_forward(kern, nx, ny, ranges, *args):
    first = next((a for a in args if a is not None), None)
    if (first is not None and _fused_applies(kern, ranges, first)
            and any(a is not None and a.requires_grad for a in args)):
        # A gradient may follow: the forward keeps its log-normalizer for the fused backward,
        # handed to setup_context on the output (and removed from it there).
        res = _run_lse(kern, nx, ny, ranges, args)
        if res is not None:
            res[0]._symred_lse = res[1]
            return res[0]
    values, idx = _run(kern, nx, ny, ranges, args)
    if kern.red in _INDEX_ONLY:
        return idx
    return (values, idx) if idx is not None else values


def _reduce_setup(ctx, inputs, output):
    kern, nx, ny, ranges, *args = inputs
    if kern.red in _INDEX_ONLY:
        values, idx = None, output
    elif isinstance(output, tuple):
        values, idx = output
    else:
        values, idx = output, None
    ctx.kern, ctx.nx, ctx.ny, ctx.ranges = kern, nx, ny, ranges
    ctx.lse = getattr(values, "_symred_lse", None)  # from _reduce_forward, or None
    if ctx.lse is not None:
        del values._symred_lse
    ctx.save_for_backward(values, idx, *args)
    ctx.save_for_forward(values, idx, *args)
    if idx is not None:
        ctx.mark_non_differentiable(idx)


def _selection(kern, nx, ny, values, idx):
    """What the gradient and tangent kernels of Min, Max and KMin read after the forward
    arrays (docs/gradients.md): the selected indices as values, and the reduced index."""
    reduced = ny if kern.axis == 1 else nx
    return [idx.to(values.dtype),
            torch.arange(reduced, dtype=values.dtype, device=values.device)[:, None]]


def _reduce_backward(ctx, *grads):
    # The gradient kernels run on the same block pattern: sr_kernel_run_ranges reads the
    # triple of each kernel's axis (a Vj gradient reduces over i: the transposed one).
    kern, nx, ny, ranges = ctx.kern, ctx.nx, ctx.ny, ctx.ranges
    values, idx, *args = ctx.saved_tensors
    none = [None] * (4 + len(args))
    G = grads[0]
    if kern.red in _INDEX_ONLY or G is None:
        return tuple(none)  # indices do not move with the inputs
    n = kern.nargs
    fwd = list(args[:n]) + [None] * max(0, n - len(args))
    extra = [G.contiguous()]
    if kern.red == "LogSumExp":
        extra.append(values)
    elif kern.red == "SumSoftMaxWeight":
        fused = _fused_vjp(kern, nx, ny, ranges, fwd, G, values, ctx.lse, args,
                           ctx.needs_input_grad[4:])
        if fused is not None:
            return tuple(none[:4] + fused)
        lse = kern.logsumexp()
        extra += [values, _Reduce.apply(lse, nx, ny, ranges, *fwd[: lse.nargs])]
    elif kern.red in _SELECTING:
        if values.dtype in _HALF:
            # float16 counts indices exactly up to 2048 and bfloat16 up to 256: the gradient
            # kernel, which compares indices, runs in float32 on the widened values
            k32 = kern.float32()
            f32 = [a.float() if a is not None else None for a in fwd]
            ex = [G.float()] + _selection(k32, nx, ny, values.float(), idx)
            grads = _input_grads(k32, nx, ny, ranges, f32, ex, args, ctx.needs_input_grad[4:])
            grads = [g.to(a.dtype) if g is not None else None for g, a in zip(grads, args)]
            return tuple(none[:4] + grads)
        extra += _selection(kern, nx, ny, values, idx)
    grads = _input_grads(kern, nx, ny, ranges, fwd, extra, args, ctx.needs_input_grad[4:])
    return tuple(none[:4] + grads)


def _fused_vjp(kern, nx, ny, ranges, fwd, G, values, lse, args, needed):
    """The gradients by sr_kernel_vjp, the fused backward (attention, docs/gradients.md), or
    None where it does not apply: CUDA or 16-bit tensors, a backward that
    must itself be differentiable (create_graph: the gradient kernels run through _Reduce), or
    a kernel that sr_kernel_vjp declines (remembered). ``lse``: the forward's log-normalizer
    when it kept one (sr_kernel_run_lse), else None and sr_kernel_vjp forms it."""
    if torch.is_grad_enabled() or not _fused_applies(kern, ranges, values):
        return None
    rows = {_lib.SR_CAT_I: nx, _lib.SR_CAT_J: ny, SR_CAT_PARAM: 1}
    out = [None] * len(args)
    for i, a in enumerate(args):
        if a is not None and needed[i] and i in kern.vars:
            cat, dim = kern.vars[i]
            out[i] = torch.empty((rows[cat], dim), dtype=values.dtype)
    if all(o is None for o in out):
        return out
    fwd = [a.contiguous() if a is not None else None for a in fwd]
    G = G.contiguous()  # out.sum()'s gradient is an expanded view
    n = kern.nargs
    ptrs = (ctypes.c_void_p * max(1, n))(*[_pointer(a) for a in fwd])
    gptrs = (ctypes.c_void_p * max(1, n))(*[_pointer(o) for o in out[:n]])
    run = RunDesc(nx=nx, ny=ny, nargs=n, args=ptrs, out=None, out_idx=None)
    with _omp_threads():
        if ranges is None:
            st = lib.sr_kernel_vjp(kern.ptr, ctypes.byref(run), _pointer(G), _pointer(values),
                                   _pointer(lse), gptrs)
        else:
            st = lib.sr_kernel_vjp_ranges(kern.ptr, ctypes.byref(run), ctypes.byref(ranges[0]),
                                          _pointer(G), _pointer(values), _pointer(lse), gptrs)
    if st in (_lib.SR_ENOTSUP, _lib.SR_EBUDGET):
        if st == _lib.SR_ENOTSUP:
            kern.fused_vjp = False
        return None
    check(st, kern.owner._h.ctx)
    return [o.reshape(a.shape) if o is not None else None for o, a in zip(out, args)]


def _reduce_jvp(ctx, *tangents):
    """Forward mode: the tangent of the values along the inputs' tangents, the tangent
    kernel (sr_kernel_jvp) of the variables that have one, run through :class:`_Reduce` (so
    that it is differentiable in turn: hessian = jacfwd(jacrev)). Indices have no tangent."""
    kern, nx, ny, ranges = ctx.kern, ctx.nx, ctx.ny, ctx.ranges
    values, idx, *args = ctx.saved_tensors
    if kern.red in _INDEX_ONLY:
        return None
    n = kern.nargs
    fwd = list(args[:n]) + [None] * max(0, n - len(args))
    dargs = [None] * n
    mask = 0
    for i, t in enumerate(tangents[4:4 + n]):
        if t is not None and args[i] is not None and i in kern.vars:
            dargs[i] = t.reshape(args[i].shape).contiguous()
            mask |= 1 << i
    if mask == 0:
        dv = torch.zeros_like(values)
    else:
        extra = [None, None]  # the forward output and the auxiliary array
        if kern.red in ("LogSumExp", "SumSoftMaxWeight"):
            extra[0] = values
        if kern.red == "SumSoftMaxWeight":
            lse = kern.logsumexp()
            extra[1] = _Reduce.apply(lse, nx, ny, ranges, *fwd[: lse.nargs])
        elif kern.red in _SELECTING:
            extra = _selection(kern, nx, ny, values, idx)
        jk = kern.jvp(mask)
        dv = _Reduce.apply(jk, nx, ny, ranges, *(fwd + dargs + extra)[: jk.nargs])
    return (dv, None) if idx is not None else dv


def _reduce_vmap(info, in_dims, kern, nx, ny, ranges, *args):
    """torch.vmap's rule: the vmapped dimension becomes B batches laid end to end in one
    launch, as symred.Genred runs leading batch dimensions. Batched variables are flattened
    to (B * n, d); unbatched ones on the output side are repeated B times; the reduced side
    is shared by all batches (one copy, N rows) when none of its variables is batched and
    there are no block-sparse ranges, else repeated too; block-diagonal ranges (or the
    given ranges offset into each batch) keep each batch's rows to its own. Batched
    parameters (one value per batch) make the kernel read them as variables of the output
    index (:meth:`_Kernel.promoted`). Selected indices come back in each batch's own row
    numbers."""
    B = info.batch_size
    dims = in_dims[4:]
    args = [a.movedim(d, 0) if d is not None else a for a, d in zip(args, dims)]
    batched = [d is not None for d in dims]
    promote = tuple(i for i, b in enumerate(batched)
                    if b and kern.vars.get(i, (None,))[0] == SR_CAT_PARAM)
    if promote:
        promote = kern.promotion(promote)
        for i in promote:  # promoted with a batched one: the same value for every batch
            if not batched[i]:
                args[i] = args[i].expand(B, *args[i].shape)
                batched[i] = True
    k = kern.promoted(promote) if promote else kern
    rows = {_lib.SR_CAT_I: nx, _lib.SR_CAT_J: ny}
    out_cat = _lib.SR_CAT_I if kern.axis == 1 else _lib.SR_CAT_J
    red_cat = _lib.SR_CAT_J if kern.axis == 1 else _lib.SR_CAT_I
    shared = ranges is None and not any(
        b and k.vars.get(i, (None,))[0] == red_cat for i, b in enumerate(batched))
    flat = []
    for i, (a, b) in enumerate(zip(args, batched)):
        cat = k.vars.get(i, (None,))[0]
        if cat is None or cat == SR_CAT_PARAM:  # unread, or an unbatched parameter
            flat.append(a[0] if b else a)
            continue
        if b and i in promote:  # (B, d) -> one row per output row of each batch
            a = a[:, None, :]
        if not b and (cat == out_cat or not shared):
            a = a[None]
        elif not b:
            flat.append(a)  # the shared reduced side
            continue
        a = a.expand(B, rows[cat], a.shape[-1])
        flat.append(a.reshape(B * rows[cat], a.shape[-1]))
    M, N = rows[out_cat], rows[red_cat]
    if ranges is None:
        raw = _genred._block_diagonal_ranges(B, M, N, shared, kern.axis)
    else:
        raw = _genred._batch_ranges(tuple(ranges[1]), np.asarray, (B,), nx, ny)
    rg = _genred._ranges_struct(raw, np.asarray)
    bnx = B * nx if kern.axis == 1 or not shared else nx
    bny = B * ny if kern.axis == 0 or not shared else ny
    res = _Reduce.apply(k, bnx, bny, rg, *flat)

    def unflatten(o, indices):
        if indices and not shared:  # global reduced rows back to each batch's own
            offs = (torch.arange(B * M, device=o.device) // M * N)[:, None]
            o = o - offs * (o >= 0)
        return o.reshape((B, M) + tuple(o.shape[1:]))

    if kern.red in _INDEX_ONLY:
        return unflatten(res, True), 0
    if isinstance(res, tuple):
        return (unflatten(res[0], False), unflatten(res[1], True)), (0, 0)
    return unflatten(res, False), 0


_Reduce = _autograd_function(
    "_Reduce",
    """One reduction, called as ``_Reduce.apply(kernel, nx, ny, ranges, *tensors)``: forward
    runs the kernel; backward runs its gradient kernels through this same Function, so that
    the backward is differentiable too; under torch.vmap the batch runs as one launch.""",
    _reduce_forward, _reduce_setup, _reduce_backward, _reduce_vmap, _reduce_jvp)


def _input_grads(kern, nx, ny, ranges, fwd, extra, args, needed):
    """The gradients of a reduction with respect to its inputs ``args`` (None where not
    ``needed``, and for an input the formula does not read: a zero gradient): each one its
    gradient kernel (sr_kernel_grad) run on ``fwd + extra`` through :class:`_Reduce`, so that
    it is differentiable in turn. ``extra`` is the incoming gradient and what the reduction's
    contract adds after it (docs/gradients.md)."""
    out = [None] * len(args)
    for i, a in enumerate(args):
        if a is None or not needed[i] or i not in kern.vars:
            continue
        gk = kern.grad(i)
        gargs = (list(fwd) + list(extra))[: gk.nargs]
        g = _Reduce.apply(gk, nx, ny, ranges, *gargs)
        if kern.vars[i][0] == SR_CAT_PARAM:
            g = g.sum(0)  # one partial gradient per output row
        out[i] = g.reshape(a.shape)
    return out


class Genred(_genred.Genred):
    """``pykeops.torch.Genred``: the same arguments as :class:`symred.Genred`, called on torch
    tensors (all float32, float64, float16 or bfloat16, on one device), returning torch
    tensors of that dtype that autograd differentiates to any order. float16 and bfloat16
    are computed in float32 and rounded to the dtype (docs/semantics.md).

    ``backend``: ``"auto"`` (CUDA tensors run on their GPU, CPU tensors as symred.Genred's
    ``"auto"``), ``"CPU"``, ``"GPU"`` (CUDA tensors only), ``"reference"`` (CPU tensors).
    Indices (ArgMin, ...) are int64 tensors, as in symred.Genred.
    """

    _ARRAY_NAME = "torch tensor"

    @staticmethod
    def _is_array(a):
        return isinstance(a, torch.Tensor)

    @staticmethod
    def _array_dtype(a):
        return a.dtype if a.dtype in _SR_DTYPES else None

    @staticmethod
    def _array_dtype_of_option(dt):
        return _NP_TO_TORCH[np.dtype(dt)]

    @staticmethod
    def _dtype_name(dt):
        return str(dt).replace("torch.", "")

    @staticmethod
    def _from_numbers(a, dt):
        return torch.tensor(a, dtype=dt)

    @staticmethod
    def _contiguous(a, dt):
        return a.contiguous()  # the same tensor, no copy, when it already is contiguous

    @staticmethod
    def _cast(a, dt):
        return a.to(dt)  # differentiable: the gradient comes back in the parameter's dtype

    @staticmethod
    def _expand(a, shape):
        return a.expand(*shape)

    @staticmethod
    def _like(values, a):
        return torch.as_tensor(values, device=a.device)

    @staticmethod
    def _ranges_array(a):
        if not isinstance(a, torch.Tensor):
            return np.asarray(a)
        # Through tolist(): under torch.func.jvp, .numpy() refuses even a plain tensor
        # ("doesn't have storage"). Ranges are small integer arrays.
        dt = np.float64 if a.is_floating_point() else np.int64  # floats: refused by the caller
        return np.asarray(a.tolist(), dtype=dt).reshape(tuple(a.shape))

    @staticmethod
    def _sr_dtype(dt):
        return _SR_DTYPES[dt]

    @staticmethod
    def _data_ptr(a):
        if a.device.type != "cpu":
            raise ValueError("eval_block runs on the CPU: move the tensors with .cpu()")
        return a.data_ptr()

    @staticmethod
    def _block_out(out, shape, dt):
        if out is None:
            return torch.empty(shape, dtype=dt)
        if (not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or out.dtype != dt
                or out.device.type != "cpu" or not out.is_contiguous()):
            raise ValueError(f"out must be a contiguous {str(dt).replace('torch.', '')} CPU "
                             f"tensor of shape {shape}")
        return out

    @staticmethod
    def _log(a):
        return torch.log(a)

    @staticmethod
    def _constant(a):
        return a.detach()

    @staticmethod
    def _copy_into(out, res):
        return out.copy_(res)

    def eval_block(self, *args, rows, cols, out=None):
        """:meth:`symred.Genred.eval_block` on CPU tensors (not differentiated), with symred's
        thread count as this module's reductions (see :class:`_omp_threads`)."""
        with _omp_threads():
            return super().eval_block(*args, rows=rows, cols=cols, out=out)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._torch_kernels = {}
        self._torch_lock = threading.Lock()

    def _torch_kernel(self, sr_dtype, device):
        with self._torch_lock:
            tk = self._torch_kernels.get((sr_dtype, device))
            if tk is None:
                red = _WITH_ARG.get(self.reduction_op, self.reduction_op)
                with self._h.lock, _omp_threads():  # planned for the threads it finds
                    ptr = self._kernel(sr_dtype, device, _genred.REDUCTIONS.index(red))
                tk = _Kernel(self, ptr, red, self.axis, (sr_dtype, device, self._acc),
                             self._expr)
                self._torch_kernels[(sr_dtype, device)] = tk
            return tk

    def __call__(self, *args, backend="auto", device_id=-1, ranges=None, out=None):
        """Runs the reduction on tensors given in alias-index order."""
        device = self._device(backend)
        if self._needs_extended_call(out):
            return self._extended_call(args, out, backend=backend, device_id=device_id,
                                       ranges=ranges)
        full = self._batch_shape(args)
        if full is not None:  # batch dimensions: flattened by differentiable torch ops
            return self._call_batched(args, full, backend, device_id, ranges)
        rg = _genred._ranges_struct(ranges, self._ranges_array) if ranges is not None else None
        tensors, dt, nx, ny = self._prepare(args)
        # A parameter given as numbers (or on the CPU) follows the variables to their GPU.
        data_devices = {a.device for i, a in enumerate(tensors)
                        if a is not None and self._args[i].cat != SR_CAT_PARAM}
        if len(data_devices) == 1 and next(iter(data_devices)).type == "cuda":
            dev = next(iter(data_devices))
            tensors = [a.to(dev) if a is not None and a.device.type == "cpu"
                       and self._args[i].cat == SR_CAT_PARAM else a
                       for i, a in enumerate(tensors)]
        devices = {a.device for a in tensors if a is not None}
        if len(devices) > 1:
            raise ValueError(f"all tensors must be on one device, got "
                             f"{', '.join(sorted(map(str, devices)))}")
        on_gpu = bool(devices) and next(iter(devices)).type == "cuda"
        if on_gpu:
            if device not in (_lib.SR_DEVICE_AUTO, _lib.SR_DEVICE_CUDA):
                raise ValueError(f"backend={backend!r} runs on the CPU; these tensors are on "
                                 f"{next(iter(devices))}: move them with .cpu() or use "
                                 f"backend='GPU'")
            device = _lib.SR_DEVICE_CUDA
            gpu = int(os.environ.get("SYMRED_CUDA_DEVICE", "0") or 0)
            index = next(iter(devices)).index or 0
            if index != gpu:
                raise ValueError(f"these tensors are on cuda:{index} but symred runs on GPU "
                                 f"{gpu} (SYMRED_CUDA_DEVICE, read when the library first "
                                 f"uses CUDA); move them, or set SYMRED_CUDA_DEVICE={index}")
        elif devices and next(iter(devices)).type != "cpu":
            raise ValueError(f"tensors on {next(iter(devices))} are not supported; use CPU or "
                             f"CUDA tensors")
        elif device == _lib.SR_DEVICE_CUDA:
            raise ValueError("backend='GPU' needs CUDA tensors; move them with .cuda()")
        self._check_acc(dt)
        tk = self._torch_kernel(_SR_DTYPES[dt], device)
        res = _Reduce.apply(tk, nx, ny, rg, *tensors)
        nout = nx if self.axis == 1 else ny
        if self.reduction_op in _INDEX_ONLY:
            return self._shape_output(None, res, nout)
        if self.reduction_op in _WITH_ARG:
            return self._shape_output(res[0], None, nout)
        if isinstance(res, tuple):
            return self._shape_output(res[0], res[1], nout)
        return self._shape_output(res, None, nout)


def _run_solve(kern, opts, bpos, args):
    """a with (alpha I + K) a = args[bpos], by the C conjugate gradients (sr_kernel_solve) on
    CPU tensors; ``opts`` = (alpha, eps, max_iter, check_symmetry)."""
    alpha, eps, max_iter, check_symmetry = opts
    rhs = args[bpos].contiguous()
    out = torch.empty_like(rhs)
    args = list(args[: kern.nargs]) + [None] * max(0, kern.nargs - len(args))
    ptrs = (ctypes.c_void_p * max(1, kern.nargs))(
        *[_pointer(a) if i != bpos else None for i, a in enumerate(args)])
    desc = SolveDesc(b_index=bpos, alpha=alpha, eps=eps, max_iter=max_iter,
                     check_symmetry=1 if check_symmetry else 0)
    with _omp_threads():
        st = lib.sr_kernel_solve(kern.ptr, ctypes.byref(desc), rhs.shape[0], ptrs,
                                 rhs.data_ptr(), out.data_ptr())
    check(st, kern.owner._h.ctx)
    return out


def _solve_forward(kern, opts, bpos, *args):
    return _run_solve(kern, opts, bpos, args)


def _solve_setup(ctx, inputs, a):
    kern, opts, bpos, *args = inputs
    ctx.kern, ctx.opts, ctx.bpos = kern, opts, bpos
    ctx.save_for_backward(a, *args)
    ctx.save_for_forward(a, *args)


def _solve_jvp(ctx, *tangents):
    """Forward mode: (alpha I + K) a = b gives (alpha I + K) da = db - dK a, with dK a the
    tangent of the Sum reduction F(x_i, y_j) a_j along the tangents of x, y and the
    parameters (the tangent kernel, sr_kernel_jvp, with b's slot holding a): one more solve."""
    kern, opts, bpos = ctx.kern, ctx.opts, ctx.bpos
    a, *args = ctx.saved_tensors
    dargs = list(tangents[3:])
    n = kern.nargs
    rhs = dargs[bpos].reshape(a.shape) if dargs[bpos] is not None else torch.zeros_like(a)
    tang, mask = [None] * n, 0
    for i, t in enumerate(dargs[:n]):
        if i != bpos and t is not None and args[i] is not None and i in kern.vars:
            tang[i] = t.reshape(args[i].shape)
            mask |= 1 << i
    if mask:
        fwd = list(args[:n]) + [None] * max(0, n - len(args))
        fwd[bpos] = a
        jk = kern.jvp(mask)
        rhs = rhs - _Reduce.apply(jk, a.shape[0], a.shape[0], None, *(fwd + tang)[: jk.nargs])
    rhs_args = list(args)
    rhs_args[bpos] = rhs.contiguous()
    return _Solve.apply(kern, opts[:3] + (False,), bpos, *rhs_args)


def _solve_backward(ctx, grad_a):
    kern, opts, bpos = ctx.kern, ctx.opts, ctx.bpos
    a, *args = ctx.saved_tensors
    needed = list(ctx.needs_input_grad[3:])
    out = [None] * (3 + len(args))
    if grad_a is None or not any(needed):
        return tuple(out)
    # The backward solve skips the symmetry test: the forward's passed on the same data.
    back_opts = opts[:3] + (False,)
    rhs = list(args)
    rhs[bpos] = grad_a.contiguous()
    g = _Solve.apply(kern, back_opts, bpos, *rhs)
    if needed[bpos]:
        out[3 + bpos] = g
    needed[bpos] = False
    if any(needed):
        fwd = list(args[: kern.nargs]) + [None] * max(0, kern.nargs - len(args))
        fwd[bpos] = a
        n = a.shape[0]
        out[3:] = [o if o is not None else h for o, h in zip(
            out[3:], _input_grads(kern, n, n, None, fwd, [-g], args, needed))]
    return tuple(out)


_Solve = _autograd_function(
    "_Solve",
    """a = (alpha I + K)^-1 b. The operator is symmetric, so dL/db = (alpha I + K)^-1 dL/da,
    another solve (through this Function: differentiable); and for any other input t of K
    (x, y, a parameter), dL/dt = -d/dt <g, K a> with g = dL/db and a held fixed: the
    gradient of the Sum reduction F(x_i, y_j) a_j with incoming gradient -g, run by the
    gradient kernels of :class:`_Reduce` (pykeops does the same with Grad formulas). Forward
    mode: another solve of db - dK a (dK a by the tangent kernel). It has no vmap rule:
    torch.vmap refuses it (and so jacfwd).""",
    _solve_forward, _solve_setup, _solve_backward, jvp=_solve_jvp)


class KernelSolve(Genred, _solve.KernelSolve):
    """``pykeops.torch.KernelSolve``: the arguments of :class:`symred.KernelSolve` (formula
    ``F(x, y) * b`` linear in the variable ``varinvalias``, axis, dtype, accuracy options),
    called on torch tensors; returns ``a`` with ``(alpha I + K) a = b``, differentiable with
    respect to b and to the kernel's tensors (x, y, parameters). CPU tensors only.
    docs/solve.md."""

    def __call__(self, *args, backend="auto", device_id=-1, alpha=1e-10, eps=1e-6,
                 ranges=None, max_iter=0, check_symmetry=True):
        """As :meth:`symred.KernelSolve.__call__` (pykeops' defaults alpha = 1e-10,
        eps = 1e-6; ``max_iter`` 0 is 10 size(b) + 10; no convergence raises a
        SymredRuntimeError with status_name ``ENOCONV``), on torch tensors."""
        device = self._device(backend)
        if device == _lib.SR_DEVICE_CUDA:
            raise ValueError("KernelSolve: symred.torch solves on CPU tensors only "
                             "(backend='GPU' is not supported)")
        self._solve_checks(args, ranges)
        tensors, dt, nx, ny = self._prepare(args)
        gpu = [a for a in tensors if a is not None and a.device.type != "cpu"]
        if gpu:
            raise ValueError(f"KernelSolve: symred.torch solves on CPU tensors only; got a "
                             f"tensor on {gpu[0].device}: move them with .cpu()")
        if nx != ny:
            raise ValueError(f"KernelSolve: K must be square, but the i-variables have {nx} "
                             f"rows and the j-variables {ny}")
        self._check_acc(dt)
        kern = self._torch_kernel(_SR_DTYPES[dt], device)
        opts = (_genred._float_arg("alpha", alpha), _genred._float_arg("eps", eps),
                _genred._int_arg("max_iter", max_iter, 0, _genred._INT32_MAX),
                bool(check_symmetry))
        return _Solve.apply(kern, opts, self.varinvpos, *tensors)


class LazyTensor(_lazy.LazyTensor):
    """``pykeops.torch.LazyTensor``: symbolic tensors over torch tensors (shapes, operations
    and reductions as :class:`symred.LazyTensor`); reductions return torch tensors and are
    differentiable through :class:`Genred`."""

    _ARRAY_TYPE = torch.Tensor
    _ARRAY_NAME = "torch tensor"
    _GENRED = Genred
    _KERNELSOLVE = KernelSolve

    @staticmethod
    def _normalize_array(x):
        if x.dtype not in _SR_DTYPES:
            raise TypeError(f"LazyTensor(tensor of shape {tuple(x.shape)}): dtype "
                            f"{str(x.dtype).replace('torch.', '')} is not supported; use "
                            f"float32, float64, float16 or bfloat16")
        return x

    @staticmethod
    def _dtype_name(dt):
        return str(dt).replace("torch.", "")

    @staticmethod
    def _param_array(values, dt):
        return torch.tensor(values, dtype=dt if dt is not None else torch.float32)

    @staticmethod
    def _array_is_complex(x):
        return x.is_complex()


class ComplexLazyTensor(_lazy.ComplexLazyTensor, LazyTensor):
    """``pykeops.torch.ComplexLazyTensor``: a symbolic complex tensor (see
    :class:`symred.ComplexLazyTensor`), made by :class:`LazyTensor` from complex64 / complex128
    tensors; reductions return complex tensors, differentiable with respect to the real and
    imaginary parts of the inputs."""

    @staticmethod
    def _view_real(x):
        if x.dtype not in (torch.complex64, torch.complex128):
            raise TypeError(f"ComplexLazyTensor: dtype {str(x.dtype).replace('torch.', '')} is "
                            f"not supported; use complex64 or complex128")
        x = x.reshape(1) if x.dim() == 0 else x
        return torch.view_as_real(x.resolve_conj()).reshape(*x.shape[:-1], 2 * x.shape[-1])

    @staticmethod
    def _view_complex(x):
        return torch.view_as_complex(x.reshape(*x.shape[:-1], x.shape[-1] // 2, 2).contiguous())


LazyTensor._COMPLEX = ComplexLazyTensor
ComplexLazyTensor._REAL = LazyTensor


Vi, Vj, Pm = _lazy._constructors(LazyTensor, "tensor")


generic_sum, generic_logsumexp, generic_argmin, generic_argkmin = _generic.bind(Genred)
utils.torchtools.Genred, utils.torchtools.KernelSolve = Genred, KernelSolve
