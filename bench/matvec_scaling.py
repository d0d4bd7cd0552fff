"""Gaussian mat-vec time against N: out_i = sum_j exp(-g |x_i - y_j|^2) b_j, D = 3, float32,
N = M, in one process, for symred and the peers a user would reach for:

- NumPy: the kernel matrix built and multiplied in blocks of 1024 rows (so it never holds more
  than 1024 x M floats);
- torch dense: the whole N x M matrix (torch.cdist, exp, matmul), only while it fits in
  --dense-gib;
- pykeops CPU (its LazyTensor reduction), when pykeops imports.

Each time is the best of --reps calls after an untimed warm-up call (compiles symred's and
pykeops' kernels). A library whose last time, scaled by the growth in pairs, would pass
--max-s seconds is skipped from there on (the row says "—"). Records one row per N through
bench/record.py when SYMRED_BENCH_RECORD is set; bench/plots.py draws them.

    SYMRED_LIB=build/libsymred.so OMP_WAIT_POLICY=passive \\
        ~/.cache/symred-venv/bin/python bench/matvec_scaling.py --sizes 1000,3000,10000,30000,100000
"""

import argparse
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "bindings" / "python"))
sys.path.insert(0, str(HERE))

import symred  # noqa: E402

from record import Record, best  # noqa: E402  (bench/record.py, beside this file)

FORMULA = "Exp(-g * SqDist(x, y)) * b"
ALIASES = ["x = Vi(3)", "y = Vj(3)", "b = Vj(1)", "g = Pm(1)"]
BLOCK = 1024


def numpy_blocked(x, y, b, g):
    yy = (y * y).sum(1)
    out = np.empty((x.shape[0], 1), dtype=x.dtype)
    for s in range(0, x.shape[0], BLOCK):
        xb = x[s:s + BLOCK]
        d2 = (xb * xb).sum(1)[:, None] + yy[None, :] - 2.0 * (xb @ y.T)
        out[s:s + BLOCK] = np.exp(-g * d2) @ b
    return out


def peers(a):
    """The baselines that import, as name -> (setup(x, y, b, g) -> call, fits(n))."""
    out = {"numpy": (lambda x, y, b, g: lambda: numpy_blocked(x, y, b, g), lambda n: True)}
    try:
        import torch
        torch.set_num_threads(len(os.sched_getaffinity(0)))

        def torch_dense(x, y, b, g):
            tx, ty, tb = torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(b)
            return lambda: torch.exp(-g * torch.cdist(tx, ty) ** 2) @ tb

        out["torch_dense"] = (torch_dense, lambda n: n * n * 4 <= a.dense_gib * 2**30)
    except ImportError:
        print("torch does not import: no torch column")
    try:
        from pykeops.numpy import LazyTensor

        def keops(x, y, b, g):
            gb = np.array([g], dtype=x.dtype)

            def call():
                xi, yj, bj = LazyTensor(x[:, None, :]), LazyTensor(y[None, :, :]), \
                    LazyTensor(b[None, :, :])
                return ((-LazyTensor(gb) * xi.sqdist(yj)).exp() * bj).sum_reduction(
                    axis=1, backend="CPU")
            return call

        out["pykeops_cpu"] = (keops, lambda n: True)
    except ImportError:
        print("pykeops does not import: no pykeops column")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,3000,10000,30000,100000")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-s", type=float, default=10.0,
                    help="skip a library whose next point is predicted to take longer")
    ap.add_argument("--dense-gib", type=float, default=1.0,
                    help="torch dense runs while the N x M float32 matrix fits in this")
    a = ap.parse_args()
    rec = Record("matvec_scaling")
    rng = np.random.default_rng(0)
    g = 2.0
    sym = symred.Genred(FORMULA, ALIASES, reduction_op="Sum", axis=1)
    libs = {"symred": (lambda x, y, b, g: lambda: sym(x, y, b, np.array([g], np.float32)),
                       lambda n: True)}
    libs.update(peers(a))
    last = {}  # library -> (pairs, seconds) of its last point
    for n in [int(v) for v in a.sizes.split(",")]:
        x = rng.random((n, 3), dtype=np.float32)
        y = rng.random((n, 3), dtype=np.float32)
        b = rng.standard_normal((n, 1), dtype=np.float32)
        row = {"N": n}
        ref = None  # symred's sums at this N, when it ran
        line = [f"N = M = {n:7d}:"]
        for name, (setup, fits) in libs.items():
            pairs = n * n
            if name in last and last[name][1] * pairs / last[name][0] > a.max_s or not fits(n):
                row[f"{name}_s"] = -1.0
                line.append(f"{name} —")
                continue
            call = setup(x, y, b, g)
            t = best(call, a.reps)
            last[name] = (pairs, t)
            row[f"{name}_s"] = round(t, 5)
            line.append(f"{name} {t * 1e3:.1f} ms")
            if name == "symred":
                ref = np.asarray(call()).reshape(n, 1)
            elif ref is not None and n <= 10000:  # the peers compute the same sums
                other = np.asarray(call()).reshape(n, 1)
                err = np.abs(other - ref).max() / max(np.abs(ref).max(), 1e-30)
                if err > 1e-3:
                    sys.exit(f"matvec_scaling: {name} differs from symred at N = {n} "
                             f"(relative error {err:.2e})")
        row["symred_gpairs"] = round(n * n / row["symred_s"] / 1e9, 3) if row["symred_s"] > 0 \
            else -1.0
        print("  ".join(line))
        rec.row(**row)
    rec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
