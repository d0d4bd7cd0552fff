"""symred.mpi: reductions over NumPy arrays sharded across MPI ranks (mpi4py + libsymred_mpi).

Each rank passes its own rows of every ``Vi`` and ``Vj`` array (any number, 0 included) and
gets the results of its own rows: with ``axis=1`` (reduce over j) the rows of its ``Vi``
arrays, with ``axis=0`` the rows of its ``Vj`` arrays. The other side's blocks travel around a
ring of the ranks, and partial results combine with each reduction's own rule; indices are
global (the position in the concatenation of the blocks in rank order). Parameters (``Pm``)
are taken from rank 0. Every call is collective: all ranks of the communicator call it, in
the same order; an error on one rank raises the same exception, with that rank's message
("rank R: ..."), on every rank. This is the C library include/symred_mpi.h (docs/scale-out.md)::

    from mpi4py import MPI
    from symred.mpi import Genred

    f = Genred("Exp(-g * SqDist(x, y)) * b", ["x = Vi(3)", "y = Vj(3)", "b = Vj(1)",
               "g = Pm(1)"], reduction_op="Sum", axis=1)
    out_mine = f(x_mine, y_mine, b_mine, g)      # out_mine has x_mine's rows

libsymred_mpi.so is looked for next to the libsymred.so that symred loaded, then through
$SYMRED_MPI_LIB (a path) and the dynamic linker. Needs mpi4py (Debian: python3-mpi4py) built
against the same MPI as the library.
"""

import ctypes
import os
import weakref

import numpy as np
from mpi4py import MPI

from . import _lib
from ._lib import KernelDesc, RunDesc, SymredRuntimeError, SymredValueError
from .genred import _DTYPES, Genred as _Genred

__all__ = ["Genred", "mpi_lib_path"]

_NAME = "libsymred_mpi.so"


def _load():
    tried = []
    env = os.environ.get("SYMRED_MPI_LIB")
    candidates = [env] if env else []
    candidates.append(os.path.join(os.path.dirname(os.path.realpath(_lib.lib_path)), _NAME))
    candidates.append(_NAME)
    for path in candidates:
        try:
            # RTLD_GLOBAL is not needed: libsymred_mpi shares libsymred and libmpi with the
            # process through their sonames.
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path} ({e})")
    raise ImportError("symred.mpi: cannot load libsymred_mpi.so (build symred with MPI found: "
                      "Debian libopenmpi-dev); tried:\n  " + "\n  ".join(tried))


def _declare(mlib):
    c_int, c_void_p, P = ctypes.c_int, ctypes.c_void_p, ctypes.POINTER
    protos = {
        "sr_mpi_new_f": (c_int, [c_void_p, c_int, P(c_void_p)]),
        "sr_mpi_free": (None, [c_void_p]),
        "sr_mpi_error": (ctypes.c_char_p, [c_void_p]),
        "sr_mpi_kernel_new": (c_int, [c_void_p, c_void_p, P(KernelDesc), P(c_void_p)]),
        "sr_mpi_kernel_free": (None, [c_void_p]),
        "sr_mpi_kernel_out_dim": (c_int, [c_void_p]),
        "sr_mpi_kernel_nargs": (c_int, [c_void_p]),
        "sr_mpi_kernel_run": (c_int, [c_void_p, P(RunDesc)]),
    }
    for name, (restype, argtypes) in protos.items():
        fn = getattr(mlib, name)
        fn.restype = restype
        fn.argtypes = argtypes


mlib, mpi_lib_path = _load()
_declare(mlib)


def _check(status, m, what):
    if status == _lib.SR_OK:
        return
    msg = mlib.sr_mpi_error(m).decode(errors="replace") if m else ""
    cls = SymredValueError if status in _lib._VALUE_ERRORS else SymredRuntimeError
    raise cls(f"{what}: {msg or _lib.STATUS_NAMES.get(status, 'error')}", status)


def _close(ctx_close, mpi_state):
    """Frees the sharded kernels and the communicator, then the context (in that order)."""
    for k in mpi_state["kernels"].values():
        mlib.sr_mpi_kernel_free(k)
    mpi_state["kernels"].clear()
    if mpi_state["m"]:
        mlib.sr_mpi_free(mpi_state["m"])  # only memory once MPI is finalized
        mpi_state["m"] = None
    ctx_close()


class Genred(_Genred):
    """:class:`symred.Genred` over sharded arrays; the same arguments, plus ``comm`` (an
    mpi4py communicator, default ``MPI.COMM_WORLD``). Creating it is collective.

    ``f(*shards, backend="auto")`` takes this rank's arrays (``Vi`` arrays with its ``nx``
    rows, ``Vj`` arrays with its ``ny`` rows; parameters read on rank 0) and returns the
    results of this rank's own rows, shaped as :class:`symred.Genred` shapes them; indices are
    global int64.
    """

    def __init__(self, formula, aliases, reduction_op="Sum", axis=0, comm=None, **kwargs):
        super().__init__(formula, aliases, reduction_op=reduction_op, axis=axis, **kwargs)
        self.comm = MPI.COMM_WORLD if comm is None else comm
        m = ctypes.c_void_p()
        st = mlib.sr_mpi_new_f(self._h.ctx, self.comm.py2f(), ctypes.byref(m))
        if st != _lib.SR_OK:
            raise SymredRuntimeError(f"sr_mpi_new: {_lib.STATUS_NAMES.get(st, st)}", st)
        self._mpi = {"m": m, "kernels": {}}
        # One finalizer frees everything in order: the sharded kernels and the communicator
        # before the context that they use.
        base = self._finalizer.detach()
        ctx_close = (lambda f=base[1], a=base[2]: f(*a)) if base else (lambda: None)
        self._finalizer = weakref.finalize(self, _close, ctx_close, self._mpi)

    def close(self):
        """Frees the C objects now (collective: the communicator is freed)."""
        self._finalizer()

    def _mpi_kernel(self, sr_dtype, device):
        key = (sr_dtype, device)
        k = self._mpi["kernels"].get(key)
        if k is not None:
            return k
        desc = KernelDesc(reduction=self._red, axis=self.axis, k=self.opt_arg or 1,
                          dtype=sr_dtype, device=device,
                          weight=self._weight.value if self._weight is not None else None,
                          acc=self._acc)
        out = ctypes.c_void_p()
        st = mlib.sr_mpi_kernel_new(self._mpi["m"], self._expr, ctypes.byref(desc),
                                    ctypes.byref(out))
        _check(st, self._mpi["m"], "sr_mpi_kernel_new")
        self._mpi["kernels"][key] = out
        return out

    def __call__(self, *args, backend="auto", device_id=-1, ranges=None, out=None):
        """Runs the reduction on this rank's shards (collective)."""
        if self._mpi["m"] is None:
            raise ValueError("this Genred was closed")
        if ranges is not None or out is not None:
            raise ValueError("ranges and out= are not supported by symred.mpi")
        # The checks of the arrays run on each rank; one rank's failure must raise on all of
        # them, never leave the others waiting in the collective call.
        try:
            device = self._device(backend)
            arrays, dt, nx, ny = self._local_prepare(args)
            if self.dtype_acc == "float32" and dt == np.float64:
                raise ValueError("dtype_acc='float32' is not allowed with float64 data")
            err = None
        except (TypeError, ValueError) as e:
            err = e
        errors = self.comm.allgather(None if err is None else (type(err).__name__, str(err)))
        first = next((r for r, e in enumerate(errors) if e is not None), None)
        if first is not None:
            name, msg = errors[first]
            cls = TypeError if name == "TypeError" else SymredValueError
            raise cls(f"rank {first}: {msg}") from err
        with self._h.lock:
            k = self._mpi_kernel(_DTYPES[dt], device)
            out_dim = mlib.sr_mpi_kernel_out_dim(k)
            nargs_c = mlib.sr_mpi_kernel_nargs(k)
            run, values, idx, nout = self._run_desc(arrays, dt, nx, ny, nargs_c, out_dim)
            st = mlib.sr_mpi_kernel_run(k, ctypes.byref(run))
            _check(st, self._mpi["m"], "sr_mpi_kernel_run")
        return self._shape_output(values, idx, nout)

    def _local_prepare(self, args):
        # Parameters are read on rank 0 only; elsewhere they may be None.
        args = list(args)
        given = [a.dtype for a in args if isinstance(a, np.ndarray)]
        dt = self.dtype or (given[0] if given else np.float32)
        for i, spec in self._args.items():
            if spec.cat == _lib.SR_CAT_PARAM and i < len(args) and args[i] is None:
                args[i] = np.zeros(spec.dim, dtype=dt)
        arrays, dt, nx, ny = self._prepare(args)
        # A category without arrays counts one row, as in KeOps: on every rank for the rows
        # that stay (each rank gets its result), on rank 0 only for the reduced ones (so that
        # the reduction runs over one row, whatever the number of ranks).
        cats = {spec.cat for spec in self._args.values()}
        reduced = _lib.SR_CAT_J if self.axis == 1 else _lib.SR_CAT_I
        one = 1 if self.comm.Get_rank() == 0 else 0
        nx = nx if _lib.SR_CAT_I in cats or reduced != _lib.SR_CAT_I else one
        ny = ny if _lib.SR_CAT_J in cats or reduced != _lib.SR_CAT_J else one
        return arrays, dt, nx, ny

    def __repr__(self):
        return "symred.mpi." + super().__repr__()
