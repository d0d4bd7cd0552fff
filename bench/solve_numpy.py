#!/usr/bin/python3
"""LazyTensor.solve (conjugate gradients on symred mat-vecs) against numpy.linalg.solve of the
materialised matrix, in this process on the same data: (alpha I + K) a = b, K the Gaussian
kernel exp(-2 |x_i - x_j|^2) of uniform points in [-1, 1]^2, alpha = 0.5, 3 right-hand sides,
float64, pykeops' default eps = 1e-6. Prints the error against the dense solution, the RMS
residual, both times (the dense time includes building the matrix) and their ratio. With
SYMRED_BENCH_RECORD set, the figures are appended to that file as data (bench/record.py).

    SYMRED_LIB=build/libsymred.so PYTHONPATH=bindings/python python3 bench/solve_numpy.py
"""

import sys
import time

import numpy as np

from symred import LazyTensor

from record import Record  # bench/record.py, beside this file


def main(sizes):
    rec = Record("solve_numpy")
    rng = np.random.default_rng(0)
    for n in sizes:
        x, b = rng.uniform(-1, 1, (n, 2)), rng.standard_normal((n, 3))
        K = (-2.0 * LazyTensor(x[:, None, :]).sqdist(LazyTensor(x[None, :, :]))).exp()
        K.solve(b, alpha=0.5)  # compiles the kernel (cached afterwards)
        t = time.perf_counter()
        a = K.solve(b, alpha=0.5)
        t_cg = time.perf_counter() - t
        t = time.perf_counter()
        A = np.exp(-2 * ((x[:, None] - x[None]) ** 2).sum(-1)) + 0.5 * np.eye(n)
        ref = np.linalg.solve(A, b)
        t_dense = time.perf_counter() - t
        r = A @ a - b
        err, rms = float(abs(a - ref).max()), float(np.sqrt((r ** 2).mean()))
        print(f"n = {n}: max |a - dense| = {err:.2e}, rms residual = "
              f"{rms:.2e}; symred CG {t_cg * 1e3:.1f} ms, dense "
              f"{t_dense * 1e3:.1f} ms, dense / CG = {t_dense / t_cg:.1f}")
        rec.row(n=n, cg_ms=round(t_cg * 1e3, 1), dense_ms=round(t_dense * 1e3, 1),
                dense_over_cg=round(t_dense / t_cg, 2), max_diff=float(f"{err:.2e}"),
                rms_residual=float(f"{rms:.2e}"))
    rec.data["numpy"] = np.__version__
    rec.close()


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [97, 4000])
