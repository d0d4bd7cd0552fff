"""SGPR (Titsias' collapsed bound, as GPflow's SGPR.elbo) written in JAX, with the n-sized work
(K_uf K_fu and K_uf y) done by symred.jax inside the jitted bound, trained by L-BFGS-B on
jax.value_and_grad; beside the same bound with K_uf materialised in jax.numpy.

For the squared-exponential kernel k(z, x) = v exp(-g |z - x|^2),
    k(z_a, x) k(z_b, x) = v^2 exp(-g/2 |z_a - z_b|^2) exp(-2 g |x - (z_a + z_b)/2|^2),
so (K_uf K_fu)_ab = v^2 exp(-g/2 |z_a - z_b|^2) S_ab with S_ab = sum_i exp(-2 g |m_ab - x_i|^2)
over the M^2 midpoints m_ab: one Gaussian kernel sum of M^2 rows over the n points, which
symred runs without the M x n matrix, and whose gradient with respect to g is symred's
gradient kernel. K_uf y is a second symred Sum. The data, inducing points and initial
hyperparameters are sgpr_model's (the eXLA SGPR experiment, docs/sgpr.md).

    SYMRED_LIB=build/libsymred.so ~/.cache/symred-venv/bin/python bench/exla/sgpr_jax.py \
        [--n 10000] [--M 100] [--iterations 10]
"""

import argparse
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "python"))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import symred.jax as sjax  # noqa: E402

JITTER = 1e-6  # as GPflow's default_jitter()
_PAIR_SUM = sjax.Genred("Exp(-g * SqDist(m, x))", ["m = Vi(3)", "x = Vj(3)", "g = Pm(1)"],
                        reduction_op="Sum", axis=1)
_KUF_Y = sjax.Genred("Exp(-g * SqDist(z, x)) * y", ["z = Vi(3)", "x = Vj(3)", "y = Vj(1)",
                                                    "g = Pm(1)"], reduction_op="Sum", axis=1)


def _sqdist(a, b):
    return ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)


def terms_symred(X, y, Z, g):
    """P = E E^T and r = E y for E_ai = exp(-g |z_a - x_i|^2), through symred.jax."""
    M = Z.shape[0]
    mid = ((Z[:, None, :] + Z[None, :, :]) / 2).reshape(M * M, 3)
    S = _PAIR_SUM(mid, X, 2 * g).reshape(M, M)
    P = jnp.exp(-0.5 * g[0] * _sqdist(Z, Z)) * S
    r = _KUF_Y(Z, X, y[:, None], g)[:, 0]
    return P, r


def terms_dense(X, y, Z, g):
    """The same with E (M x n) materialised in jax.numpy."""
    E = jnp.exp(-g[0] * _sqdist(Z, X))
    return E @ E.T, E @ y


def bound(theta, X, y, Z, terms=terms_symred):
    """The collapsed bound at theta = (log lengthscale, log variance, log noise variance)."""
    ls, v, s2 = jnp.exp(theta[0]), jnp.exp(theta[1]), jnp.exp(theta[2])
    g = jnp.reshape(0.5 / ls**2, (1,))
    n, M = X.shape[0], Z.shape[0]
    P, r = terms(X, y, Z, g)
    P, r = v * v * P, v * r
    Kuu = v * jnp.exp(-g[0] * _sqdist(Z, Z)) + JITTER * jnp.eye(M)
    L = jnp.linalg.cholesky(Kuu)
    T = jax.scipy.linalg.solve_triangular(L, P, lower=True)
    AAT = jax.scipy.linalg.solve_triangular(L, T.T, lower=True) / s2
    LB = jnp.linalg.cholesky(AAT + jnp.eye(M))
    Ar = jax.scipy.linalg.solve_triangular(L, r, lower=True)
    c = jax.scipy.linalg.solve_triangular(LB, Ar, lower=True) / s2
    return (-0.5 * n * math.log(2 * math.pi) - jnp.log(jnp.diagonal(LB)).sum()
            - 0.5 * n * jnp.log(s2) - 0.5 * (y @ y) / s2 + 0.5 * (c * c).sum()
            - 0.5 * n * v / s2 + 0.5 * jnp.trace(AAT))


def predict_rmse(theta, X, y, Z, Xs, ys, terms=terms_symred):
    """Test RMSE of the predictive mean K_su L^-T LB^-T c (GPflow's SGPR.predict_f)."""
    ls, v, s2 = jnp.exp(theta[0]), jnp.exp(theta[1]), jnp.exp(theta[2])
    g = jnp.reshape(0.5 / ls**2, (1,))
    M = Z.shape[0]
    P, r = terms(X, y, Z, g)
    P, r = v * v * P, v * r
    L = jnp.linalg.cholesky(v * jnp.exp(-g[0] * _sqdist(Z, Z)) + JITTER * jnp.eye(M))
    AAT = jax.scipy.linalg.solve_triangular(
        L, jax.scipy.linalg.solve_triangular(L, P, lower=True).T, lower=True) / s2
    LB = jnp.linalg.cholesky(AAT + jnp.eye(M))
    c = jax.scipy.linalg.solve_triangular(
        LB, jax.scipy.linalg.solve_triangular(L, r, lower=True), lower=True) / s2
    Kus = v * jnp.exp(-g[0] * _sqdist(Z, Xs))
    tmp = jax.scipy.linalg.solve_triangular(
        LB, jax.scipy.linalg.solve_triangular(L, Kus, lower=True), lower=True)
    mean = tmp.T @ c
    return float(jnp.sqrt(((mean - ys) ** 2).mean()))


def train(X, y, Z, theta0, iterations, terms):
    """L-BFGS-B (SciPy) on minus the bound, gradients by jax.value_and_grad; returns theta,
    the final bound and the seconds per evaluation (after the first, which compiles)."""
    from scipy.optimize import minimize
    vg = jax.jit(jax.value_and_grad(lambda t: -bound(t, X, y, Z, terms)))
    vg(jnp.asarray(theta0))  # compile
    times = []

    def fun(t):
        t0 = time.perf_counter()
        val, grad = vg(jnp.asarray(t))
        val, grad = float(val), np.asarray(grad, dtype=np.float64)
        times.append(time.perf_counter() - t0)
        return val, grad

    res = minimize(fun, np.asarray(theta0), jac=True, method="L-BFGS-B",
                   options={"maxiter": iterations})
    return res.x, -res.fun, float(np.median(times)), len(times)


def main():
    import sgpr_model
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--M", type=int, default=100)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--no-dense", action="store_true")
    a = ap.parse_args()
    X, y, Xs, ys = sgpr_model.make_data(a.n, a.n // 10)
    Z = sgpr_model.inducing_points(X, a.M)
    X, y, Xs, ys, Z = (jnp.asarray(v) for v in (X, y, Xs, ys, Z))
    init = sgpr_model.INIT
    theta0 = np.log([init["lengthscale"], init["variance"], init["noise_variance"]])
    systems = [("symred.jax", terms_symred)] + ([] if a.no_dense else [("jax dense", terms_dense)])
    b0 = {name: float(bound(jnp.asarray(theta0), X, y, Z, t)) for name, t in systems}
    print(f"SGPR n = {a.n}, M = {a.M}, {a.iterations} L-BFGS-B iterations "
          f"(jax {jax.__version__})")
    print("bound at the initial hyperparameters: " +
          ", ".join(f"{k} {v:.10g}" for k, v in b0.items()))
    for name, t in systems:
        theta, b, sec, evals = train(X, y, Z, theta0, a.iterations, t)
        rmse = predict_rmse(jnp.asarray(theta), X, y, Z, Xs, ys, t)
        print(f"  {name:11s} bound {b:.6g}  test RMSE {rmse:.4f}  {sec * 1e3:.1f} ms per "
              f"value_and_grad ({evals} evaluations)  lengthscale {math.exp(theta[0]):.4f}")


if __name__ == "__main__":
    main()
