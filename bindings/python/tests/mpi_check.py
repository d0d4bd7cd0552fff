"""Run under mpirun by test_mpi.py: symred.mpi.Genred on uneven shards against symred.Genred
on the whole data, every reduction, both axes, both dtypes; then an error on one rank only.

Every rank makes the whole data from one seed and keeps its shard. Prints "mpi_check: ok" on
rank 0 and exits 0 when everything agrees; a failed comparison raises (exit status 1).
"""

import sys

import numpy as np
from mpi4py import MPI

import symred
import symred.mpi

comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()


def shard(n, r):
    """Rows [lo, hi) of rank r: shares growing with the rank (rank 0's may be empty)."""
    return n * r * (r + 1) // (P * (P + 1)), n * (r + 1) * (r + 2) // (P * (P + 1))


ALIASES = ["x = Vi(3)", "y = Vj(3)", "b = Vj(2)", "g = Pm(1)"]
FORMULAS = {
    "Sum": ("Exp(-g * SqDist(x, y)) * b", None),
    "LogSumExp": ("-g * SqDist(x, y) * b", None),
    "SumSoftMaxWeight": ("-g * SqDist(x, y)", "Concat(b, Elem(y, 0) * Elem(x, 1))"),
}
MINMAX = ("Concat(SqDist(x, y), -(x | y) * Elem(b, 0))", None)


def check(red, axis, dtype, nx=37, ny=53):
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, (nx, 3)).astype(dtype)
    y = rng.uniform(-1, 1, (ny, 3)).astype(dtype)
    b = rng.uniform(0.5, 1.5, (ny, 2)).astype(dtype)
    g = np.array([0.7], dtype=dtype)
    formula, formula2 = FORMULAS.get(red, MINMAX)
    k = 3 if red in ("KMin", "ArgKMin", "KMin_ArgKMin") else None
    opts = dict(reduction_op=red, axis=axis, opt_arg=k, formula2=formula2)
    want = symred.Genred(formula, ALIASES, **opts)(x, y, b, g)
    x0, x1 = shard(nx, rank)
    y0, y1 = shard(ny, P - 1 - rank)  # y's shares in the other order than x's
    # y rows in rank order: this rank's y block starts after the blocks of ranks below it.
    sizes = [shard(ny, P - 1 - r)[1] - shard(ny, P - 1 - r)[0] for r in range(P)]
    ys = sum(sizes[:rank])
    ye = ys + sizes[rank]
    f = symred.mpi.Genred(formula, ALIASES, **opts)
    got = f(x[x0:x1], y[ys:ye], b[ys:ye], g if rank == 0 else None)
    own = slice(x0, x1) if axis == 1 else slice(ys, ye)
    wants = want if isinstance(want, tuple) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    for w, o in zip(wants, gots):
        w = w[own]
        what = f"{red} axis {axis} {np.dtype(dtype).name} on {P} ranks, rank {rank}"
        assert o.shape == w.shape, f"{what}: shape {o.shape}, want {w.shape}"
        if o.dtype == np.int64:
            assert np.array_equal(o, w), f"{what}: indices\n{o}\nwant\n{w}"
        else:
            tol = 1e-12 if dtype == np.float64 else 2e-5
            np.testing.assert_allclose(o, w, rtol=tol, atol=tol, err_msg=what)
    f.close()


def check_error_on_one_rank():
    f = symred.mpi.Genred("SqDist(x, y)", ["x = Vi(2)", "y = Vj(2)"], reduction_op="ArgKMin",
                          axis=1, opt_arg=2)
    x = np.zeros((4, 2))
    y = np.zeros((3, 3 if rank == P - 1 else 2))  # the wrong width on the last rank only
    try:
        f(x, y)
    except ValueError as e:
        assert str(e).startswith(f"rank {P - 1}: "), str(e)
    else:
        raise AssertionError("a bad shape on one rank raised nothing")
    # K larger than the points of all ranks together: the C library's error, on every rank.
    g = symred.mpi.Genred("SqDist(x, y)", ["x = Vi(2)", "y = Vj(2)"], reduction_op="ArgKMin",
                          axis=1, opt_arg=3 * P + 1)
    try:
        g(x, np.zeros((3, 2)))
    except symred.SymredValueError as e:
        assert "k = " in str(e), str(e)
    else:
        raise AssertionError("K > all the points raised nothing")


for red in symred.REDUCTIONS:
    for axis in (0, 1):
        for dtype in (np.float32, np.float64):
            check(red, axis, dtype)
check_error_on_one_rank()
comm.Barrier()
if rank == 0:
    print(f"mpi_check: ok ({P} ranks)")
sys.stdout.flush()
