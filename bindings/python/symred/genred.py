"""Genred: a generic reduction, called like pykeops.numpy.Genred."""

import ctypes
import inspect
import threading
import weakref

import numpy as np

from . import _lib
from ._lib import (
    SR_CAT_I,
    SR_CAT_J,
    SR_CAT_PARAM,
    SR_BF16,
    SR_F16,
    SR_F32,
    SR_F64,
    KernelDesc,
    Ranges,
    RunDesc,
    SymredValueError,
    check,
    kernel_plan,
    lib,
)

__all__ = ["Genred", "REDUCTIONS"]

# pykeops spellings, in the order of sr_reduction.
REDUCTIONS = (
    "Sum",
    "Min",
    "Max",
    "ArgMin",
    "ArgMax",
    "Min_ArgMin",
    "Max_ArgMax",
    "KMin",
    "ArgKMin",
    "KMin_ArgKMin",
    "LogSumExp",
    "SumSoftMaxWeight",
)
_K_REDUCTIONS = ("KMin", "ArgKMin", "KMin_ArgKMin")
_INDEX_ONLY = ("ArgMin", "ArgMax", "ArgKMin")
_VALUES_AND_INDICES = ("Min_ArgMin", "Max_ArgMax", "KMin_ArgKMin")
_SUM_LIKE = ("Sum", "LogSumExp", "SumSoftMaxWeight")

_DTYPES = {np.dtype(np.float32): SR_F32, np.dtype(np.float64): SR_F64,
           np.dtype(np.float16): SR_F16}
# NumPy has no bfloat16: the ml_dtypes package (JAX's) gives it one, used when installed.
try:
    import ml_dtypes as _ml_dtypes
except ImportError:
    _ml_dtypes = None
else:
    _DTYPES[np.dtype(_ml_dtypes.bfloat16)] = SR_BF16
_DTYPE_NAMES = "float32, float64, float16 or bfloat16"
_BF16_HELP = ("NumPy has no bfloat16 type: install the ml_dtypes package (pip install ml-dtypes) "
              "for bfloat16 arrays (ml_dtypes.bfloat16), or pass float32 ones")
_CAT_NAMES = {SR_CAT_I: "Vi", SR_CAT_J: "Vj", SR_CAT_PARAM: "Pm"}

_BACKENDS = {
    "auto": _lib.SR_DEVICE_AUTO,
    "cpu": _lib.SR_DEVICE_CPU,
    "gpu": _lib.SR_DEVICE_CUDA,
    "gpu_1d": _lib.SR_DEVICE_CUDA,
    "gpu_2d": _lib.SR_DEVICE_CUDA,
    "cuda": _lib.SR_DEVICE_CUDA,
    "reference": _lib.SR_DEVICE_REFERENCE,
}

_RANGES_NAMES = ("ranges_i", "slices_i", "redranges_j", "ranges_j", "slices_j", "redranges_i")


def _ranges_struct(ranges, to_numpy):
    """pykeops' 6-tuple of block-sparse ranges as a struct sr_ranges, and the int64 arrays it
    points to (keep them alive while the struct is used). Shapes and dtypes are checked here;
    the values (bounds, order, overlaps) by the library."""
    if not isinstance(ranges, (tuple, list)) or len(ranges) != 6:
        raise ValueError("ranges must be pykeops' 6-tuple (ranges_i, slices_i, redranges_j, "
                         "ranges_j, slices_j, redranges_i) of integer arrays, e.g. from "
                         "symred.numpy.cluster.from_matrix")
    arrays = []
    for name, a in zip(_RANGES_NAMES, ranges):
        a = to_numpy(a)
        if a.dtype.kind not in "iu":
            raise TypeError(f"ranges: {name} has dtype {a.dtype}; block-sparse ranges are "
                            f"integer arrays (int32 as in pykeops, or int64)")
        want2 = not name.startswith("slices")
        if (a.ndim != 2 or a.shape[1] != 2) if want2 else a.ndim != 1:
            raise ValueError(f"ranges: {name} must have shape {'(n, 2)' if want2 else '(n,)'}, "
                             f"got {a.shape}")
        arrays.append(np.ascontiguousarray(a, dtype=np.int64))
    for r, sl in ((0, 1), (3, 4)):
        if arrays[r].shape[0] != arrays[sl].shape[0]:
            raise ValueError(f"ranges: {_RANGES_NAMES[r]} has {arrays[r].shape[0]} blocks but "
                             f"{_RANGES_NAMES[sl]} has {arrays[sl].shape[0]} entries")
    P = ctypes.POINTER(ctypes.c_int64)

    def ptr(a):
        return a.ctypes.data_as(P)

    st = Ranges(
        nranges_i=arrays[0].shape[0], ranges_i=ptr(arrays[0]), slices_i=ptr(arrays[1]),
        nredranges_j=arrays[2].shape[0], redranges_j=ptr(arrays[2]),
        nranges_j=arrays[3].shape[0], ranges_j=ptr(arrays[3]), slices_j=ptr(arrays[4]),
        nredranges_i=arrays[5].shape[0], redranges_i=ptr(arrays[5]),
    )
    return st, arrays


def _batch_ranges(ranges, to_numpy, full, ni, nj):
    """The user's block-sparse ranges for batched arrays (pykeops refuses these; symred's
    semantics, docs/ranges.md): each of the six arrays has the same leading batch dimensions,
    which broadcast to the batch shape ``full`` (none: the same pattern for every batch), and
    holds that batch's ranges in its own row numbers, [0, ni) for i and [0, nj) for j. They are
    offset into the flattened layout of the batched call (batch b's i rows at b * ni, j rows at
    b * nj, its slices past the earlier batches' intervals) and concatenated: the 6-tuple of
    one launch."""
    if not isinstance(ranges, (tuple, list)) or len(ranges) != 6:
        _ranges_struct(ranges, to_numpy)  # raises its message
    arrays, lead = [], []
    for name, a in zip(_RANGES_NAMES, ranges):
        a = to_numpy(a)
        if a.dtype.kind not in "iu":
            raise TypeError(f"ranges: {name} has dtype {a.dtype}; block-sparse ranges are "
                            f"integer arrays (int32 as in pykeops, or int64)")
        tail = 1 if name.startswith("slices") else 2
        if a.ndim < tail or (tail == 2 and a.shape[-1] != 2):
            raise ValueError(f"ranges: {name} must have shape "
                             f"{'(..., n)' if tail == 1 else '(..., n, 2)'} (leading batch "
                             f"dimensions allowed), got {a.shape}")
        arrays.append(a.astype(np.int64))
        lead.append(tuple(a.shape[: a.ndim - tail]))
    if len(set(lead)) > 1:
        desc = ", ".join(f"{n} {sh}" for n, sh in zip(_RANGES_NAMES, lead))
        raise ValueError(f"ranges: the six arrays must have the same batch dimensions, got {desc}")
    L = lead[0]
    try:
        ok = len(L) <= len(full) and tuple(np.broadcast_shapes(L, full)) == tuple(full)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"ranges: batch dimensions {L} do not match the arrays' batch shape "
                         f"{tuple(full)} (they must broadcast to it; give 2-D ranges for the "
                         f"same pattern in every batch)")
    B = int(np.prod(full, dtype=np.int64))
    per = [np.broadcast_to(a, tuple(full) + a.shape[len(L):]).reshape((B,) + a.shape[len(L):])
           for a in arrays]
    sizes = {"ranges_i": ni, "redranges_i": ni, "ranges_j": nj, "redranges_j": nj}
    for name, a in zip(_RANGES_NAMES, per):
        if name.startswith("slices"):
            bound = per[_RANGES_NAMES.index("redranges_" + ("j" if name[-1] == "i" else "i"))]
            n, what = bound.shape[1], "the number of intervals"
            bad = np.argwhere((a < 0) | (a > n))
        else:
            n, what = sizes[name], f"the {'i' if name[-1] == 'i' else 'j'} rows of a batch"
            bad = np.argwhere((a < 0).any(-1) | (a > n).any(-1) | (a[..., 0] > a[..., 1]))
        if len(bad):
            bb, k = (int(v) for v in bad[0])
            where = np.unravel_index(bb, tuple(full)) if full else ()
            raise ValueError(f"ranges: {name}[{', '.join(map(str, where + (k,)))}] = "
                             f"{a[bb, k].tolist()} in batch {tuple(int(w) for w in where)}: "
                             f"entries must lie in [0, {n}] ({what}) with start <= end")
    off = np.arange(B, dtype=np.int64)

    def triple(rg, sl, red, n_out, n_red):
        # A batch's first block starts after the previous batch's last slice, so only the
        # intervals each batch's slices reach (a prefix) are kept, and its slices are shifted
        # by the intervals kept before it.
        used = sl[:, -1] if sl.shape[1] else np.zeros(B, dtype=np.int64)
        before = np.concatenate([[0], np.cumsum(used)[:-1]]).astype(np.int64)
        keep = np.arange(red.shape[1])[None, :] < used[:, None]
        return ((rg + off[:, None, None] * n_out).reshape(-1, 2),
                (sl + before[:, None]).reshape(-1),
                (red + off[:, None, None] * n_red)[keep].reshape(-1, 2))

    return triple(*per[0:3], ni, nj) + triple(*per[3:6], nj, ni)


_INT32_MAX = 2**31 - 1


def _int_arg(name, v, lo=-2**63, hi=2**63 - 1):
    """v as an int in [lo, hi] (by default int64_t's range: what the C field holds), else a
    ValueError or TypeError naming the argument: ctypes would wrap a wider integer silently."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    if not lo <= int(v) <= hi:
        raise ValueError(f"{name} = {v} is outside [{lo}, {hi}]")
    return int(v)


def _float_arg(name, v):
    """v as a float: a number, or a one-element array or tensor (pykeops' solvers broadcast
    ``alpha`` with the unknown, so a shape-(1,) array is as good as a number there)."""
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name} must be a number, not bool")
    if hasattr(v, "item") and not isinstance(v, (int, float)):
        size = v.numel() if callable(getattr(v, "numel", None)) else getattr(v, "size", 1)
        if size != 1:
            raise ValueError(f"{name} must be a number or a one-element array, not an array "
                             f"of shape {tuple(v.shape)}")
        v = v.item()
    return float(v)


def _block_diagonal_ranges(B, M, N, shared, axis):
    """pykeops' 6-tuple of ranges for B batches laid end to end: batch b's M output rows
    (rows [b M, (b + 1) M)) reduce over its own N reduced rows ([b N, (b + 1) N)), or over the
    same N rows for every batch when ``shared``. ``axis`` 1: the output rows are i."""
    b = np.arange(B, dtype=np.int64)
    out_blocks = np.stack([b * M, (b + 1) * M], axis=1)
    slices = b + 1
    if shared:
        red_iv = np.tile(np.array([[0, N]], dtype=np.int64), (B, 1))
        t = (np.array([[0, N]], dtype=np.int64), np.array([B], dtype=np.int64), out_blocks)
    else:
        red_iv = np.stack([b * N, (b + 1) * N], axis=1)
        t = (red_iv, slices, out_blocks)
    return ((out_blocks, slices, red_iv) + t) if axis == 1 else (t + (out_blocks, slices, red_iv))


class _Arg:
    """One input of the reduction: its index, category, dimension, a name for messages and the
    position of the alias that declares it (None for a Var(...) of the formula)."""

    __slots__ = ("index", "cat", "dim", "name", "alias")

    def __init__(self, index, cat, dim, name, alias=None):
        self.index, self.cat, self.dim, self.name, self.alias = index, cat, dim, name, alias

    def describe(self):
        return f"argument {self.index} ({self.name} = {_CAT_NAMES[self.cat]}({self.dim}))"

    def expected_shape(self):
        if self.cat == SR_CAT_I:
            return f"(nx, {self.dim})"
        if self.cat == SR_CAT_J:
            return f"(ny, {self.dim})"
        return f"({self.dim},)"


def _alias_name(alias):
    """The name an alias declaration gives (the text before its '='), for messages; the C
    parser has read the declaration itself."""
    return alias.split("=", 1)[0].strip()


def _args_from(aliases, tables):
    """The inputs, by index, from the C parser's variable tables (sr_parse_ex) of the formulas:
    every index an alias declares or a formula names (Var(...), Vi(index, dim), the gradient
    input of GradFromPos), also those that a derivative removed from the expanded formula, as
    KeOps counts them."""
    args = {}
    for table in tables:
        for index, dim, cat, alias in table:
            if alias >= 0:
                name = repr(_alias_name(aliases[alias]))
                args[index] = _Arg(index, cat, dim, name, alias)
            else:
                args.setdefault(index, _Arg(index, cat, dim, f"Var({index},{dim},{cat})"))
    return args


def _check_dtype_option(dtype):
    if dtype is None:
        return None
    if _ml_dtypes is None and isinstance(dtype, str) and dtype == "bfloat16":
        raise TypeError(_BF16_HELP)
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be one of {_DTYPE_NAMES}, not {dtype!r}") from None
    if dt not in _DTYPES:
        raise TypeError(f"dtype must be one of {_DTYPE_NAMES}, not {dt.name!r}")
    return dt


def _rebuild(cls, args, kwargs):
    """Unpickles a Genred (or a subclass): constructed again from its arguments."""
    return cls(*args, **kwargs)


class _Handle:
    """The C objects of one Genred: its context, parsed formulas and compiled kernels.

    Kept apart from the Genred object so that a weakref.finalize can free them (kernels
    first, then the context) when the Genred goes away or at interpreter exit, without the
    finalizer holding the Genred alive.
    """

    def __init__(self):
        self.lib = lib
        self.lock = threading.Lock()
        self.kernels = {}
        ctx = ctypes.c_void_p()
        st = lib.sr_ctx_new(ctypes.byref(ctx))
        if st != _lib.SR_OK or not ctx.value:
            raise MemoryError("symred: sr_ctx_new failed")
        self.ctx = ctx

    @staticmethod
    def close(lib_, ctx, kernels):
        for k in kernels.values():
            lib_.sr_kernel_free(k)
        kernels.clear()
        lib_.sr_ctx_free(ctx)


class Genred:
    r"""A generic reduction ``out = RED F(x_i, y_j, p)``, as ``pykeops.numpy.Genred``.

    Args:
        formula (str): a KeOps formula, e.g. ``"Exp(-g * SqDist(x, y)) * b"``.
        aliases (list of str): declarations ``"x = Vi(3)"`` (one row per i), ``"y = Vj(3)"``
            (one row per j), ``"g = Pm(1)"`` (a parameter), ``"b = Vj(2, 1)"`` (explicit
            index 2), ``"v = Var(1, 3, 1)"``. The call takes one array per index, in index
            order.
        reduction_op (str): one of ``Sum, Min, Max, ArgMin, ArgMax, Min_ArgMin, Max_ArgMax,
            KMin, ArgKMin, KMin_ArgKMin, LogSumExp, SumSoftMaxWeight``.
        axis (int): as in pykeops: **0 reduces over i** (one output row per j, ``ny`` rows),
            **1 reduces over j** (one output row per i, ``nx`` rows). Default 0.
        dtype: ``None``, ``"float32"``, ``"float64"``, ``"float16"`` or ``"bfloat16"``
            (``ml_dtypes.bfloat16``: NumPy has none of its own; without the ml_dtypes package
            bfloat16 raises TypeError saying so). The arrays decide the dtype; when given,
            arrays of another dtype raise TypeError. float16 and bfloat16 are computed in
            float32 and the results rounded to the input dtype (docs/semantics.md).
        opt_arg (int): K of KMin, ArgKMin and KMin_ArgKMin (required there, refused elsewhere).
        formula2 (str): the weight G of SumSoftMaxWeight, parsed with the same aliases:
            ``sum_j exp(F_ij) G_ij / sum_j exp(F_ij)``; or of LogSumExp (F scalar):
            ``log sum_j exp(F_ij) G_ij``, componentwise in G, as pykeops.
        dtype_acc, use_double_acc, sum_scheme: pykeops' accuracy options for float32 sums,
            mapped to the kernel's accumulation mode (``sr_kernel_desc.acc``):
            ``use_double_acc=True`` or ``dtype_acc="float64"`` accumulate in double;
            ``dtype_acc="float16"`` (float16 data only, as pykeops) is taken as float32,
            since float16 is computed in float32; ``sum_scheme="kahan_scheme"`` compensates;
            ``"block_sum"`` and ``"direct_sum"`` use block summation (symred has no plain
            running sum: block summation is as fast and more accurate); ``"auto"`` leaves it
            to ``SYMRED_ACC``. The reference backend always accumulates in double.

    Calling ``f(*args, backend="auto", out=None)`` returns (written into ``out`` when it is
    given, an array of the result's shape and dtype), with ``n`` the number of output rows and
    ``D`` the dimension of F:

    - Sum, Min, Max, LogSumExp: an ``(n, D)`` array of the input dtype; SumSoftMaxWeight:
      ``(n, dim(G))``;
    - ArgMin, ArgMax: ``(n, D)`` **int64** indices (pykeops returns floats; the one
      deliberate difference);
    - Min_ArgMin, Max_ArgMax: a tuple ``(values (n, D), indices (n, D) int64)``;
    - KMin: ``(n, K, D)``, squeezed to ``(n, K)`` when D = 1 (as pykeops); ArgKMin the same
      in int64; KMin_ArgKMin a tuple of both. Values are sorted ascending.

    ``backend`` is ``"auto"``, ``"CPU"``, ``"GPU"`` (also ``"GPU_1D"``, ``"GPU_2D"``, an NVIDIA
    GPU through the CUDA backend: a :class:`SymredRuntimeError` where there is none) or
    ``"reference"`` (the portable interpreter).
    """

    def __init__(
        self,
        formula,
        aliases,
        reduction_op="Sum",
        axis=0,
        dtype=None,
        opt_arg=None,
        formula2=None,
        dtype_acc="auto",
        use_double_acc=False,
        sum_scheme="auto",
        cuda_type=None,
        enable_chunks=True,
        rec_multVar_highdim=False,
        use_fast_math=True,
    ):
        # cuda_type, enable_chunks, rec_multVar_highdim and use_fast_math are pykeops tuning
        # switches: accepted so that pykeops code runs unchanged, and ignored.
        if not isinstance(formula, str):
            raise TypeError(f"formula must be a str, not {type(formula).__name__}")
        if isinstance(aliases, str) or not all(isinstance(a, str) for a in aliases):
            raise TypeError("aliases must be a list of str such as ['x = Vi(3)', 'y = Vj(3)']")
        aliases = list(aliases)
        for text in [formula] + ([formula2] if isinstance(formula2, str) else []) + aliases:
            if "\x00" in text:
                raise ValueError(f"formula and alias text must not contain NUL characters: "
                                 f"{text!r}")
        if not isinstance(reduction_op, str) or reduction_op not in REDUCTIONS:
            raise ValueError(
                f"unknown reduction_op {reduction_op!r}; expected one of {', '.join(REDUCTIONS)}"
            )
        if isinstance(axis, bool) or axis not in (0, 1):
            raise ValueError(
                f"axis must be 0 (reduce over i, one result per j) or 1 (reduce over j, one "
                f"result per i), not {axis!r}"
            )
        if reduction_op in _K_REDUCTIONS:
            if opt_arg is None:
                raise ValueError(f"{reduction_op} needs opt_arg = K, the number of values kept")
            if isinstance(opt_arg, bool) or not isinstance(opt_arg, (int, np.integer)):
                raise TypeError(f"opt_arg (K) must be an int, not {type(opt_arg).__name__}")
            if not 1 <= opt_arg <= _INT32_MAX:
                raise ValueError(f"opt_arg (K) must be >= 1 and <= {_INT32_MAX}, not {opt_arg}")
            opt_arg = int(opt_arg)
        elif opt_arg is not None:
            raise ValueError(
                f"opt_arg is K of KMin, ArgKMin and KMin_ArgKMin; {reduction_op} takes none"
            )
        if reduction_op == "SumSoftMaxWeight":
            if not isinstance(formula2, str):
                raise ValueError(
                    "SumSoftMaxWeight needs formula2, the formula whose values are averaged"
                )
        elif formula2 is not None and reduction_op != "LogSumExp":
            raise ValueError(
                f"formula2 is the weight of SumSoftMaxWeight and of LogSumExp; {reduction_op} "
                f"takes none"
            )
        elif formula2 is not None and not isinstance(formula2, str):
            raise TypeError(f"formula2 must be a str, not {type(formula2).__name__}")
        self.dtype = _check_dtype_option(dtype)
        if dtype_acc not in ("auto", "float16", "float32", "float64"):
            raise ValueError(
                f"dtype_acc must be 'auto', 'float16', 'float32' or 'float64', not {dtype_acc!r}"
            )
        if not isinstance(use_double_acc, (bool, np.bool_)):
            raise TypeError("use_double_acc must be a bool")
        if use_double_acc and dtype_acc not in ("auto", "float64"):
            raise ValueError("use_double_acc=True contradicts dtype_acc=" + repr(dtype_acc))
        if sum_scheme not in ("auto", "direct_sum", "block_sum", "kahan_scheme"):
            raise ValueError(
                "sum_scheme must be 'auto', 'direct_sum', 'block_sum' or 'kahan_scheme', not "
                f"{sum_scheme!r}"
            )
        if sum_scheme != "auto" and reduction_op not in _SUM_LIKE:
            raise ValueError(f"sum_scheme applies to Sum, LogSumExp and SumSoftMaxWeight, "
                             f"not to {reduction_op}")

        self.formula = formula
        self.formula2 = formula2
        self.aliases = aliases
        self.reduction_op = reduction_op
        self.axis = axis
        self.opt_arg = opt_arg
        self.dtype_acc = "float64" if use_double_acc else dtype_acc
        self.use_double_acc = bool(use_double_acc)
        self.sum_scheme = sum_scheme
        if self.dtype_acc == "float64":
            self._acc = _lib.ACC_F64
        elif sum_scheme == "kahan_scheme":
            self._acc = _lib.ACC_KAHAN
        elif (sum_scheme in ("block_sum", "direct_sum")
              or self.dtype_acc in ("float16", "float32")):
            # dtype_acc="float16" (pykeops: accumulate float16 data in float16) takes float32
            # block sums, since symred computes float16 in float32 (docs/semantics.md).
            self._acc = _lib.ACC_BLOCK
        else:
            self._acc = _lib.ACC_DEFAULT

        red = ctypes.c_int()
        check(lib.sr_reduction_from_name(reduction_op.encode(), ctypes.byref(red)), None,
              f"reduction {reduction_op}")
        self._red = red.value

        self._h = _Handle()
        self._finalizer = weakref.finalize(self, _Handle.close, lib, self._h.ctx,
                                           self._h.kernels)
        # KeOps' GradFromPos(F, v, I) declares a new variable, the gradient input, of the
        # reduction's output category, which the axis gives: the parser is told it.
        self._gradin_cat = SR_CAT_I if axis == 1 else SR_CAT_J
        self._expr, table = self._parse(formula, "formula")
        self._weight, table2 = (self._parse(formula2, "formula2") if formula2 is not None
                                else (None, []))
        # The weighted LogSumExp log(sum_j exp(F_ij) G_ij) (pykeops' LogSumExp with formula2;
        # F scalar, G of any dimension) is c + log(sum_j exp(F_ij - c_i) G_ij) for any c:
        # two reductions, built when first called (see _extended_call).
        self._weighted_lse = reduction_op == "LogSumExp" and formula2 is not None
        if self._weighted_lse and lib.sr_expr_dim(self._expr) != 1:
            raise ValueError(f"LogSumExp with a weight (formula2) needs a scalar formula; "
                             f"{formula!r} has dimension {lib.sr_expr_dim(self._expr)}")

        self._args = _args_from(aliases, [table, table2])
        self.nargs = 1 + max(self._args) if self._args else 0

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        # The constructor's arguments, for pickling: the C objects are not pickled, and a copy
        # is built again from these.
        self._init_args = (args, kwargs)
        return self

    def __reduce__(self):
        args, kwargs = self._init_args
        return (_rebuild, (type(self), args, kwargs))

    # -- construction helpers

    def _parse(self, text, what):
        """The sr_expr of a formula and its variable table (symred._lib.parse)."""
        return _lib.parse(self._h.ctx, text, self.aliases, self._gradin_cat, what)

    def _kernel(self, sr_dtype, device, reduction=None):
        """The compiled kernel for a dtype and device (of another reduction of the same
        formula when ``reduction`` is given: symred.torch asks for Min_ArgMin for a Min)."""
        red = self._red if reduction is None else reduction
        key = (sr_dtype, device, red)
        k = self._h.kernels.get(key)
        if k is not None:
            return k
        desc = KernelDesc(
            reduction=red,
            axis=self.axis,
            k=self.opt_arg or 1,
            dtype=sr_dtype,
            device=device,
            weight=self._weight.value if self._weight is not None else None,
            acc=self._acc,
        )
        out = ctypes.c_void_p()
        st = lib.sr_kernel_new(self._h.ctx, self._expr, ctypes.byref(desc), ctypes.byref(out))
        check(st, self._h.ctx)
        self._h.kernels[key] = out
        return out

    @staticmethod
    def _device(backend):
        if not isinstance(backend, str) or backend.lower() not in _BACKENDS:
            raise ValueError(
                f"backend must be 'auto', 'CPU', 'GPU' (or 'GPU_1D', 'GPU_2D') or 'reference', "
                f"not {backend!r}"
            )
        return _BACKENDS[backend.lower()]

    # -- public

    def explain(self, dtype=None, backend="auto"):
        """The C library's description of the kernel (sr_kernel_explain): the formula, the
        reduction, the backend and its plan. ``dtype`` defaults to the Genred's dtype, else
        float32."""
        dt = _check_dtype_option(dtype) or self.dtype or np.dtype(np.float32)
        device = self._device(backend)
        with self._h.lock:
            k = self._kernel(_DTYPES[dt], device)
            return lib.sr_kernel_explain(k).decode(errors="replace")

    def plan(self, dtype=None, backend="auto"):
        """The plan the kernel runs, as a dict (sr_kernel_plan; :func:`symred._lib.kernel_plan`
        lists the keys): ``plan()["strategy"]`` is "direct", "gemm-epilogue", "fused
        two-product", ..., ``plan()["backend"]`` "cpu-jit", "reference" or "cuda". What
        :meth:`explain` says in words, for programs: read this rather than the explain text.
        ``dtype`` and ``backend`` as for :meth:`explain`."""
        dt = _check_dtype_option(dtype) or self.dtype or np.dtype(np.float32)
        device = self._device(backend)
        with self._h.lock:
            return kernel_plan(self._kernel(_DTYPES[dt], device))

    def eval_block(self, *args, rows, cols, out=None):
        """The formula's values (not the reduction) on a block of the nx x ny matrix
        F(x_i, y_j): ``sr_kernel_eval_block``. ``rows = (i0, ni)`` and ``cols = (j0, nj)``
        select rows [i0, i0 + ni) and columns [j0, j0 + nj); the arrays are the whole ones, as
        for a call (only the block's rows are read). Returns an ``(ni, nj, D)`` array
        (``(ni, nj)`` when D = 1) of the arrays' dtype, written into ``out`` when given (a
        C-contiguous array of that shape and dtype). The values are computed on the CPU by
        the kernel's generated code (the CPU JIT; the reference interpreter where the JIT does
        not apply), agree with the reference interpreter's within docs/semantics.md's
        tolerances, whatever the reduction and axis; they are not differentiated. This is the building block of split-and-accumulate algorithms whose
        blocks the caller sizes from its memory budget (the K_uf K_fu product of sparse GPs,
        bench/exla/sgpr_model.py)."""
        arrays, dt, nx, ny = self._prepare(args)
        (i0, ni), (j0, nj) = rows, cols
        # ctypes would wrap an int wider than int64_t silently (2**64 + 2 as 2).
        i0, ni, j0, nj = (_int_arg(n, v) for n, v in
                          (("rows[0]", i0), ("rows[1]", ni), ("cols[0]", j0), ("cols[1]", nj)))
        with self._h.lock:
            k = self._kernel(self._sr_dtype(dt), _lib.SR_DEVICE_CPU)
            nargs_c = lib.sr_kernel_nargs(k)
            D = lib.sr_kernel_out_dim(k)
        if self.reduction_op != "Sum":
            raise ValueError("eval_block needs a Sum Genred (its output dimension is the "
                             "formula's)")
        shape = (ni, nj) if D == 1 else (ni, nj, D)
        out = self._block_out(out, shape, dt)
        ptrs = (ctypes.c_void_p * max(1, nargs_c))(
            *[self._data_ptr(a) if a is not None else None for a in arrays[:nargs_c]]
        )
        st = lib.sr_kernel_eval_block(k, nx, ny, ptrs, i0, ni, j0, nj, self._data_ptr(out))
        check(st, self._h.ctx)
        return out

    # eval_block's array hooks; symred.torch.Genred overrides them.
    @staticmethod
    def _sr_dtype(dt):
        return _DTYPES[np.dtype(dt)]

    @staticmethod
    def _data_ptr(a):
        return a.ctypes.data

    @staticmethod
    def _block_out(out, shape, dt):
        if out is None:
            return np.empty(shape, dtype=dt)
        if (not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != dt
                or not out.flags.c_contiguous):
            raise ValueError(f"out must be a C-contiguous {np.dtype(dt).name} NumPy array of "
                             f"shape {shape}")
        return out

    def __repr__(self):
        k = f", opt_arg={self.opt_arg}" if self.opt_arg is not None else ""
        f2 = f", formula2={self.formula2!r}" if self.formula2 is not None else ""
        return (f"Genred({self.formula!r}, {self.aliases!r}, reduction_op="
                f"{self.reduction_op!r}, axis={self.axis}{k}{f2})")

    # What _prepare needs to know of the array type; symred.torch.Genred overrides these.
    _ARRAY_NAME = "NumPy array"
    # Whether a variable of dimension 1 may be a 1-D array of n values (read as (n, 1)), as
    # pykeops reads one; KernelSolve keeps (n, 1), the shape of its unknown.
    _FLAT_DIM1_VARIABLES = True

    @staticmethod
    def _is_array(a):
        return isinstance(a, np.ndarray)

    @staticmethod
    def _array_dtype(a):
        """The array's dtype as _prepare compares them, None if symred does not take it."""
        dt = a.dtype
        if dt.kind == "f" and dt.itemsize in (2, 4, 8) and not dt.isnative:
            dt = dt.newbyteorder("=")
        return dt if dt in _DTYPES else None

    @staticmethod
    def _array_dtype_of_option(dt):
        return dt

    @staticmethod
    def _dtype_name(dt):
        return np.dtype(dt).name

    @staticmethod
    def _from_numbers(a, dt):
        return np.asarray(a, dtype=dt)

    @staticmethod
    def _contiguous(a, dt):
        return np.ascontiguousarray(a, dtype=dt)

    @staticmethod
    def _cast(a, dt):
        """A parameter's array converted to the formula's dtype."""
        return a.astype(dt)

    def _prepare(self, args):
        """Checked, contiguous arrays in one dtype, and nx, ny."""
        if len(args) != self.nargs:
            names = ", ".join(
                self._args[i].name if i in self._args else f"<unused {i}>"
                for i in range(self.nargs)
            )
            raise ValueError(
                f"this Genred takes {self.nargs} arrays ({names}), {len(args)} were given"
            )
        # The dtype: the one given to Genred, else the one common to the variables' arrays
        # (i and j). Parameters follow it and are converted, as in pykeops, so a float64
        # scale beside float32 data is a float32 scale; they decide only when there is no
        # variable.
        dtypes, param_dtypes = {}, {}
        for i, a in enumerate(args):
            if self._is_array(a):
                dt = self._array_dtype(a)
                if dt is None:
                    what = self._args[i].describe() if i in self._args else f"argument {i}"
                    raise TypeError(f"{what}: dtype {self._dtype_name(a.dtype)} is not "
                                    f"supported; use {_DTYPE_NAMES}")
                spec = self._args.get(i)
                (param_dtypes if spec is not None and spec.cat == SR_CAT_PARAM
                 else dtypes)[i] = dt
        if not dtypes and self.dtype is None:
            dtypes = dict(list(param_dtypes.items())[:1])
        if len(set(dtypes.values())) > 1:
            desc = ", ".join(f"argument {i} is {self._dtype_name(dt)}"
                             for i, dt in dtypes.items())
            raise TypeError(f"mixed dtypes ({desc}): convert all arrays to one of "
                            f"{_DTYPE_NAMES}")
        if self.dtype is not None:
            dt = self._array_dtype_of_option(self.dtype)
            for i, adt in dtypes.items():
                if adt != dt:
                    raise TypeError(f"argument {i} is {self._dtype_name(adt)} but this Genred "
                                    f"was created with dtype={self.dtype.name}")
        elif dtypes:
            dt = next(iter(dtypes.values()))
        else:
            dt = self._array_dtype_of_option(np.dtype(np.float32))

        arrays = [None] * self.nargs
        rows = {SR_CAT_I: {}, SR_CAT_J: {}}
        for i, a in enumerate(args):
            spec = self._args.get(i)
            if spec is None:
                continue  # an index no alias and no Var() uses: its array is not read
            if not self._is_array(a):
                if spec.cat == SR_CAT_PARAM and isinstance(a, (int, float, np.number, list,
                                                               tuple)):
                    a = self._from_numbers(a, dt)
                else:
                    raise TypeError(f"{spec.describe()} must be a {self._ARRAY_NAME} of shape "
                                    f"{spec.expected_shape()}, not {type(a).__name__}")
            if spec.cat == SR_CAT_PARAM:
                if a.ndim == 0 and spec.dim == 1:
                    a = a.reshape(1)
                if a.shape != (spec.dim,):
                    raise ValueError(f"{spec.describe()} must have shape {spec.expected_shape()}, "
                                     f"got {a.shape}")
            else:
                if a.ndim == 1 and spec.dim == 1 and self._FLAT_DIM1_VARIABLES:
                    a = a.reshape(-1, 1)
                if a.ndim != 2 or a.shape[1] != spec.dim:
                    hint = ""
                    if a.ndim == 1 and spec.dim == 1:
                        hint = " (use a[:, None] for a 1-D array)"
                    raise ValueError(f"{spec.describe()} must have shape {spec.expected_shape()}, "
                                     f"got {a.shape}{hint}")
                rows[spec.cat][i] = a.shape[0]
            if spec.cat == SR_CAT_PARAM and self._array_dtype(a) != dt:
                a = self._cast(a, dt)
            arrays[i] = self._contiguous(a, dt)
        sizes = []
        for cat, label in ((SR_CAT_I, "nx"), (SR_CAT_J, "ny")):
            counts = rows[cat]
            if len(set(counts.values())) > 1:
                desc = ", ".join(f"{self._args[i].name} has {n}" for i, n in counts.items())
                raise ValueError(f"all {_CAT_NAMES[cat]} arrays must have the same number of "
                                 f"rows ({label}): {desc}")
            # No variable of a category: one row, as in KeOps.
            sizes.append(next(iter(counts.values())) if counts else 1)
        return arrays, dt, sizes[0], sizes[1]

    def _check_acc(self, dt):
        """pykeops' rules for dtype_acc: float32 not with float64 data, float16 only with
        float16 (or bfloat16) data."""
        name = self._dtype_name(dt)
        if self.dtype_acc == "float32" and name == "float64":
            raise ValueError("dtype_acc='float32' is not allowed with float64 data")
        if self.dtype_acc == "float16" and name not in ("float16", "bfloat16"):
            raise ValueError(f"dtype_acc='float16' is allowed with float16 data only, not with "
                             f"{name} data")

    def _needs_extended_call(self, out):
        return out is not None or self._weighted_lse

    def _extended_call(self, args, out, **kwargs):
        """A call with ``out=`` (the result written into ``out``, which is returned) or of a
        weighted LogSumExp (two reductions, see __init__).

        The weighted LogSumExp is c + log(sum_j exp(F_ij - c_i) G_ij) with c = LogSumExp(F),
        held constant (c's rounding cancels out, and every exp(F - c) is at most 1). The
        identity holds for any c, so its derivatives of every order are those of the
        weighted LogSumExp; they are the Sum's, whose softmax weights are normalised by the
        same sum, as accurate as the dense formula's."""
        if self._weighted_lse:
            parts = self.__dict__.get("_lse_parts")
            if parts is None:
                kw = inspect.signature(Genred.__init__).bind(
                    None, *self._init_args[0], **self._init_args[1]).arguments
                kw.pop("self")
                kw.pop("reduction_op")
                kw.pop("formula2")
                formula = kw.pop("formula")
                # c: a variable of the output's index, after every alias.
                c = f"Var({self.nargs}, 1, {0 if self.axis == 1 else 1})"
                shifted = f"Exp(({formula}) - {c}) * ({self.formula2})"
                parts = (type(self)(formula, reduction_op="LogSumExp", **kw),
                         type(self)(shifted, reduction_op="Sum", **kw))
                self._lse_parts = parts
            c = self._constant(parts[0](*args, **kwargs))
            res = c + self._log(parts[1](*args, c, **kwargs))
        else:
            res = self(*args, **kwargs)
        if out is None:
            return res
        if isinstance(res, tuple):
            raise ValueError(f"out= holds one array; {self.reduction_op} returns two")
        if (not self._is_array(out) or tuple(out.shape) != tuple(res.shape)
                or out.dtype != res.dtype):
            raise ValueError(f"out must be a {self._ARRAY_NAME} of shape {tuple(res.shape)} and "
                             f"dtype {self._dtype_name(res.dtype)}, got "
                             + (f"shape {tuple(out.shape)} and dtype {self._dtype_name(out.dtype)}"
                                if self._is_array(out) else type(out).__name__))
        return self._copy_into(out, res)

    @staticmethod
    def _log(a):
        return np.log(a)

    @staticmethod
    def _constant(a):
        """a, held constant by differentiation (the arrays' own: NumPy's are not)."""
        return a

    @staticmethod
    def _copy_into(out, res):
        out[...] = res
        return out

    @staticmethod
    def _ranges_array(a):
        return np.asarray(a)

    # ---- batch dimensions ----------------------------------------------------------------

    @staticmethod
    def _expand(a, shape):
        return np.broadcast_to(a, shape)

    @staticmethod
    def _like(values, a):
        return values

    def _batch_shape(self, args):
        """The broadcast batch shape of the arrays (leading dimensions beyond (n, d) for a
        variable, (d,) for a parameter), or None when no array has any."""
        shapes = []
        for i, a in enumerate(args):
            spec = self._args.get(i)
            if spec is None or not self._is_array(a):
                continue
            base = 1 if spec.cat == SR_CAT_PARAM else 2
            if a.ndim > base:
                shapes.append((spec, tuple(a.shape[: a.ndim - base])))
        if not shapes:
            return None
        try:
            return tuple(np.broadcast_shapes(*[sh for _, sh in shapes]))
        except ValueError:
            desc = ", ".join(f"{spec.name} has {sh}" for spec, sh in shapes)
            raise ValueError(f"batch dimensions do not broadcast: {desc}") from None

    def _promoted(self, indices):
        """This Genred with the parameters of the given indices turned into variables of the
        output index (a batched parameter holds one value per batch, so per output row)."""
        cache = self.__dict__.setdefault("_batch_genreds", {})
        g = cache.get(indices)
        if g is not None:
            return g
        cat = "Vi" if self.axis == 1 else "Vj"
        aliases = list(self.aliases)
        for i in indices:
            spec = self._args[i]
            if spec.alias is None:
                raise ValueError(f"{spec.describe()}: a parameter with batch dimensions needs an "
                                 f"alias (name = Pm(dim)), not Var() in the formula")
            aliases[spec.alias] = f"{_alias_name(aliases[spec.alias])} = {cat}({i}, {spec.dim})"
        g = type(self)(self.formula, aliases, reduction_op=self.reduction_op, axis=self.axis,
                       dtype=self.dtype, opt_arg=self.opt_arg, formula2=self.formula2,
                       dtype_acc=self.dtype_acc, use_double_acc=self.use_double_acc,
                       sum_scheme=self.sum_scheme)
        cache[indices] = g
        return g

    def _call_batched(self, args, full, backend, device_id, ranges=None):
        """Leading batch dimensions as one launch: the B batches laid end to end (B * M output
        rows; B * N reduced rows, or N shared when no reduced-side array has a batch and no
        ranges are given), with block-diagonal ranges, or the user's per-batch ranges offset
        into that layout; batched parameters become variables of the output index
        (docs/ranges.md)."""
        B = int(np.prod(full, dtype=np.int64))
        out_cat = SR_CAT_I if self.axis == 1 else SR_CAT_J
        red_cat = SR_CAT_J if self.axis == 1 else SR_CAT_I
        rows = {SR_CAT_I: set(), SR_CAT_J: set()}
        shared = True
        for i, a in enumerate(args):
            spec = self._args.get(i)
            if spec is None or spec.cat == SR_CAT_PARAM or not self._is_array(a):
                continue
            if a.ndim < 2:  # a 1-D variable is read as (n, 1) without batch dimensions only
                raise ValueError(f"{spec.describe()} must have shape (..., "
                                 f"{spec.expected_shape()[1:-1]}) beside batched arrays, got "
                                 f"{tuple(a.shape)}")
            rows[spec.cat].add(a.shape[-2])
            if spec.cat == red_cat and any(d != 1 for d in a.shape[:-2]):
                shared = False
        if ranges is not None:
            shared = False  # each batch's ranges index its own copy of the reduced side
        for cat, label in ((SR_CAT_I, "nx"), (SR_CAT_J, "ny")):
            if len(rows[cat]) > 1:
                raise ValueError(f"all {_CAT_NAMES[cat]} arrays must have the same number of rows "
                                 f"({label}): got {sorted(rows[cat])}")
        M = next(iter(rows[out_cat]), 1)
        N = next(iter(rows[red_cat]), 1)
        if self.reduction_op in _K_REDUCTIONS and self.opt_arg > N:
            raise ValueError(f"{self.reduction_op}: K = {self.opt_arg} exceeds the {N} reduced "
                             f"rows of each batch")
        flat, promoted = [], []
        data_dt = {self._array_dtype(a) for i, a in enumerate(args) if self._is_array(a)
                   and i in self._args and self._args[i].cat != SR_CAT_PARAM}
        data_dt = self._array_dtype_of_option(self.dtype) if self.dtype is not None else (
            next(iter(data_dt)) if len(data_dt) == 1 else None)
        for i, a in enumerate(args):
            spec = self._args.get(i)
            if spec is None or not self._is_array(a):
                flat.append(a)
            elif spec.cat == SR_CAT_PARAM:
                if a.ndim <= 1:
                    flat.append(a)
                    continue
                adt = self._array_dtype(a)
                if data_dt is not None and adt is not None and adt != data_dt:
                    a = self._cast(a, data_dt)  # a parameter follows the variables' dtype
                a = self._expand(a[..., None, :], full + (M, a.shape[-1]))
                flat.append(a.reshape(B * M, a.shape[-1]))
                promoted.append(i)
            elif a.ndim < 2:
                flat.append(a)  # a wrong shape: the unbatched call says so
            elif spec.cat == red_cat and shared:
                flat.append(a.reshape(a.shape[-2], a.shape[-1]))
            else:
                a = self._expand(a, full + tuple(a.shape[-2:]))
                flat.append(a.reshape(B * a.shape[-2], a.shape[-1]))
        if ranges is not None:
            ni, nj = (M, N) if self.axis == 1 else (N, M)
            ranges = _batch_ranges(ranges, self._ranges_array, full, ni, nj)
        else:
            ranges = _block_diagonal_ranges(B, M, N, shared, self.axis)
        g = self._promoted(tuple(promoted)) if promoted else self
        res = g(*flat, backend=backend, device_id=device_id, ranges=ranges)

        def shape(o, indices):
            if indices and not shared:  # global reduced indices back to each batch's own
                offs = ((np.arange(B * M) // M) * N).reshape((B * M,) + (1,) * (o.ndim - 1))
                o = o - self._like(offs, o) * (o >= 0)
            return o.reshape(full + (M,) + tuple(o.shape[1:]))

        red = self.reduction_op
        if red in _INDEX_ONLY:
            return shape(res, True)
        if red in _VALUES_AND_INDICES:
            return shape(res[0], False), shape(res[1], True)
        return shape(res, False)

    def __call__(self, *args, backend="auto", device_id=-1, ranges=None, out=None):
        """Runs the reduction on NumPy arrays given in alias-index order. ``ranges``:
        pykeops' 6-tuple of block-sparse ranges (see :mod:`symred.numpy.cluster`); output rows
        in no block get the reduction's identity (0 for Sum, +inf for Min, -1 for indices).
        Arrays may have leading batch dimensions (broadcast as in pykeops: (B, M, D) for a
        variable, (B, D) for a parameter): the batches run as one launch and the result has
        shape (B..., M, D)."""
        device = self._device(backend)
        if self._needs_extended_call(out):
            return self._extended_call(args, out, backend=backend, device_id=device_id,
                                       ranges=ranges)
        full = self._batch_shape(args)
        if full is not None:
            return self._call_batched(args, full, backend, device_id, ranges)
        rg = _ranges_struct(ranges, self._ranges_array) if ranges is not None else None
        arrays, dt, nx, ny = self._prepare(args)
        self._check_acc(dt)
        with self._h.lock:
            k = self._kernel(_DTYPES[dt], device)
            nargs_c = lib.sr_kernel_nargs(k)
            out_dim = lib.sr_kernel_out_dim(k)
            run, values, idx, nout = self._run_desc(arrays, dt, nx, ny, nargs_c, out_dim)
            if rg is None:
                st = lib.sr_kernel_run_ex(k, ctypes.byref(run))
            else:
                st = lib.sr_kernel_run_ranges(k, ctypes.byref(run), ctypes.byref(rg[0]))
            check(st, self._h.ctx)
        return self._shape_output(values, idx, nout)

    def _run_desc(self, arrays, dt, nx, ny, nargs_c, out_dim):
        """The sr_run_desc of a call (ctypes keeps its pointer array alive), the output arrays
        it points to, and the number of output rows."""
        nout = nx if self.axis == 1 else ny
        red = self.reduction_op
        values = idx = None
        if red not in _INDEX_ONLY:
            values = np.empty((nout, out_dim), dtype=dt)
        if red in _INDEX_ONLY or red in _VALUES_AND_INDICES:
            idx = np.empty((nout, out_dim), dtype=np.int64)
        ptrs = (ctypes.c_void_p * max(1, nargs_c))(
            *[a.ctypes.data if a is not None else None for a in arrays[:nargs_c]]
        )
        run = RunDesc(
            nx=nx,
            ny=ny,
            nargs=nargs_c,
            args=ptrs,
            out=values.ctypes.data if values is not None else None,
            out_idx=idx.ctypes.data if idx is not None else None,
        )
        return run, values, idx, nout

    def _shape_output(self, values, idx, nout):
        red = self.reduction_op
        if red in _K_REDUCTIONS:
            K = self.opt_arg

            def kd(a):
                a = a.reshape(nout, K, -1)
                return a[:, :, 0] if a.shape[2] == 1 else a

            if red == "KMin":
                return kd(values)
            if red == "ArgKMin":
                return kd(idx)
            return kd(values), kd(idx)
        if red in _VALUES_AND_INDICES:
            return values, idx
        if red in _INDEX_ONLY:
            return idx
        return values
