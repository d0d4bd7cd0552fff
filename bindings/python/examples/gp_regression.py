#!/usr/bin/env python3
"""Exact Gaussian-process regression with symred kernel mat-vecs.

Solves (K + s^2 I) alpha = y by conjugate gradients, where K_ij = exp(-|x_i - x_j|^2 / (2 l^2))
is never built: each CG step is one symred Sum reduction. Then predicts at test points,
mean_t = sum_j K(t, x_j) alpha_j, and prints the RMSE against the noise-free function.

    python3 gp_regression.py --n 1000 --ntest 200 --dim 3
"""

import argparse
import sys
import time

import numpy as np

try:
    from symred import Genred
except ImportError as e:  # the library or the package is missing: say so plainly
    sys.exit(f"gp_regression: {e}")


def truth(x):
    """A smooth test function of d variables."""
    return np.sin(3.0 * x).sum(axis=1) + 0.5 * np.cos(5.0 * x[:, 0])


def conjugate_gradients(matvec, b, tol, maxiter):
    x = np.zeros_like(b)
    r = b.copy()
    p = r.copy()
    rr = float((r * r).sum())
    bnorm = float(np.sqrt((b * b).sum()))
    for it in range(1, maxiter + 1):
        Ap = matvec(p)
        alpha = rr / float((p * Ap).sum())
        x += alpha * p
        r -= alpha * Ap
        rr_new = float((r * r).sum())
        if np.sqrt(rr_new) <= tol * bnorm:
            return x, it, np.sqrt(rr_new) / bnorm
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x, maxiter, np.sqrt(rr) / bnorm


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="training points (default 1000)")
    ap.add_argument("--ntest", type=int, default=200, help="test points (default 200)")
    ap.add_argument("--dim", type=int, default=1, help="input dimension (default 1)")
    ap.add_argument("--lengthscale", type=float, default=0.3)
    ap.add_argument("--noise", type=float, default=0.1, help="noise standard deviation s")
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--maxiter", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.n < 1 or a.ntest < 1 or a.dim < 1:
        ap.error("--n, --ntest and --dim must be positive")

    rng = np.random.default_rng(a.seed)
    dt = np.dtype(a.dtype)
    X = rng.uniform(0.0, 1.0, (a.n, a.dim)).astype(dt)
    T = rng.uniform(0.0, 1.0, (a.ntest, a.dim)).astype(dt)
    y = (truth(X) + a.noise * rng.standard_normal(a.n)).astype(dt)[:, None]
    g = np.array([1.0 / (2.0 * a.lengthscale**2)], dtype=dt)

    d = a.dim
    kmv = Genred("Exp(-g * SqDist(x, y)) * b",
                 [f"x = Vi({d})", f"y = Vj({d})", "b = Vj(1)", "g = Pm(1)"],
                 reduction_op="Sum", axis=1)
    s2 = dt.type(a.noise**2)

    def matvec(p):
        return kmv(X, X, p, g, backend=a.backend) + s2 * p

    t0 = time.perf_counter()
    alpha, iters, relres = conjugate_gradients(matvec, y, a.tol, a.maxiter)
    t_cg = time.perf_counter() - t0
    t0 = time.perf_counter()
    mean = kmv(T, X, alpha, g, backend=a.backend)[:, 0]
    t_pred = time.perf_counter() - t0

    f_true = truth(T)
    rmse = float(np.sqrt(np.mean((mean - f_true) ** 2)))
    baseline = float(np.sqrt(np.mean((f_true - y.mean()) ** 2)))
    print(f"GP regression: n={a.n} ntest={a.ntest} dim={d} dtype={a.dtype} "
          f"lengthscale={a.lengthscale} noise={a.noise}")
    print(f"CG: {iters} iterations, relative residual {relres:.2e}, {t_cg:.3f} s")
    print(f"prediction: {t_pred:.3f} s")
    print(f"test RMSE vs the noise-free function: {rmse:.4f} "
          f"(predicting the mean: {baseline:.4f}; noise level {a.noise})")
    return 0 if rmse < baseline else 1


if __name__ == "__main__":
    sys.exit(main())
