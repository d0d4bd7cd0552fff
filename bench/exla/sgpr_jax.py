"""SGPR (Titsias' collapsed bound, as GPflow's SGPR.elbo) written in JAX, with the n-sized work
(K_uf K_fu and K_uf y) done by symred.jax inside the jitted bound and differentiated by
jax.grad; beside the same bound with K_uf materialised in jax.numpy, and beside GPflow's SGPR.

For the squared-exponential kernel k(z, x) = v exp(-g |z - x|^2), row a of K_uf K_fu is
    sum_i k(z_a, x_i) e_i,   e_i = (k(z_b, x_i))_b = v exp(-g (|z_b|^2 - 2 <z_b, x_i> + |x_i|^2)),
one symred Sum with M rows (the inducing points), M-wide output and the n points reduced
(``terms_symred``): e_i depends on the point only (the inducing points are a parameter), so
symred computes it once per point and tile, and the M x n matrix is never built. K_uf y is a
second symred Sum. ``terms_midpoint`` is the other symred form: k(z_a, x) k(z_b, x) =
v^2 exp(-g/2 |z_a - z_b|^2) exp(-2 g |x - (z_a + z_b)/2|^2), a Gaussian sum at the M^2
midpoints (M^2 n exponentials, slower). The data, inducing points (fixed) and initial
hyperparameters are sgpr_model's (the eXLA SGPR experiment, docs/sgpr.md).

Training (default): L-BFGS-B on jax.value_and_grad, symred.jax beside the dense bound.

    SYMRED_LIB=build/libsymred.so ~/.cache/symred-venv/bin/python bench/exla/sgpr_jax.py \
        [--n 10000] [--M 100] [--iterations 10]

--compare: for each n of --ns and M of --Ms, each system of --systems (symred, midpoint, dense,
gpflow) runs in a child process: the bound and its gradient at the initial hyperparameters,
the seconds per value-and-gradient step (median of --steps after a warm-up that compiles) and
the child's peak RSS. GPflow runs under bench/exla/.venv/bin/python (setup.sh installs it),
with the exp bijector for positive parameters, so its unconstrained parameters are the log
hyperparameters of the JAX bound; the table gives each bound's relative difference from
GPflow's and the largest relative difference of the gradients.

    SYMRED_LIB=build/libsymred.so OMP_WAIT_POLICY=passive ~/.cache/symred-venv/bin/python \
        bench/exla/sgpr_jax.py --compare --ns 100000 --Ms 100,200 [--steps 3] [--timeout 900]
"""

import argparse
import functools
import json
import math
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "python"))

JITTER = 1e-6  # as GPflow's default_jitter()
SYSTEMS = ("symred", "midpoint", "dense", "gpflow")


def _jax():
    """jax with float64 (imported here: the GPflow child never imports it)."""
    import jax
    jax.config.update("jax_enable_x64", True)
    return jax


@functools.lru_cache(maxsize=None)
def _genreds(M):
    """The symred.jax reductions of M inducing points in 3-D: the M-wide Sum of K_uf K_fu,
    its derivative in g, K_uf y, and the Gaussian sum of the midpoint form."""
    _jax()
    import symred.jax as sjax
    q = "(SqNorm2(x) - 2 * MatVecMult(Zt, x) + zn)"  # |z_b - x|^2, b = 1..M
    wide_aliases = ["z = Vi(3)", "x = Vj(3)", "g = Pm(1)", f"Zt = Pm({3 * M})", f"zn = Pm({M})"]
    wide = sjax.Genred(f"Exp(-g * SqDist(z, x)) * Exp(-g * {q})", wide_aliases,
                       reduction_op="Sum", axis=1)
    # d/dg of the M-wide Sum, -(SqDist(z, x) + q) k e. symred's sum split runs it as two Sums
    # of F * B whose B (e, q e) depends on the point only, each a tile of F times B's tile (B
    # hoisted), where the planner estimates that cheaper than the direct strategy (M >= 20;
    # docs/simplifier.md).
    dwide_sum = sjax.Genred(f"(SqDist(z, x) + {q}) * Exp(-g * SqDist(z, x)) * Exp(-g * {q})",
                            wide_aliases, reduction_op="Sum", axis=1)

    def dwide(*args):
        return -dwide_sum(*args)

    kuf_y = sjax.Genred("Exp(-g * SqDist(z, x)) * y",
                        ["z = Vi(3)", "x = Vj(3)", "y = Vj(1)", "g = Pm(1)"],
                        reduction_op="Sum", axis=1)
    pair_sum = sjax.Genred("Exp(-g * SqDist(m, x))", ["m = Vi(3)", "x = Vj(3)", "g = Pm(1)"],
                           reduction_op="Sum", axis=1)
    return wide, dwide, kuf_y, pair_sum


def _sqdist(a, b):
    return ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)


def terms_symred(X, y, Z, g):
    """P = E E^T and r = E y for E_ai = exp(-g |z_a - x_i|^2), through symred.jax: one M-row,
    M-wide Sum over the points for P, one Sum for r. P's derivative in g is one more M-wide
    Sum, which symred's sum split runs as two (a jax.custom_jvp: symred's own gradient kernel
    of the M-wide Sum with respect to a parameter runs per pair over the M-wide cotangent, 9x
    the forward at M = 100); X and Z are data and fixed inducing points, not differentiated.
    Each of these Sums is a tile of a scalar F times the tile of a B that depends on the point
    only, evaluated once per tile of points (docs/wide.md)."""
    jax = _jax()
    M = Z.shape[0]
    wide, dwide, kuf_y, _ = _genreds(M)
    Zt, zn = Z.reshape(-1), (Z * Z).sum(1)

    @jax.custom_jvp
    def p(g):
        return wide(Z, X, g, Zt, zn)

    @p.defjvp
    def p_jvp(primals, tangents):
        (g,), (dg,) = primals, tangents
        return wide(Z, X, g, Zt, zn), dwide(Z, X, g, Zt, zn) * dg[0]

    P = p(g)
    P = 0.5 * (P + P.T)  # symmetric to rounding: the Cholesky factor below sees a symmetric P
    return P, kuf_y(Z, X, y[:, None], g)[:, 0]


def terms_midpoint(X, y, Z, g):
    """The same through symred.jax's Gaussian sum at the M^2 midpoints of the inducing points."""
    import jax.numpy as jnp
    M = Z.shape[0]
    _, _, kuf_y, pair_sum = _genreds(M)
    mid = ((Z[:, None, :] + Z[None, :, :]) / 2).reshape(M * M, 3)
    S = pair_sum(mid, X, 2 * g).reshape(M, M)
    P = jnp.exp(-0.5 * g[0] * _sqdist(Z, Z)) * S
    return P, kuf_y(Z, X, y[:, None], g)[:, 0]


def terms_dense(X, y, Z, g):
    """The same with E (M x n) materialised in jax.numpy."""
    import jax.numpy as jnp
    E = jnp.exp(-g[0] * _sqdist(Z, X))
    return E @ E.T, E @ y


TERMS = {"symred": terms_symred, "midpoint": terms_midpoint, "dense": terms_dense}


def bound(theta, X, y, Z, terms=terms_symred):
    """The collapsed bound at theta = (log lengthscale, log variance, log noise variance)."""
    jax = _jax()
    import jax.numpy as jnp
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
    jax = _jax()
    import jax.numpy as jnp
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
    import numpy as np
    from scipy.optimize import minimize
    jax = _jax()
    import jax.numpy as jnp
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


def _problem(n, M):
    """sgpr_model's data (n training points), inducing points and initial log hyperparameters,
    as NumPy arrays."""
    import numpy as np
    import sgpr_model
    X, y, _, _ = sgpr_model.make_data(n, 0)
    Z = sgpr_model.inducing_points(X, M)
    init = sgpr_model.INIT
    theta0 = np.log([init["lengthscale"], init["variance"], init["noise_variance"]])
    return X, y, Z, theta0


def _peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _timed_steps(step, steps):
    """The first call (compiles) and the median of ``steps`` further calls, in seconds."""
    t0 = time.perf_counter()
    first = step()
    first_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    return first, first_s, times[len(times) // 2] if times else None


def child_jax(system, n, M, steps):
    """One system's bound, gradient and time per jitted value-and-gradient step."""
    import numpy as np
    jax = _jax()
    import jax.numpy as jnp
    X, y, Z, theta0 = (jnp.asarray(a) for a in _problem(n, M))
    terms = TERMS[system]
    vg = jax.jit(jax.value_and_grad(lambda t: bound(t, X, y, Z, terms)))

    def step():
        val, grad = vg(theta0)
        return float(val), np.asarray(grad).tolist()

    (val, grad), first_s, sec = _timed_steps(step, steps)
    return {"bound": val, "grad": grad, "first_seconds": first_s, "seconds_per_step": sec,
            "jax": jax.__version__}


def child_gpflow(n, M, steps):
    """GPflow's SGPR on the same data, inducing points (fixed) and initial hyperparameters;
    positive parameters through the exp bijector; its gradient is given with respect to the
    log hyperparameters, theta of the JAX bound."""
    import gpflow
    import sgpr_model
    import tensorflow as tf
    gpflow.config.set_default_positive_bijector("exp")
    X, y, Z, _ = _problem(n, M)
    init = sgpr_model.INIT
    m = gpflow.models.SGPR(
        (X, y[:, None]),
        gpflow.kernels.SquaredExponential(variance=init["variance"],
                                          lengthscales=init["lengthscale"]),
        inducing_variable=Z.copy(), noise_variance=init["noise_variance"])
    gpflow.set_trainable(m.inducing_variable, False)
    variables = [m.kernel.lengthscales.unconstrained_variable,
                 m.kernel.variance.unconstrained_variable,
                 m.likelihood.variance.unconstrained_variable]

    @tf.function
    def vg():
        with tf.GradientTape() as tape:
            elbo = m.elbo()
        return elbo, tape.gradient(elbo, variables)

    # d/d log p = p / exp(u) d/du: exp(u) is p less the parameter's lower bound (GPflow's
    # Gaussian likelihood keeps its variance above 1e-6)
    scale = [float(p.numpy()) / math.exp(float(p.unconstrained_variable.numpy()))
             for p in (m.kernel.lengthscales, m.kernel.variance, m.likelihood.variance)]

    def step():
        val, grad = vg()
        return float(val), [float(g) * c for g, c in zip(grad, scale)]

    (val, grad), first_s, sec = _timed_steps(step, steps)
    return {"bound": val, "grad": grad, "first_seconds": first_s, "seconds_per_step": sec,
            "gpflow": gpflow.__version__, "tensorflow": tf.__version__}


def run_child(a):
    system, n, M = a.child, a.n, a.M
    try:
        out = (child_gpflow(n, M, a.steps) if system == "gpflow"
               else child_jax(system, n, M, a.steps))
        out["status"] = "ok"
    except MemoryError as e:
        out = {"status": "oom", "reason": str(e)[:300]}
    except Exception as e:  # noqa: BLE001 - XLA's and TensorFlow's allocation failures
        text = f"{type(e).__name__}: {e}"
        oom = any(w in text for w in ("RESOURCE_EXHAUSTED", "OOM", "ResourceExhausted",
                                      "out of memory", "bad_alloc"))
        out = {"status": "oom" if oom else "error", "reason": text[:300]}
    out["peak_rss_bytes"] = _peak_rss()
    print("RESULT " + json.dumps(out), flush=True)


def _child_python(system):
    if system == "gpflow":
        return os.path.join(HERE, ".venv", "bin", "python")
    return sys.executable


def compare(a):
    ns = [int(float(v)) for v in a.ns.split(",")]
    Ms = [int(v) for v in a.Ms.split(",")]
    systems = [s.strip() for s in a.systems.split(",")]
    print(f"SGPR value-and-gradient at the initial hyperparameters, float64, median of "
          f"{a.steps} steps after a warm-up; load average {os.getloadavg()[0]:.1f}")
    print(f"{'n':>8} {'M':>4} {'system':9} {'bound':>20} {'rel. to gpflow':>14} "
          f"{'grad rel.':>9} {'s/step':>8} {'first s':>8} {'peak RSS':>9}")
    for n in ns:
        for M in Ms:
            res = {}
            for s in systems:
                cmd = [_child_python(s), os.path.abspath(__file__), "--child", s, "--n", str(n),
                       "--M", str(M), "--steps", str(a.steps)]
                try:
                    p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
                    line = next((ln for ln in p.stdout.splitlines()
                                 if ln.startswith("RESULT ")), None)
                    r = (json.loads(line[7:]) if line else
                         {"status": "error", "reason": f"exit {p.returncode}: " +
                          (p.stderr.strip().splitlines() or [""])[-1][:200]})
                except subprocess.TimeoutExpired:
                    r = {"status": "timeout", "reason": f"over {a.timeout} s"}
                res[s] = r
            ref = res.get("gpflow", {})
            for s, r in res.items():
                if r["status"] != "ok":
                    print(f"{n:>8} {M:>4} {s:9} {r['status']}: {r.get('reason', '')}")
                    continue
                rel = grel = ""
                if ref.get("status") == "ok" and s != "gpflow":
                    rel = f"{abs(r['bound'] - ref['bound']) / abs(ref['bound']):.1e}"
                    grel = f"{max(abs(u - w) / max(abs(w), 1e-300) for u, w in zip(r['grad'], ref['grad'])):.1e}"
                print(f"{n:>8} {M:>4} {s:9} {r['bound']:20.12g} {rel:>14} {grel:>9} "
                      f"{r['seconds_per_step']:8.3f} {r['first_seconds']:8.2f} "
                      f"{r['peak_rss_bytes'] / 1e6:7.0f}MB", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--M", type=int, default=100)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--no-dense", action="store_true")
    ap.add_argument("--compare", action="store_true",
                    help="bound, gradient, time per step and peak RSS per system (children)")
    ap.add_argument("--ns", default="100000")
    ap.add_argument("--Ms", default="100")
    ap.add_argument("--systems", default="symred,dense,gpflow")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per child")
    ap.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return run_child(a)
    if a.compare:
        return compare(a)
    import numpy as np
    import sgpr_model
    jax = _jax()
    import jax.numpy as jnp
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
