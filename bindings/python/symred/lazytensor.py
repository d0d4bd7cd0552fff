"""LazyTensor: symbolic arrays with pykeops' shape convention, reduced through Genred.

A LazyTensor holds its formula as a tree of KeOps text pieces and variables (the arrays
behind them). Nothing is computed until a reduction (``.sum(dim=1)``, ``.argKmin(K, dim=0)``,
...): then the tree is written out as text with its variables named ``a0, a1, ...`` in order of
appearance and declared as aliases, and the text goes to the C parser through a
:class:`~symred.Genred` (cached per formula, so a loop that rebuilds the same expression reuses
the same kernel). Python only writes formula text; it never reads any.
"""

import itertools
import math
import os
import threading
from collections import OrderedDict

import numpy as np

from .cluster import swap_axes
from .genred import _DTYPE_NAMES, _DTYPES, Genred
from .solve import KernelSolve

__all__ = ["LazyTensor", "ComplexLazyTensor", "Vi", "Vj", "Pm"]

_I, _J, _P = 0, 1, 2
_CAT_TEXT = {_I: "Vi", _J: "Vj", _P: "Pm"}
_serial = itertools.count()

# Keyword arguments of a reduction that configure the Genred, and those of its call.
_INIT_KWARGS = ("dtype_acc", "use_double_acc", "sum_scheme", "enable_chunks", "use_fast_math")
_CALL_KWARGS = ("backend", "device_id", "ranges", "out")

_cache = OrderedDict()
_cache_lock = threading.Lock()
_CACHE_SIZE = 128


def _env_key():
    """The SYMRED_* environment: a Genred's context reads it once, when the Genred is made, so
    a cached Genred is reused only under the same environment."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("SYMRED_")))


def _genred(cls, formula, aliases, red, axis, K, formula2, init_kwargs):
    key = (cls, formula, tuple(aliases), red, axis, K, formula2,
           tuple(sorted(init_kwargs.items())), _env_key())
    with _cache_lock:
        g = _cache.get(key)
        if g is not None:
            _cache.move_to_end(key)
            return g
    g = cls(formula, aliases, reduction_op=red, axis=axis, opt_arg=K, formula2=formula2,
               **init_kwargs)
    with _cache_lock:
        _cache[key] = g
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return g


class _Leaf:
    """One array (or list of numbers, for a parameter) behind a LazyTensor, or a symbolic
    variable (no data; ``index``: its argument's position in the reduction's call). ``token``
    identifies it (the key of LazyTensor.leaves)."""

    __slots__ = ("token", "data", "cat", "dim", "index")

    def __init__(self, data, cat, dim, index=None):
        self.token = next(_serial)
        self.data, self.cat, self.dim, self.index = data, cat, dim, index


# A formula is a term tree: a str (KeOps text), a _Leaf (a variable, named when the formula is
# written out), or a tuple of terms written one after the other. Operations nest trees without
# copying them; a subtree may be shared.


def _render(tree, name):
    """The KeOps text of a term tree, each variable written as ``name(leaf)``, in order."""
    out, stack = [], [tree]
    while stack:
        t = stack.pop()
        if isinstance(t, str):
            out.append(t)
        elif isinstance(t, _Leaf):
            out.append(name(t))
        else:
            stack.extend(reversed(t))
    return "".join(out)


def _map_leaves(tree, f):
    """The term tree with each variable ``leaf`` replaced by ``f(leaf)`` (shared subtrees stay
    shared)."""
    if not isinstance(tree, tuple):
        return f(tree) if isinstance(tree, _Leaf) else tree
    done, stack = {}, [(tree, False)]
    while stack:
        t, ready = stack.pop()
        if id(t) in done:
            continue
        if ready:
            done[id(t)] = tuple(done[id(c)] if isinstance(c, tuple)
                                else f(c) if isinstance(c, _Leaf) else c for c in t)
        else:
            stack.append((t, True))
            stack.extend((c, False) for c in t if isinstance(c, tuple))
    return done[id(tree)]


def _namer():
    """A ``name`` for :func:`_render` naming the variables a0, a1, ... in order of first
    appearance, and the dict token -> name and the list of leaves it fills."""
    names, leaves = {}, []

    def name(leaf):
        n = names.get(leaf.token)
        if n is None:
            n = names[leaf.token] = f"a{len(names)}"
            leaves.append(leaf)
        return n

    return name, names, leaves


class Reduction:
    """A reduction that has not run: what a LazyTensor reduction returns with ``call=False``,
    or when its formula holds symbolic variables (``Vi(index, dim)``, ...), as pykeops does.
    Calling it runs it: ``red(*arrays, **kwargs)``, one array per symbolic variable in index
    order (none without symbolic variables), then the call keywords (``backend``, ``ranges``,
    ``out``, ...), which override those given to the reduction. ``genred`` is the Genred (or
    KernelSolve) it calls, with the LazyTensor's own arrays after the symbolic ones; ``callfun``
    is the same object under pykeops' name."""

    def __init__(self, genred, arrays, kwargs, post=None):
        self.genred, self._arrays, self._kwargs = genred, list(arrays), dict(kwargs)
        self._post = post  # applied to the result (complex LazyTensors: the complex view)

    def __call__(self, *args, **kwargs):
        res = self.genred(*args, *self._arrays, **dict(self._kwargs, **kwargs))
        return self._post(res) if self._post is not None else res

    @property
    def callfun(self):
        return self.genred

    def __repr__(self):
        return f"symred Reduction: {self.genred!r}"


def _params_only(lt):
    """Whether a LazyTensor's data are parameters only (no i or j variable)."""
    return all(leaf.cat == _P for leaf in lt.leaves.values())


def _is_int(x):
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_float(x):
    return isinstance(x, (float, np.floating))


def _const_text(v):
    """KeOps text of a Python number: IntCst(n) for integers, a real literal otherwise."""
    if _is_int(v):
        v = int(v)
        if abs(v) >= 2**63:
            raise ValueError(f"integer constant {v} does not fit in 64 bits")
        return f"IntCst({v})" if v >= 0 else f"(-IntCst({-v}))"
    v = float(v)
    if not math.isfinite(v):
        raise ValueError(f"constant {v} is not finite; pass it as a parameter array instead")
    if math.copysign(1.0, v) < 0:
        return f"(-{-v!r})"
    return repr(v)


def _is_complex_number(x):
    return isinstance(x, (complex, np.complexfloating))


def _check_array_dtype(a, what):
    if a.dtype not in _DTYPES:
        raise TypeError(f"{what}: dtype {a.dtype.name} is not supported; use {_DTYPE_NAMES}")


class LazyTensor:
    """A symbolic array with pykeops' shape convention.

    ``LazyTensor(x)`` with ``x`` of shape ``(n, 1, d)`` (``x[:, None, :]``) is indexed by i,
    ``(1, m, d)`` (``y[None, :, :]``) by j, ``(1, 1, d)``, ``(d,)`` or a scalar array is a
    parameter; a 2-D ``(n, d)`` array needs ``axis=0`` (i) or ``axis=1`` (j). A Python int is
    the constant IntCst(n) and a Python float a real constant; a list of numbers is a
    parameter. Arrays must be float32, float64, float16 or bfloat16 (ml_dtypes), all of one
    dtype.

    Operations build a formula (:attr:`formula` shows it as KeOps text); reductions over
    ``dim=0`` (i, one result per j) or ``dim=1`` (j, one result per i) run it and return NumPy
    arrays shaped as :class:`~symred.Genred` documents (indices in int64). With B leading batch dimensions
    (arrays of shape (B.., n, 1, d), ...), those are ``dim=B`` and ``dim=B+1``, as in pykeops
    (docs/pykeops.md).
    """

    # NumPy must leave `array + lazytensor` to our reflected operators.
    __array_ufunc__ = None

    # The array type and its Genred; symred.torch.LazyTensor overrides these.
    _ARRAY_TYPE = np.ndarray
    _ARRAY_NAME = "NumPy array"
    _GENRED = Genred
    _KERNELSOLVE = KernelSolve

    # A complex LazyTensor holds (re, im) pairs of interleaved reals: its class, set below.
    _COMPLEX = None
    _REAL = None
    is_complex = False

    def __new__(cls, x=None, axis=None):
        # A binding without a complex class of its own (symred.jax) refuses complex data in
        # _normalize_array instead.
        if not cls.is_complex and cls._COMPLEX is not None and issubclass(cls._COMPLEX, cls) \
                and cls._complex_data(x):
            return object.__new__(cls._COMPLEX)
        return object.__new__(cls)

    @classmethod
    def _complex_data(cls, x):
        """Whether x (an array, a number or a list of numbers) holds complex values."""
        if isinstance(x, cls._ARRAY_TYPE):
            return cls._array_is_complex(x)
        if isinstance(x, (list, tuple)):
            return any(_is_complex_number(v) for v in x)
        return _is_complex_number(x)

    @staticmethod
    def _array_is_complex(x):
        return x.dtype.kind == "c"

    @staticmethod
    def _normalize_array(x):
        """The array in native byte order, or TypeError if symred does not take its dtype."""
        if x.dtype.kind == "f" and x.dtype.itemsize in (2, 4, 8) and not x.dtype.isnative:
            x = x.astype(x.dtype.newbyteorder("="))
        _check_array_dtype(x, f"LazyTensor(array of shape {x.shape})")
        return x

    @staticmethod
    def _dtype_name(dt):
        return dt.name

    @staticmethod
    def _param_array(values, dt):
        return np.asarray(values, dtype=dt if dt is not None else np.float32)

    def __init__(self, x=None, axis=None):
        self._f = None  # the formula's term tree
        self.ndim = None
        self.leaves = {}
        self.ni = None
        self.nj = None
        self.dtype = None
        # pykeops' block-sparse ranges (a 6-tuple, symred.numpy.cluster): set by the user
        # (K.ranges = ...), kept through operations, used by reductions without ranges=.
        self.ranges = None
        if x is None:
            return
        if isinstance(x, LazyTensor):
            self._copy_from(x)
            return
        if isinstance(x, (bool, np.bool_)):
            raise TypeError("LazyTensor: a bool is not a number; use 0 or 1")
        if isinstance(x, tuple) and len(x) == 3 and all(
                _is_int(v) and not isinstance(v, (bool, np.bool_)) for v in x):
            # pykeops' (index, dim, cat): a symbolic variable, given when the reduction runs.
            if axis is not None:
                raise ValueError("LazyTensor((index, dim, cat)): axis must not be given")
            self._symbolic(*(int(v) for v in x))
            return
        if _is_int(x) or _is_float(x):
            if axis not in (None, 2):
                raise ValueError("LazyTensor: a number is a constant; axis must be None")
            self._f = _const_text(x)
            self.ndim = 1
            return
        if isinstance(x, (list, tuple)):
            if axis not in (None, 2):
                raise ValueError("LazyTensor: a list of numbers is a parameter; axis must be "
                                 "None or 2")
            if not x or not all((_is_int(v) or _is_float(v)) and not isinstance(v, bool)
                                for v in x):
                raise TypeError("LazyTensor: a list must hold one or more numbers")
            self._leaf(list(x), _P, len(x))
            return
        if not isinstance(x, self._ARRAY_TYPE):
            raise TypeError(f"LazyTensor expects a {self._ARRAY_NAME}, a number or a list of "
                            f"numbers, not {type(x).__name__}")
        x = self._normalize_array(x)
        shape = tuple(x.shape)
        if x.ndim == 3:
            if axis is not None:
                raise ValueError("LazyTensor: axis must not be given for a 3-D array; its shape "
                                 "(n,1,d), (1,m,d) or (1,1,d) says the category")
            if shape[0] == 1 and shape[1] == 1:
                self._leaf(x.reshape(shape[2]), _P, shape[2])
            elif shape[1] == 1:
                self._leaf(x.reshape(shape[0], shape[2]), _I, shape[2])
            elif shape[0] == 1:
                self._leaf(x.reshape(shape[1], shape[2]), _J, shape[2])
            else:
                raise ValueError(f"LazyTensor: a 3-D array must have shape (n,1,d) (i), (1,m,d) "
                                 f"(j) or (1,1,d) (parameter), got {shape}")
        elif x.ndim == 2:
            if isinstance(axis, bool) or axis not in (0, 1):
                raise ValueError(f"LazyTensor: a 2-D array of shape {shape} needs axis=0 (i) or "
                                 f"axis=1 (j); or pass x[:, None, :] or x[None, :, :]")
            self._leaf(x, axis, shape[1])
        elif x.ndim <= 1:
            if axis not in (None, 2):
                raise ValueError("LazyTensor: a 0-D or 1-D array is a parameter; axis must be "
                                 "None or 2")
            x = x.reshape(-1)
            if x.shape[0] == 0:
                raise ValueError("LazyTensor: a parameter needs at least one value")
            self._leaf(x, _P, x.shape[0])
        else:
            # Batch dimensions (pykeops): (B.., n, 1, d) i, (B.., 1, m, d) j, (B.., 1, 1, d) a
            # parameter per batch; reductions run the batches as one launch (Genred).
            if axis is not None:
                raise ValueError("LazyTensor: axis must not be given for an array with batch "
                                 "dimensions; its shape (B.., n,1,d), (B.., 1,m,d) or (B.., 1,1,d) "
                                 "says the category")
            bs, (n, m, d) = shape[:-3], shape[-3:]
            if n == 1 and m == 1:
                self._leaf(x.reshape(bs + (d,)), _P, d)
            elif m == 1:
                self._leaf(x.reshape(bs + (n, d)), _I, d)
            elif n == 1:
                self._leaf(x.reshape(bs + (m, d)), _J, d)
            else:
                raise ValueError(f"LazyTensor: an array with batch dimensions must have shape "
                                 f"(B.., n,1,d) (i), (B.., 1,m,d) (j) or (B.., 1,1,d) "
                                 f"(parameter), got {shape}")
        if self.ndim == 0:
            raise ValueError(f"LazyTensor: the last dimension of an array of shape {shape} must "
                             f"be at least 1")
        self.dtype = x.dtype

    def _symbolic(self, index, dim, cat):
        if index < 0 or dim < 1 or cat not in (_I, _J, _P):
            raise ValueError(f"a symbolic variable needs an index >= 0, a dimension >= 1 and a "
                             f"category 0 (i), 1 (j) or 2 (parameter); got index {index}, "
                             f"dim {dim}, cat {cat}")
        leaf = _Leaf(None, cat, dim, index)
        self.leaves = {leaf.token: leaf}
        self._f = leaf
        self.ndim = dim

    def _leaf(self, data, cat, dim):
        leaf = _Leaf(data, cat, dim)
        self.leaves = {leaf.token: leaf}
        self._f = leaf
        self.ndim = dim
        if cat == _I:
            self.ni = data.shape[-2]
        elif cat == _J:
            self.nj = data.shape[-2]

    def _copy_from(self, other):
        self._f, self.ndim = other._f, other.ndim
        self.leaves = dict(other.leaves)
        self.ni, self.nj, self.dtype = other.ni, other.nj, other.dtype
        self.ranges = other.ranges

    # ---- combining ---------------------------------------------------------------------------

    @classmethod
    def _wrap(cls, x):
        return x if isinstance(x, LazyTensor) else cls._real_cls()(x)

    @classmethod
    def _real_cls(cls):
        """The real LazyTensor class of this binding (its constructor picks the complex class
        for complex data)."""
        return cls._REAL if cls.is_complex else cls

    def _retype(self, complex_):
        """A copy of self as a real or a complex LazyTensor of this binding."""
        cls = self._real_cls()
        if complex_ and not (cls._COMPLEX is not None and issubclass(cls._COMPLEX, cls)):
            raise TypeError(f"complex LazyTensors are not supported by {cls.__module__}")
        res = (cls._COMPLEX if complex_ else cls).__new__(cls._COMPLEX if complex_ else cls)
        LazyTensor.__init__(res)
        res._copy_from(self)
        return res

    def _unary_to(self, name, dimres, complex_):
        """The op name applied to self, as a real or complex LazyTensor of dimension dimres."""
        res = self._retype(complex_)
        res._f = (f"{name}(", self._f, ")")
        res.ndim = dimres
        return res

    def real2complex(self):
        """``x + 0i``: a :class:`ComplexLazyTensor` (KeOps' Real2Complex)."""
        return self._unary_to("Real2Complex", 2 * self.ndim, True)

    def imag2complex(self):
        """``0 + x i``: a :class:`ComplexLazyTensor` (KeOps' Imag2Complex)."""
        return self._unary_to("Imag2Complex", 2 * self.ndim, True)

    def exp1j(self):
        """``exp(i x) = cos x + i sin x``: a :class:`ComplexLazyTensor` (KeOps' ComplexExp1j)."""
        return self._unary_to("ComplexExp1j", 2 * self.ndim, True)

    def _complex_operand(self, o):
        """Whether o makes a binary operation with self complex."""
        return (isinstance(o, LazyTensor) and o.is_complex) or \
            (not isinstance(o, LazyTensor) and self._complex_data(o))

    def _join(self, *others):
        res = type(self)()
        res._copy_from(self)
        for o in others:
            for attr, what in (("ni", "rows indexed by i"), ("nj", "rows indexed by j")):
                a, b = getattr(res, attr), getattr(o, attr)
                if a is not None and b is not None and a != b:
                    raise ValueError(f"incompatible LazyTensors: {a} and {b} {what}")
                if a is None:
                    setattr(res, attr, b)
            if res.dtype is not None and o.dtype is not None and res.dtype != o.dtype:
                # Parameters follow the variables' dtype (converted when the reduction runs,
                # as Genred converts them); only variables of two dtypes are an error.
                if _params_only(o):
                    o = o._with_dtype(res.dtype)
                elif _params_only(res):
                    res.dtype = o.dtype
            if res.dtype is not None and o.dtype is not None and res.dtype != o.dtype:
                raise TypeError(f"mixed dtypes: {self._dtype_name(res.dtype)} and "
                                f"{self._dtype_name(o.dtype)}; convert the arrays to one of "
                                f"{_DTYPE_NAMES}")
            if res.dtype is None:
                res.dtype = o.dtype
            if res.ranges is None:
                res.ranges = o.ranges
            res.leaves.update(o.leaves)
        return res

    def _with_dtype(self, dt):
        res = type(self)()
        res._copy_from(self)
        res.dtype = dt
        return res

    def _unary(self, name, dimres=None, *attrs):
        res = type(self)()
        res._copy_from(self)
        extra = "".join(f",{a}" for a in attrs)
        res._f = (f"{name}(", self._f, extra + ")")
        res.ndim = self.ndim if dimres is None else dimres
        return res

    def _operands(self, others, check, opname):
        ops = [self] + [self._wrap(o) for o in others]
        dims = [o.ndim for o in ops]
        if check == "sameor1" and len(set(dims) - {1}) > 1:
            raise ValueError(f"{opname}: operands must have the same dimension or dimension 1, "
                             f"got {', '.join(map(str, dims))}")
        if check == "same" and len(set(dims)) > 1:
            raise ValueError(f"{opname}: operands must have the same dimension, got "
                             f"{', '.join(map(str, dims))}")
        return ops

    def _function(self, name, others, dimres=None, check="sameor1", attrs=()):
        ops = self._operands(others, check, name)
        res = ops[0]._join(*ops[1:])
        extra = "".join(f",{a}" for a in attrs)
        parts = [f"{name}("]
        for k, o in enumerate(ops):
            parts += [",", o._f] if k else [o._f]
        res._f = tuple(parts) + (extra + ")",)
        res.ndim = max(o.ndim for o in ops) if dimres is None else dimres
        return res

    def _infix(self, op, other, reverse=False, check="sameor1", dimres=None):
        if op in "+-*/" and self._complex_operand(other):
            return self.real2complex()._infix(op, other, reverse)
        a, b = self._operands([other], check, repr(op))
        if reverse:
            a, b = b, a
        res = a._join(b)
        res._f = ("(", a._f, op, b._f, ")")
        res.ndim = max(a.ndim, b.ndim) if dimres is None else dimres
        return res

    # ---- arithmetic --------------------------------------------------------------------------

    def __add__(self, o):
        return self._infix("+", o)

    def __radd__(self, o):
        return self._infix("+", o, reverse=True)

    def __sub__(self, o):
        return self._infix("-", o)

    def __rsub__(self, o):
        return self._infix("-", o, reverse=True)

    def __mul__(self, o):
        return self._infix("*", o)

    def __rmul__(self, o):
        return self._infix("*", o, reverse=True)

    def __truediv__(self, o):
        return self._infix("/", o)

    def __rtruediv__(self, o):
        return self._infix("/", o, reverse=True)

    def __neg__(self):
        res = type(self)()
        res._copy_from(self)
        res._f = ("(-", self._f, ")")
        return res

    def __pos__(self):
        return self

    def __abs__(self):
        return self._unary("Abs")

    def __or__(self, o):
        """``(x | y)``: the scalar product of two vectors of equal dimension."""
        return self._infix("|", o, check="same", dimres=1)

    def __ror__(self, o):
        return self._infix("|", o, reverse=True, check="same", dimres=1)

    def __pow__(self, o):
        """``x**n`` (integer n: Pow, n = 2: Square), ``x**0.5`` (Sqrt), ``x**-0.5`` (Rsqrt),
        another real or a LazyTensor: Powf."""
        if isinstance(o, (bool, np.bool_)):
            raise TypeError("the exponent must be a number or a LazyTensor, not a bool")
        if _is_float(o) and float(o).is_integer() and abs(o) < 2**31:
            o = int(o)
        if _is_int(o):
            if not -(2**31) <= o < 2**31:
                raise ValueError(f"integer exponent {o} is out of range")
            return self._unary("Square") if o == 2 else self._unary("Pow", None, int(o))
        if _is_float(o):
            if o == 0.5:
                return self._unary("Sqrt")
            if o == -0.5:
                return self._unary("Rsqrt")
        if isinstance(o, LazyTensor) or _is_float(o) or isinstance(o, self._ARRAY_TYPE):
            return self._function("Powf", [o])
        raise TypeError(f"the exponent must be a number or a LazyTensor, not {type(o).__name__}")

    def __rpow__(self, o):
        return self._wrap(o)._function("Powf", [self])

    def power(self, o):
        return self**o

    # Comparisons give 1.0 or 0.0. == and != are not overloaded, so that LazyTensors stay
    # hashable; use .equal() and .notequal().
    def __lt__(self, o):
        return self._function("Less", [o])

    def __le__(self, o):
        return self._function("LessEq", [o])

    def __gt__(self, o):
        return self._function("Greater", [o])

    def __ge__(self, o):
        return self._function("GreaterEq", [o])

    def equal(self, o):
        return self._function("Equal", [o])

    def notequal(self, o):
        return self._function("NotEqual", [o])

    # ---- elementwise functions ---------------------------------------------------------------

    def exp(self):
        return self._unary("Exp")

    def log(self):
        return self._unary("Log")

    def xlogx(self):
        return self._unary("XLogX")

    def sqrt(self):
        return self._unary("Sqrt")

    def rsqrt(self):
        return self._unary("Rsqrt")

    def square(self):
        return self._unary("Square")

    def inv(self):
        return self._unary("Inv")

    def sin(self):
        return self._unary("Sin")

    def cos(self):
        return self._unary("Cos")

    def asin(self):
        return self._unary("Asin")

    def acos(self):
        return self._unary("Acos")

    def atan(self):
        return self._unary("Atan")

    def atan2(self, x):
        return self._function("Atan2", [x])

    def abs(self):
        return self._unary("Abs")

    def sign(self):
        return self._unary("Sign")

    def step(self):
        return self._unary("Step")

    def relu(self):
        return self._unary("ReLU")

    def floor(self):
        return self._unary("Floor")

    def sinxdivx(self):
        return self._unary("SinXDivX")

    def sinc(self):
        """torch's normalised sinc: sin(pi x) / (pi x), 1 at x = 0 (SinXDivX of pi x)."""
        return (math.pi * self).sinxdivx()

    def round(self, decimals=0):
        if not _is_int(decimals):
            raise TypeError("round: decimals must be an int")
        return self._unary("Round", None, int(decimals))

    def clamp(self, lo, hi):
        """Clamps to [lo, hi]; ClampInt when both bounds are ints."""
        if _is_int(lo) and _is_int(hi):
            return self._unary("ClampInt", None, int(lo), int(hi))
        return self._function("Clamp", [lo, hi])

    def ifelse(self, a, b):
        """``a`` where self >= 0, else ``b``."""
        return self._function("IfElse", [a, b])

    def mod(self, modulus, offset=0):
        """``self - modulus * floor((self - offset) / modulus)``."""
        return self._function("Mod", [modulus, offset])

    # ---- vector operations -------------------------------------------------------------------

    def sqnorm2(self):
        return self._unary("SqNorm2", 1)

    def norm2(self):
        return self._unary("Norm2", 1)

    def norm(self, dim=-1):
        if dim not in (-1, 2):
            raise ValueError("norm: only the last dimension (-1) is supported")
        return self.norm2()

    def normalize(self):
        return self._unary("Normalize")

    def sqdist(self, other):
        return self._function("SqDist", [other], dimres=1, check="same")

    def weightedsqnorm(self, w):
        """``WeightedSqNorm(w, self)``: w of dimension 1, D (diagonal) or D*D (full)."""
        w = self._wrap(w)
        D = self.ndim
        if w.ndim not in (1, D, D * D):
            raise ValueError(f"weightedsqnorm: weights must have dimension 1, {D} or {D * D} "
                             f"for a vector of dimension {D}, got {w.ndim}")
        return w._function("WeightedSqNorm", [self], dimres=1, check=None)

    def weightedsqdist(self, g, w):
        """``WeightedSqDist(w, self, g)``, i.e. ``(self - g).weightedsqnorm(w)``."""
        w, g = self._wrap(w), self._wrap(g)
        D = self.ndim
        if g.ndim != D:
            raise ValueError(f"weightedsqdist: both vectors must have dimension {D}, got {g.ndim}")
        if w.ndim not in (1, D, D * D):
            raise ValueError(f"weightedsqdist: weights must have dimension 1, {D} or {D * D}, "
                             f"got {w.ndim}")
        return w._function("WeightedSqDist", [self, g], dimres=1, check=None)

    def elem(self, m):
        if not _is_int(m) or not 0 <= m < self.ndim:
            raise ValueError(f"elem: index {m!r} is out of [0, {self.ndim})")
        return self._unary("Elem", 1, int(m))

    def extract(self, start, length):
        if not (_is_int(start) and _is_int(length)):
            raise TypeError("extract: start and length must be ints")
        if start < 0 or length < 1 or start + length > self.ndim:
            raise ValueError(f"extract: [{start}, {start + length}) is not inside "
                             f"[0, {self.ndim})")
        return self._unary("Extract", int(length), int(start), int(length))

    def __getitem__(self, key):
        """``x[k]`` is elem(k), ``x[a:b]`` is extract(a, b - a): the last dimension only."""
        if isinstance(key, tuple):
            # pykeops' forms: x[:, :, k], and with B batch dimensions x[:, ..(B + 2).., :, k].
            n = len(self._shape)
            if len(key) == n and all(isinstance(k, slice) and k == slice(None) for k in key[:-1]):
                key = key[-1]
            else:
                raise ValueError(f"LazyTensor indexing works on the last dimension only: "
                                 f"x[k], x[a:b], or with all {n - 1} leading axes ':' "
                                 f"(x[{':, ' * (n - 1)}k])")
        if isinstance(key, slice):
            if key.step not in (None, 1):
                raise ValueError("LazyTensor slices must have step 1")
            start = 0 if key.start is None else key.start
            stop = self.ndim if key.stop is None else key.stop
            return self.extract(start, stop - start)
        if _is_int(key):
            return self.elem(key)
        raise TypeError("LazyTensor indices must be ints or slices")

    def concat(self, other):
        other = self._wrap(other)
        return self._function("Concat", [other], dimres=self.ndim + other.ndim, check=None)

    def onehot(self, D):
        if not _is_int(D) or D < 1:
            raise ValueError(f"onehot: the dimension must be a positive int, not {D!r}")
        if self.ndim != 1:
            raise ValueError(f"onehot: the operand must be a scalar, got dimension {self.ndim}")
        return self._unary("OneHot", int(D), int(D))

    one_hot = onehot

    def matvecmult(self, v):
        """self is an m×n matrix (dimension m*n, row-major), v has n: result m."""
        v = self._wrap(v)
        if self.ndim % v.ndim:
            raise ValueError(f"matvecmult: a matrix of dimension {self.ndim} cannot multiply a "
                             f"vector of dimension {v.ndim}")
        return self._function("MatVecMult", [v], dimres=self.ndim // v.ndim, check=None)

    def vecmatmult(self, A):
        """self has m, A is m×n (dimension m*n, row-major): result n."""
        A = self._wrap(A)
        if A.ndim % self.ndim:
            raise ValueError(f"vecmatmult: a vector of dimension {self.ndim} cannot multiply a "
                             f"matrix of dimension {A.ndim}")
        return self._function("VecMatMult", [A], dimres=A.ndim // self.ndim, check=None)

    def tensorprod(self, other):
        other = self._wrap(other)
        return self._function("TensorProd", [other], dimres=self.ndim * other.ndim, check=None)

    @staticmethod
    def _int_list(seq, what):
        seq = (seq,) if _is_int(seq) else tuple(seq)
        if not all(_is_int(v) for v in seq):
            raise TypeError(f"{what} must be a sequence of ints, not {seq!r}")
        return tuple(int(v) for v in seq), "[" + ",".join(str(int(v)) for v in seq) + "]"

    def keops_tensordot(self, other, dimfa, dimfb, contfa, contfb, *args):
        """pykeops' ``keops_tensordot``: self and other are row-major tensors of shapes dimfa and
        dimfb (flattened in their last dimension); axes contfa of self are contracted with axes
        contfb of other (as ``numpy.tensordot(a, b, (contfa, contfb))``); an optional permute
        puts kept axis k (self's, then other's) at output position permute[k]. The result is
        the flattened output."""
        other = self._wrap(other)
        if len(args) > 1:
            raise TypeError("keops_tensordot takes at most one permutation after contfb")
        lists = [self._int_list(v, w) for v, w in ((dimfa, "dimfa"), (dimfb, "dimfb"),
                                                     (contfa, "contfa"), (contfb, "contfb"))
                 + tuple((a, "permute") for a in args)]
        (da, _), (db, _), (ca, _), (cb, _) = lists[:4]
        for dims, t, name in ((da, self, "dimfa"), (db, other, "dimfb")):
            if int(np.prod(dims, dtype=np.int64)) != t.ndim:
                raise ValueError(f"keops_tensordot: {name} {dims} holds "
                                 f"{int(np.prod(dims, dtype=np.int64))} components, the "
                                 f"operand has {t.ndim}")
        if len(ca) != len(cb):
            raise ValueError(f"keops_tensordot: {len(ca)} contracted axes of self but {len(cb)} "
                             f"of other")
        try:
            cont = int(np.prod([da[k] for k in ca], dtype=np.int64))
        except IndexError:
            raise ValueError(f"keops_tensordot: contfa {ca} is out of range for {len(da)} axes")
        dimres = self.ndim * other.ndim // (cont * cont)
        return self._function("TensorDot", [other], dimres=dimres, check=None,
                              attrs=[text for _, text in lists])

    def keops_kron(self, other, dimfself, dimfother):
        """pykeops' ``keops_kron``: the Kronecker product (``numpy.kron``) of self and other
        viewed as tensors of equal rank with shapes dimfself and dimfother, flattened."""
        other = self._wrap(other)
        (da, ta), (db, tb) = (self._int_list(dimfself, "dimfself"),
                              self._int_list(dimfother, "dimfother"))
        if len(da) != len(db):
            raise ValueError(f"keops_kron: shapes {da} and {db} have different ranks")
        return self._function("Kron", [other], dimres=self.ndim * other.ndim, check=None,
                              attrs=(ta, tb))

    def _wrt(self, name, var, dimres):
        if not isinstance(var, LazyTensor) or not isinstance(var._f, _Leaf):
            raise ValueError(f"{name}: the second argument must be a variable (Vi, Vj or Pm), "
                             f"not a formula")
        return self._function(name, [var], dimres=dimres, check=None)

    def grad_matrix(self, other):
        """pykeops' ``grad_matrix``: the Jacobian of self with respect to the variable other,
        row-major (row k: the gradient of component k), of dimension self.ndim * other.ndim."""
        return self._wrt("GradMatrix", other, self.ndim * other.ndim)

    def divergence(self, var):
        """pykeops' ``divergence``: sum_k d self_k / d var_k (equal dimensions)."""
        if self.ndim != var.ndim:
            raise ValueError(f"divergence: dimensions {self.ndim} and {var.ndim} must be equal")
        return self._wrt("Divergence", var, 1)

    def laplacian(self, var):
        """pykeops' ``laplacian``: the divergence of the gradient of a scalar self."""
        if self.ndim != 1:
            raise ValueError(f"laplacian: self must be a scalar, not of dimension {self.ndim}")
        return self._wrt("Laplacian", var, 1)

    # ---- reductions --------------------------------------------------------------------------

    def _axis(self, axis, dim):
        """The Genred axis (0: over i, 1: over j) of a reduction's ``dim``/``axis``, numbered
        as pykeops does: with B batch dimensions, B reduces over i and B + 1 over j; a
        negative value counts from the end of :attr:`shape` with the vector axis kept (-3: i,
        -2: j)."""
        ax = dim if dim is not None else axis
        B = self.nbatchdims
        k = ax + B + 3 if _is_int(ax) and ax < 0 else ax
        if isinstance(ax, bool) or not _is_int(ax) or k not in (B, B + 1):
            batch = f" for a LazyTensor with {B} batch dimensions" if B else ""
            raise ValueError(f"reduction dimension must be {B} (over i, one result per j) or "
                             f"{B + 1} (over j, one result per i){batch}, not {ax!r}")
        return int(k) - B

    def _is_vector_axis(self, axis, dim):
        """Whether ``sum(dim)``, ``min(dim)``, ... names the vector axis (-1, or the last one
        of :attr:`_shape`): then they are operations on the vector, not reductions."""
        ax = dim if dim is not None else axis
        return not isinstance(ax, bool) and _is_int(ax) and ax in (-1, len(self._shape) - 1)

    def _reduce(self, red, axis, dim, K=None, weight=None, kwargs=None):
        ax = self._axis(axis, dim)
        init_kwargs, call_kwargs = {}, {}
        kwargs = dict(kwargs or {})
        call = kwargs.pop("call", True)
        for key, val in kwargs.items():
            if key in _INIT_KWARGS:
                init_kwargs[key] = val
            elif key in _CALL_KWARGS:
                call_kwargs[key] = val
            else:
                raise TypeError(f"{red}: unexpected keyword argument {key!r}")
        src = self._join(weight) if weight is not None else self
        formula2 = weight._f if weight is not None else None
        if call_kwargs.get("ranges") is None and src.ranges is not None:
            call_kwargs["ranges"] = src.ranges
        (formula, formula2), aliases, arrays, _ = src._declare([self._f, formula2])
        g = _genred(self._GENRED, formula, aliases, red, ax, K, formula2, init_kwargs)
        if call and not src._has_symbolic():
            return g(*arrays, **call_kwargs)
        return Reduction(g, arrays, call_kwargs)

    def _has_symbolic(self):
        return any(leaf.index is not None for leaf in self.leaves.values())

    def _declare(self, formulas):
        """The term trees written out as formula text, the variables named a0, a1, ... in order
        of appearance; their aliases, their arrays, and the map from the leaves' tokens to
        their names."""
        name, names, leaves = _namer()
        out = [_render(f, name) if f is not None else None for f in formulas]
        symbolic = [l.index for l in leaves if l.index is not None]
        if not symbolic:
            aliases = [f"{names[l.token]}={_CAT_TEXT[l.cat]}({l.dim})" for l in leaves]
        else:
            # Symbolic variables keep their indices (the first arguments of the call); the
            # arrays' variables come after the largest, in order of appearance.
            nxt = itertools.count(1 + max(symbolic))
            aliases = [f"{names[l.token]}={_CAT_TEXT[l.cat]}("
                       f"{l.index if l.index is not None else next(nxt)},{l.dim})"
                       for l in leaves]
        # Without a dtype yet (symbolic variables only), numbers stay numbers: the call's
        # arrays decide their dtype.
        arrays = [l.data if isinstance(l.data, self._ARRAY_TYPE)
                  else self._param_array(l.data, self.dtype) if self.dtype is not None
                  else list(l.data) for l in leaves if l.index is None]
        return out, aliases, arrays, names

    def solve(self, other, var=None, alpha=1e-10, eps=1e-6, **kwargs):
        """a with (alpha I + K) a = other, K_ij = self (a symmetric kernel of x_i and x_j
        built on the same data), by conjugate gradients (pykeops' ``LazyTensor.solve`` and
        :class:`~symred.KernelSolve`): ``other`` is an (n, d) array, or a LazyTensor Vi of
        one; the result is an (n, d) array (with ``call=False``, a :class:`Reduction` that
        computes it when called). ``var`` (a symbolic unknown) is not supported.
        Keyword arguments: those of a reduction (backend, dtype_acc, ...), ``max_iter`` and
        ``check_symmetry`` (see KernelSolve.__call__)."""
        if self._KERNELSOLVE is None:
            raise NotImplementedError(f"solve is not supported by {type(self).__module__}")
        if var is not None:
            raise ValueError("solve: var= (a symbolic unknown) is not supported by symred")
        call = kwargs.pop("call", True)
        if isinstance(other, LazyTensor):
            leaf = other._f if isinstance(other._f, _Leaf) else None
            if leaf is None or leaf.cat != _I:
                raise ValueError("solve: the right-hand side must be an (n, d) array or a "
                                 "LazyTensor Vi of one, not a formula")
            other = leaf.data
        if not isinstance(other, self._ARRAY_TYPE) or other.ndim != 2:
            raise ValueError(f"solve: the right-hand side must be an (n, d) "
                             f"{self._ARRAY_NAME}")
        if self.ndim not in (1, other.shape[1]):
            raise ValueError(f"solve: the kernel has dimension {self.ndim}, the right-hand side "
                             f"{other.shape[1]} columns")
        init_kwargs, call_kwargs = {}, {}
        for key, val in kwargs.items():
            if key in _INIT_KWARGS:
                init_kwargs[key] = val
            elif key in _CALL_KWARGS + ("max_iter", "check_symmetry"):
                call_kwargs[key] = val
            else:
                raise TypeError(f"solve: unexpected keyword argument {key!r}")
        b = type(self)(other, axis=1)
        src = self._join(b)
        (formula,), aliases, arrays, names = src._declare([("(", self._f, ")*", b._f)])
        key = (self._KERNELSOLVE, formula, tuple(aliases), names[b._f.token],
               tuple(sorted(init_kwargs.items())), _env_key())
        with _cache_lock:
            ks = _cache.get(key)
        if ks is None:
            ks = self._KERNELSOLVE(formula, aliases, names[b._f.token], axis=1, **init_kwargs)
            with _cache_lock:
                _cache[key] = ks
                while len(_cache) > _CACHE_SIZE:
                    _cache.popitem(last=False)
        if not call:
            return Reduction(ks, arrays, dict(call_kwargs, alpha=alpha, eps=eps))
        return ks(*arrays, alpha=alpha, eps=eps, **call_kwargs)

    def sum(self, axis=-1, dim=None, **kwargs):
        """``sum(-1)`` (or the last axis of :attr:`_shape`): the sum of the components (a
        LazyTensor); ``sum(dim=B|B+1)``, B the number of batch dimensions: the Sum reduction
        over i or j (an array)."""
        if self._is_vector_axis(axis, dim):
            return self._unary("Sum", 1)
        return self._reduce("Sum", axis, dim, kwargs=kwargs)

    def min(self, axis=-1, dim=None, **kwargs):
        if self._is_vector_axis(axis, dim):
            return self._unary("Min", 1)
        return self._reduce("Min", axis, dim, kwargs=kwargs)

    def max(self, axis=-1, dim=None, **kwargs):
        if self._is_vector_axis(axis, dim):
            return self._unary("Max", 1)
        return self._reduce("Max", axis, dim, kwargs=kwargs)

    def argmin(self, axis=-1, dim=None, **kwargs):
        if self._is_vector_axis(axis, dim):
            return self._unary("ArgMin", 1)
        return self._reduce("ArgMin", axis, dim, kwargs=kwargs)

    def argmax(self, axis=-1, dim=None, **kwargs):
        if self._is_vector_axis(axis, dim):
            return self._unary("ArgMax", 1)
        return self._reduce("ArgMax", axis, dim, kwargs=kwargs)

    def min_argmin(self, axis=None, dim=None, **kwargs):
        return self._reduce("Min_ArgMin", axis, dim, kwargs=kwargs)

    def max_argmax(self, axis=None, dim=None, **kwargs):
        return self._reduce("Max_ArgMax", axis, dim, kwargs=kwargs)

    def Kmin(self, K, axis=None, dim=None, **kwargs):
        return self._reduce("KMin", axis, dim, K=K, kwargs=kwargs)

    def argKmin(self, K, axis=None, dim=None, **kwargs):
        return self._reduce("ArgKMin", axis, dim, K=K, kwargs=kwargs)

    def Kmin_argKmin(self, K, axis=None, dim=None, **kwargs):
        return self._reduce("KMin_ArgKMin", axis, dim, K=K, kwargs=kwargs)

    def logsumexp(self, axis=None, dim=None, weight=None, **kwargs):
        """``log sum exp(self)`` over i or j; with a ``weight`` w (a LazyTensor or array of
        any dimension; self scalar), ``log sum exp(self) * w``, componentwise in w.
        ``other=`` is another name for ``weight`` (pykeops accepts both)."""
        if "other" in kwargs:
            if weight is not None:
                raise TypeError("logsumexp: weight and other name the same argument; give one")
            weight = kwargs.pop("other")
        return self._reduce("LogSumExp", axis, dim,
                            weight=self._wrap(weight) if weight is not None else None,
                            kwargs=kwargs)

    def sumsoftmaxweight(self, weight, axis=None, dim=None, **kwargs):
        """``sum exp(self) * weight / sum exp(self)`` over i (dim=0) or j (dim=1); self must
        be scalar."""
        return self._reduce("SumSoftMaxWeight", axis, dim, weight=self._wrap(weight),
                            kwargs=kwargs)

    # pykeops' *_reduction names: always the reduction over i (dim=0) or j (dim=1), never the
    # componentwise Sum/Min/... of the vector.
    def sum_reduction(self, axis=None, dim=None, **kwargs):
        return self._reduce("Sum", axis, dim, kwargs=kwargs)

    def min_reduction(self, axis=None, dim=None, **kwargs):
        return self._reduce("Min", axis, dim, kwargs=kwargs)

    def max_reduction(self, axis=None, dim=None, **kwargs):
        return self._reduce("Max", axis, dim, kwargs=kwargs)

    def argmin_reduction(self, axis=None, dim=None, **kwargs):
        return self._reduce("ArgMin", axis, dim, kwargs=kwargs)

    def argmax_reduction(self, axis=None, dim=None, **kwargs):
        return self._reduce("ArgMax", axis, dim, kwargs=kwargs)

    def min_argmin_reduction(self, **kwargs):
        return self.min_argmin(**kwargs)

    def max_argmax_reduction(self, **kwargs):
        return self.max_argmax(**kwargs)

    def Kmin_reduction(self, **kwargs):
        return self.Kmin(**kwargs)

    def argKmin_reduction(self, **kwargs):
        return self.argKmin(**kwargs)

    def Kmin_argKmin_reduction(self, **kwargs):
        return self.Kmin_argKmin(**kwargs)

    def logsumexp_reduction(self, **kwargs):
        return self.logsumexp(**kwargs)

    def sumsoftmaxweight_reduction(self, **kwargs):
        return self.sumsoftmaxweight(**kwargs)

    # ---- linear operator ---------------------------------------------------------------------

    def __matmul__(self, v, **kwargs):
        """``K @ v``: the sum over j of K_ij v_j, for K of dimension 1 and v a 1-D array of m
        values (result: n values) or an array of shape (B.., m, e) (result (B.., n, e)).
        Keyword arguments (``K.__matmul__(v, backend=..., out=...)``) go to the reduction.
        A complex K (one complex component) with a real or complex v gives a complex result."""
        if self.ndim != (2 if self.is_complex else 1):
            raise ValueError(f"K @ v needs a LazyTensor K of dimension 1, got shape {self.shape}")
        if not isinstance(v, self._ARRAY_TYPE):
            return NotImplemented
        shape = tuple(v.shape)
        if len(shape) == 0:
            raise ValueError("K @ v: v must have at least one dimension")
        view = (1, shape[0], 1) if len(shape) == 1 else shape[:-2] + (1,) + shape[-2:]
        kv = self * self._real_cls()(v.reshape(view))
        res = kv.sum(kv.dim() - 2, **kwargs)
        return res.reshape(-1) if len(shape) == 1 else res

    def matvec(self, v):
        """``self @ v`` (scipy.sparse.linalg's LinearOperator name)."""
        return self @ v

    def rmatvec(self, v):
        """``self.T @ v``."""
        return self.T @ v

    def t(self):
        """The transpose: i-variables become j-variables and the other way round (shape
        (B.., nj, ni, d)); ranges are swapped."""
        res = type(self)()
        res._copy_from(self)
        res.ni, res.nj = self.nj, self.ni
        res.ranges = swap_axes(self.ranges)
        swapped, res.leaves = {}, {}
        for tok, leaf in self.leaves.items():
            if leaf.cat == _P:
                res.leaves[tok] = leaf
                continue
            new = _Leaf(leaf.data, _J if leaf.cat == _I else _I, leaf.dim, leaf.index)
            swapped[tok] = new
            res.leaves[new.token] = new
        res._f = _map_leaves(self._f, lambda leaf: swapped.get(leaf.token, leaf))
        return res

    @property
    def T(self):
        return self.t()

    # ---- description -------------------------------------------------------------------------

    @property
    def batchdims(self):
        """The batch dimensions: the broadcast of the leading dimensions of the arrays (beyond
        (n, d) for a variable, (d,) for a parameter); () when there are none."""
        shapes = []
        for leaf in self.leaves.values():
            if isinstance(leaf.data, self._ARRAY_TYPE):
                base = 1 if leaf.cat == _P else 2
                shapes.append(tuple(leaf.data.shape[: leaf.data.ndim - base]))
        return tuple(np.broadcast_shapes(*shapes)) if shapes else ()

    @property
    def nbatchdims(self):
        return len(self.batchdims)

    @property
    def _shape(self):
        """(B.., ni, nj, ndim): 1 for a missing index."""
        return self.batchdims + (self.ni or 1, self.nj or 1, self.ndim)

    @property
    def shape(self):
        """(B.., ni, nj, ndim) as pykeops reports it: 1 for a missing index, the last entry
        dropped when ndim is 1."""
        s = self._shape
        return s[:-1] if self.ndim == 1 else s

    def dim(self):
        """The number of axes of :attr:`_shape` (batch dimensions + 3), as pykeops."""
        return len(self._shape)

    @property
    def formula(self):
        """The formula as KeOps text, its variables named a0, a1, ... in order of appearance
        as a reduction declares them (None for an empty LazyTensor)."""
        return _render(self._f, _namer()[0]) if self._f is not None else None

    def __repr__(self):
        name, names, leaves = _namer()
        text = _render(self._f, name) if self._f is not None else ""
        decl = ", ".join(f"{names[l.token]}={_CAT_TEXT[l.cat]}({l.dim})" for l in leaves)
        dt = self._dtype_name(self.dtype) if self.dtype is not None else "any"
        return (f"symred LazyTensor\n    formula: {text}\n    variables: {decl or '(none)'}"
                f"\n    shape: {self.shape}\n    dtype: {dt}")

    __str__ = __repr__


class ComplexLazyTensor(LazyTensor):
    """A symbolic complex array (pykeops' ``ComplexLazyTensor``), made by :class:`LazyTensor`
    from complex64 / complex128 arrays or Python complex numbers, or by ``real2complex``,
    ``imag2complex`` and ``exp1j``. A complex vector of dimension d is held as 2d interleaved
    reals (re, im, ...), as in KeOps: complex arrays reach the library as float32 / float64 views
    of doubled width, and reductions come back as complex arrays. ``+ - * /`` use KeOps'
    ComplexAdd, ComplexSubtract, ComplexMult (ComplexRealScal by a real scalar) and
    ComplexDivide, a real operand being made complex first; ``real``, ``imag``, ``abs()``,
    ``angle()`` are real; ``conj()``, ``exp()``, ``sum(-1)`` (ComplexSum) and ``@`` are complex.
    Reductions: Sum only.
    """

    is_complex = True

    @classmethod
    def _normalize_array(cls, x):
        if not cls._array_is_complex(x):
            raise TypeError(f"ComplexLazyTensor(array of shape {tuple(x.shape)}): the array must "
                            f"be complex64 or complex128")
        return super()._normalize_array(cls._view_real(x))

    @staticmethod
    def _view_real(x):
        """A complex array as reals of doubled last dimension (a 0-D array as 2 values)."""
        if x.dtype not in (np.complex64, np.complex128):
            raise TypeError(f"ComplexLazyTensor: dtype {x.dtype.name} is not supported; use "
                            f"complex64 or complex128")
        x = np.ascontiguousarray(x.reshape(1) if x.ndim == 0 else x)
        if not x.dtype.isnative:
            x = x.astype(x.dtype.newbyteorder("="))
        return x.view(np.float32 if x.dtype == np.complex64 else np.float64)

    @staticmethod
    def _view_complex(x):
        """The reals (re, im, ...) of the last dimension as complex numbers."""
        x = np.ascontiguousarray(x)
        return x.view(np.complex64 if x.dtype == np.float32 else np.complex128)

    def __init__(self, x=None, axis=None):
        if isinstance(x, (list, tuple)) or _is_complex_number(x):
            vals = list(x) if isinstance(x, (list, tuple)) else [x]
            if not vals or not all((_is_int(v) or _is_float(v) or _is_complex_number(v))
                                   and not isinstance(v, bool) for v in vals):
                raise TypeError("ComplexLazyTensor: a list must hold one or more numbers")
            if axis not in (None, 2):
                raise ValueError("ComplexLazyTensor: numbers make a parameter; axis must be None "
                                 "or 2")
            x = [float(p) for v in vals for p in (complex(v).real, complex(v).imag)]
        elif _is_int(x) or _is_float(x):
            raise TypeError("ComplexLazyTensor: a real number is not complex; use complex(x)")
        super().__init__(x, axis)

    @property
    def shape(self):
        """As pykeops: the last entry counts complex components, dropped when there is one."""
        s = self._shape
        s = s[:-1] + (s[-1] // 2,)
        return s[:-1] if s[-1] == 1 else s

    # ---- arithmetic ----------------------------------------------------------------------------

    _COMPLEX_OPS = {"+": "ComplexAdd", "-": "ComplexSubtract", "*": "ComplexMult",
                    "/": "ComplexDivide"}

    def _infix(self, op, other, reverse=False, check="sameor1", dimres=None):
        name = self._COMPLEX_OPS.get(op)
        if name is None:
            raise TypeError(f"{op!r} is not defined for complex LazyTensors")
        if _is_complex_number(other):
            other = type(self)(other)
        other = self._wrap(other)
        if not other.is_complex:
            if op == "*" and other.ndim == 1:
                res = other._join(self)._retype(True)
                res._f = ("ComplexRealScal(", other._f, ",", self._f, ")")
                res.ndim = self.ndim
                return res
            other = other.real2complex()
        a, b = (other, self) if reverse else (self, other)
        if a.ndim != b.ndim and 2 not in (a.ndim, b.ndim):
            raise ValueError(f"{name}: complex operands must have the same dimension or one "
                             f"complex component, got {a.ndim // 2} and {b.ndim // 2}")
        res = a._join(b)._retype(True)
        res._f = (f"{name}(", a._f, ",", b._f, ")")
        res.ndim = max(a.ndim, b.ndim)
        return res

    def __pow__(self, o):
        raise TypeError("** is not defined for complex LazyTensors")

    __rpow__ = __pow__

    # ---- complex functions ---------------------------------------------------------------------

    @property
    def real(self):
        return self._unary_to("ComplexReal", self.ndim // 2, False)

    @property
    def imag(self):
        return self._unary_to("ComplexImag", self.ndim // 2, False)

    def angle(self):
        return self._unary_to("ComplexAngle", self.ndim // 2, False)

    def abs(self):
        return self._unary_to("ComplexAbs", self.ndim // 2, False)

    __abs__ = abs

    def conj(self):
        return self._unary_to("Conj", self.ndim, True)

    def exp(self):
        return self._unary_to("ComplexExp", self.ndim, True)

    def real2complex(self):
        raise ValueError("real2complex cannot be applied to a complex LazyTensor")

    def imag2complex(self):
        raise ValueError("imag2complex cannot be applied to a complex LazyTensor")

    def exp1j(self):
        raise ValueError("exp1j cannot be applied to a complex LazyTensor")

    def sum(self, axis=-1, dim=None, **kwargs):
        """``sum(-1)``: ComplexSum of the components; ``sum(dim=0|1)``: the Sum reduction, as a
        complex array."""
        if self._is_vector_axis(axis, dim):
            return self._unary_to("ComplexSum", 2, True)
        return self._reduce("Sum", axis, dim, kwargs=kwargs)

    def _reduce(self, red, axis, dim, K=None, weight=None, kwargs=None):
        if red != "Sum" or weight is not None:
            raise ValueError(f"{red}: complex LazyTensors have the Sum reduction only; reduce "
                             f".real, .imag or .abs() instead")
        res = super()._reduce(red, axis, dim, K, weight, kwargs)
        if isinstance(res, Reduction):
            return Reduction(res.genred, res._arrays, res._kwargs, post=self._view_complex)
        return self._view_complex(res)


LazyTensor._COMPLEX = ComplexLazyTensor
ComplexLazyTensor._REAL = LazyTensor


def _symbolic_var(cls, index, dim, cat):
    """``Vi(index, dim)``, ``Vj(index, dim)``, ``Pm(index, dim)``: pykeops' symbolic
    variables, whose arrays are given when the reduction runs."""
    name = _CAT_TEXT[cat]
    if not (_is_int(index) and _is_int(dim)) or isinstance(index, bool) or isinstance(dim, bool):
        raise TypeError(f"{name}(index, dim): index and dim must be ints, got "
                        f"{type(index).__name__} and {type(dim).__name__}")
    return cls((int(index), int(dim), cat))


def _vi_vj(cls, x, axis, dim=None):
    """LazyTensor(x, axis) for Vi (axis 0) and Vj (axis 1), with their checks."""
    if dim is not None:
        return _symbolic_var(cls, x, dim, axis)
    name, n, hint = ("Vi", "n", "x[:, None]") if axis == 0 else ("Vj", "m", "y[:, None]")
    if not isinstance(x, cls._ARRAY_TYPE):
        raise TypeError(f"{name} expects an ({n}, d) {cls._ARRAY_NAME} (or, symbolic, "
                        f"{name}(index, dim)), not {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{name} expects an ({n}, d) array, got shape {tuple(x.shape)}"
                         + (f" (use {hint} for a 1-D array)" if x.ndim == 1 else ""))
    return cls(x, axis=axis)


def _pm(cls, x, dim=None):
    if dim is not None:
        return _symbolic_var(cls, x, dim, _P)
    if isinstance(x, (bool, np.bool_)):
        raise TypeError("Pm: a bool is not a number")
    if _is_int(x) or _is_float(x):
        return cls([x])
    if isinstance(x, cls._ARRAY_TYPE) and x.ndim > 1:
        raise ValueError(f"Pm expects a (d,) array, got shape {tuple(x.shape)}")
    return cls(x)


def _constructors(cls, array):
    """Vi, Vj and Pm of a binding whose LazyTensor class is ``cls`` (``array``: what its
    arrays are called in the docstrings)."""

    def Vi(x, dim=None):
        return _vi_vj(cls, x, 0, dim)

    def Vj(x, dim=None):
        return _vi_vj(cls, x, 1, dim)

    def Pm(x, dim=None):
        return _pm(cls, x, dim)

    Vi.__doc__ = (f"A variable indexed by i from an ``(n, d)`` {array}: ``LazyTensor(x, "
                  f"axis=0)``; or, as ``Vi(index, dim)``, a symbolic one, given as argument "
                  f"``index`` when the reduction runs.")
    Vj.__doc__ = (f"A variable indexed by j from an ``(m, d)`` {array}: ``LazyTensor(x, "
                  f"axis=1)``; or, as ``Vj(index, dim)``, a symbolic one.")
    Pm.__doc__ = (f"A parameter: a ``(d,)`` or 0-D {array}, a list of numbers, or a number "
                  f"(then a runtime parameter of dimension 1, not a constant baked into the "
                  f"formula); or, as ``Pm(index, dim)``, a symbolic one.")
    return Vi, Vj, Pm


Vi, Vj, Pm = _constructors(LazyTensor, "array")
