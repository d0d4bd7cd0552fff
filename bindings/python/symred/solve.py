"""KernelSolve: (alpha I + K) a = b by conjugate gradients, over the C sr_kernel_solve.

pykeops.numpy's names and semantics: ``KernelSolve(formula, aliases, varinvalias, axis=0)``
declares a Sum reduction whose formula is linear in the variable ``varinvalias`` (``b``), e.g.
``Exp(-g * SqDist(x, y)) * b``; calling it with the arrays (the right-hand side in b's place)
returns ``a`` with ``(alpha I + K) a = b``. The caller passes the same data for x and y (K must
be symmetric; one random test in C rejects an operator that is not). docs/solve.md.
"""

import ctypes

import numpy as np

from ._lib import SolveDesc, check, lib
from .genred import _DTYPES, _INT32_MAX, Genred, _float_arg, _int_arg

__all__ = ["KernelSolve"]


class KernelSolve(Genred):
    """Solves (alpha I + K) a = b for a symmetric kernel K (pykeops.numpy.KernelSolve).

    Args:
        formula (str): a formula ``F(x, y) * b``, linear in the variable ``varinvalias``.
        aliases (list of str): as for :class:`~symred.Genred`.
        varinvalias (str): the name of b in ``aliases`` (an index is also accepted): a
            variable of the reduced index (Vj for axis=1, Vi for axis=0).
        axis (int): as in pykeops: 1 sums over j (x a Vi, b a Vj), 0 over i.
        dtype, dtype_acc, use_double_acc, sum_scheme: as for Genred.
    """

    _FLAT_DIM1_VARIABLES = False

    def __init__(self, formula, aliases, varinvalias, axis=0, dtype=None, dtype_acc="auto",
                 use_double_acc=False, sum_scheme="auto", cuda_type=None, enable_chunks=True,
                 rec_multVar_highdim=False, use_fast_math=True):
        super().__init__(formula, aliases, reduction_op="Sum", axis=axis, dtype=dtype,
                         dtype_acc=dtype_acc, use_double_acc=use_double_acc,
                         sum_scheme=sum_scheme, cuda_type=cuda_type,
                         enable_chunks=enable_chunks, rec_multVar_highdim=rec_multVar_highdim,
                         use_fast_math=use_fast_math)
        if isinstance(varinvalias, int) and not isinstance(varinvalias, bool):
            found = [varinvalias] if varinvalias in self._args else []
        else:
            found = [i for i, a in self._args.items() if a.name == repr(varinvalias)]
        if not found:
            raise ValueError(f"KernelSolve: varinvalias {varinvalias!r} is not one of the "
                             f"aliases ({', '.join(a.name for a in self._args.values())})")
        self.varinvalias = varinvalias
        self.varinvpos = found[0]

    def __call__(self, *args, backend="auto", device_id=-1, alpha=1e-10, eps=1e-6,
                 ranges=None, max_iter=0, check_symmetry=True):
        """Returns a, shaped like b (the array given in varinvalias' place), with
        (alpha I + K) a = b to pykeops' tolerance: |r|^2 < size(b) eps^2. ``max_iter`` caps
        the iterations (0: 10 size(b) + 10); past it, a SymredRuntimeError with status_name
        ``ENOCONV`` gives the iterations and the residual."""
        device = self._device(backend)
        self._solve_checks(args, ranges)
        arrays, dt, nx, ny = self._prepare(args)
        if nx != ny:
            raise ValueError(f"KernelSolve: K must be square, but the i-variables have {nx} "
                             f"rows and the j-variables {ny}")
        self._check_acc(dt)
        rhs = arrays[self.varinvpos]
        out = np.empty_like(rhs)
        desc = SolveDesc(b_index=self.varinvpos, alpha=_float_arg("alpha", alpha),
                         eps=_float_arg("eps", eps),
                         max_iter=_int_arg("max_iter", max_iter, 0, _INT32_MAX),
                         check_symmetry=1 if check_symmetry else 0)
        with self._h.lock:
            k = self._kernel(_DTYPES[dt], device)
            nargs_c = lib.sr_kernel_nargs(k)
            ptrs = (ctypes.c_void_p * max(1, nargs_c))(
                *[a.ctypes.data if a is not None else None for a in arrays[:nargs_c]]
            )
            st = lib.sr_kernel_solve(k, ctypes.byref(desc), nx, ptrs, rhs.ctypes.data,
                                     out.ctypes.data)
            check(st, self._h.ctx)
        return out

    def _solve_checks(self, args, ranges):
        """Refuses what symred's solve does not do, with a clear error (shared with
        symred.torch.KernelSolve)."""
        if ranges is not None:
            raise ValueError("KernelSolve: ranges (block-sparse) are not supported by symred's "
                             "solve yet")
        if self._batch_shape(args) is not None:
            raise ValueError("KernelSolve: batch dimensions are not supported by symred's "
                             "solve; give (n, d) arrays and solve each batch separately")

    def __repr__(self):
        return (f"KernelSolve({self.formula!r}, {self.aliases!r}, {self.varinvalias!r}, "
                f"axis={self.axis})")

