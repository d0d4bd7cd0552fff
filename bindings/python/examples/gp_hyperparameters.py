#!/usr/bin/env python3
"""Learning the hyperparameters of an exact GP with symred.torch, as GPyTorch does with KeOps.

The model: y = f(x) + noise, f ~ GP(0, k), k(x, x') = v exp(-|x - x'|^2 / (2 l^2)), noise
N(0, s2). The lengthscale l, the variance v and the noise s2 maximise the log marginal
likelihood

    L = -1/2 y' A^-1 y - 1/2 log det A - n/2 log(2 pi),       A = K + s2 I,

whose gradient is dL/dt = 1/2 a' (dA/dt) a - 1/2 tr(A^-1 dA/dt) with a = A^-1 y. The n x n
matrix A is never built: every product with it is one symred Sum reduction (K applied to a
block of columns at once), and

  - a and the probe solutions u_k = A^-1 z_k come from one batched conjugate-gradient solve
    of A [a, U] = [y, Z] (a warm-started from the previous step), preconditioned as in
    GPyTorch by a rank-k pivoted Cholesky factor of the kernel matrix, P = L L' + s2 I,
    applied by the Woodbury identity: a few kernel products per step instead of hundreds;
  - the trace is Hutchinson's estimate tr(A^-1 dA) ~ mean_k u_k' dA z_k with Rademacher
    probes z_k drawn afresh at every step (the stochastic trace estimation of GPyTorch's
    BBMM; the preconditioner only speeds the solves, so the estimate stays unbiased);
  - both terms are the gradient of one surrogate scalar,
        S = 1/2 a' A a - 1/2 mean_k u_k' A z_k   (a, u_k, z_k held constant),
    so torch autograd differentiates A [a, Z] = v K [a, Z] + s2 [a, Z] through symred.torch's
    backward (the gradient kernel of the reduction with respect to the parameter
    g = 1/(2 l^2)), and Adam takes a step on the log-hyperparameters.

Then the posterior mean at test points, v K(T, X) A^-1 y, gives the test RMSE against the
noise-free function.

    python3 gp_hyperparameters.py --n 20000
"""

import argparse
import math
import sys
import time

try:
    import torch

    from symred.torch import Genred
except ImportError as e:  # the library, the package or torch is missing: say so plainly
    sys.exit(f"gp_hyperparameters: {e}")

TRUE = {"lengthscale": 0.25, "variance": 1.5, "noise": 0.04}  # noise: the variance s2
START = {"lengthscale": 0.5, "variance": 1.0, "noise": 0.15}


def gp_sample(gen, features=4000):
    """f ~ GP(0, v exp(-|x - x'|^2 / (2 l^2))) with the true v and l, drawn by random Fourier
    features (covariance exact up to O(1/sqrt(features))), as a function of x."""
    omega = torch.randn(features, 2, generator=gen, dtype=torch.float64) / TRUE["lengthscale"]
    phase = 2 * math.pi * torch.rand(features, generator=gen, dtype=torch.float64)
    w = torch.randn(features, generator=gen, dtype=torch.float64)
    scale = math.sqrt(2.0 * TRUE["variance"] / features)
    return lambda x: scale * torch.cos(x @ omega.T + phase) @ w


_kernels = {}
BACKEND = "auto"  # symred's backend for every reduction (the tests choose "CPU")


def gauss_matvec(X, T, W, g):
    """sum_j exp(-g |X_i - T_j|^2) W_j for every row i: one symred reduction, differentiable
    with respect to g (and W, X, T)."""
    d, c = X.shape[1], W.shape[1]
    k = _kernels.get((d, c))
    if k is None:
        k = Genred("Exp(-g * SqDist(x, y)) * b",
                   [f"x = Vi({d})", f"y = Vj({d})", f"b = Vj({c})", "g = Pm(1)"],
                   reduction_op="Sum", axis=1)
        _kernels[(d, c)] = k
    return k(X, T, W, g.reshape(1), backend=BACKEND)


def hyper(raw):
    """(lengthscale, variance, noise) from the unconstrained log-parameters."""
    return raw.exp().unbind()


def cov_matvec(X, raw, W):
    """A W = v K W + s2 W."""
    ell, var, noise = hyper(raw)
    return var * gauss_matvec(X, X, W, 1.0 / (2.0 * ell**2)) + noise * W


def pivoted_cholesky(X, raw, rank):
    """L (n x r, r <= rank) with L L' ~ v K by greedy pivoted Cholesky: each pivot costs one
    kernel column, computed densely (n values)."""
    with torch.no_grad():
        ell, var, _ = hyper(raw)
        n = X.shape[0]
        diag = torch.full((n,), float(var), dtype=X.dtype)
        L = X.new_zeros(n, min(rank, n))
        for m in range(L.shape[1]):
            i = int(torch.argmax(diag))
            if diag[i] <= 1e-6 * var:
                return L[:, :m]
            col = var * torch.exp(-((X - X[i]) ** 2).sum(1) / (2 * ell**2))
            L[:, m] = (col - L[:, :m] @ L[i, :m]) / diag[i].sqrt()
            diag -= L[:, m] ** 2
        return L


def preconditioner(L, noise):
    """R -> P^-1 R for P = L L' + noise I, by the Woodbury identity (a k x k Cholesky)."""
    C = torch.linalg.cholesky(noise * torch.eye(L.shape[1], dtype=L.dtype) + L.T @ L)
    return lambda R: (R - L @ torch.cholesky_solve(L.T @ R, C)) / noise


def conjugate_gradients(matvec, B, X0=None, tol=1e-3, maxiter=200, precond=None):
    """Solves A X = B column by column (all columns in each product) by preconditioned CG
    from X0. Returns X and the number of products with A."""
    M = precond if precond is not None else (lambda R: R)
    X = torch.zeros_like(B) if X0 is None else X0.clone()
    R = B - matvec(X) if X0 is not None else B.clone()
    Zr = M(R)
    P = Zr.clone()
    rz = (R * Zr).sum(0)
    stop = (tol * B.norm(dim=0)) ** 2
    products = int(X0 is not None)
    for _ in range(maxiter):
        if bool(((R * R).sum(0) <= stop).all()):
            break
        AP = matvec(P)
        products += 1
        pap = (P * AP).sum(0)
        alpha = torch.where(pap > 0, rz / pap, torch.zeros_like(rz))
        X += alpha * P
        R -= alpha * AP
        Zr = M(R)
        rz_new = (R * Zr).sum(0)
        P = Zr + torch.where(rz > 0, rz_new / rz, torch.zeros_like(rz)) * P
        rz = rz_new
    return X, products


def surrogate(X, y, raw, Z, tol=1e-3, maxiter=200, warm=None, rank=0):
    """The scalar S whose gradient with respect to raw is the estimate of dL/draw (see the
    module's docstring), and the solution [a, U] to warm-start the next call. Z (n x t) are
    the probes; Z = I gives the exact trace."""
    with torch.no_grad():
        pre = preconditioner(pivoted_cholesky(X, raw, rank), hyper(raw)[2]) if rank else None
        sol, iters = conjugate_gradients(lambda W: cov_matvec(X, raw, W),
                                         torch.cat([y, Z], 1), warm, tol, maxiter, pre)
    a, U = sol[:, :1], sol[:, 1:]
    AW = cov_matvec(X, raw, torch.cat([a, Z], 1))
    S = 0.5 * (a * AW[:, :1]).sum() - 0.5 * (U * AW[:, 1:]).sum() / Z.shape[1]
    return S, sol, iters


def rademacher(n, t, dtype, gen):
    return torch.randint(0, 2, (n, t), generator=gen).to(dtype) * 2 - 1


def make_data(n, ntest, dtype, seed):
    """n noisy training points of a GP sample on [0, 1]^2 and ntest noise-free test values."""
    gen = torch.Generator().manual_seed(seed)
    f = gp_sample(gen)
    X = torch.rand(n, 2, generator=gen, dtype=torch.float64)
    T = torch.rand(ntest, 2, generator=gen, dtype=torch.float64)
    y = f(X) + math.sqrt(TRUE["noise"]) * torch.randn(n, generator=gen, dtype=torch.float64)
    return X.to(dtype), y.to(dtype)[:, None], T.to(dtype), f(T).to(dtype)


def train(X, y, iters, lr, probes, tol, cg_iters, gen, rank=100, log=print):
    """Adam on the log-hyperparameters from START; returns them, the last CG solution and the
    number of kernel products."""
    raw = torch.tensor([math.log(START[k]) for k in ("lengthscale", "variance", "noise")],
                       dtype=X.dtype, requires_grad=True)
    # A short second-moment memory: the first gradients are orders of magnitude larger than
    # those near the optimum, and with the default 0.999 they would freeze the late steps.
    opt = torch.optim.Adam([raw], lr=lr, betas=(0.8, 0.9))
    # The step shrinks linearly to a tenth: big moves first, then settling on the optimum.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 - 0.9 * k / max(1, iters - 1))
    warm, products = None, 0
    for step in range(iters):
        Z = rademacher(X.shape[0], probes, X.dtype, gen)  # new probes at every step
        if warm is not None:
            warm = torch.cat([warm[:, :1], torch.zeros_like(Z)], 1)
        opt.zero_grad()
        S, sol, it = surrogate(X, y, raw, Z, tol, cg_iters, warm, rank)
        products += it + 1  # + the surrogate
        warm = sol.detach()
        (-S).backward()  # maximise L: minimise -S, whose gradient is -dL/draw
        opt.step()
        sched.step()
        if step % 3 == 0 or step == iters - 1:
            ell, var, noise = (float(v) for v in hyper(raw.detach()))
            log(f"  step {step:3d}: lengthscale {ell:.4f}  variance {var:.4f}  noise "
                f"{noise:.4f}  (CG {it} products)")
    return raw.detach(), warm, products


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="training points (default 20000)")
    ap.add_argument("--ntest", type=int, default=2000, help="test points (default 2000)")
    ap.add_argument("--iters", type=int, default=40, help="Adam steps (default 40)")
    ap.add_argument("--lr", type=float, default=0.2, help="Adam learning rate (default 0.2)")
    ap.add_argument("--probes", type=int, default=6, help="Hutchinson probes (default 6)")
    ap.add_argument("--tol", type=float, default=0.01,
                    help="CG relative residual while training (default 0.01)")
    ap.add_argument("--cg-iters", type=int, default=50,
                    help="most CG products per training step (default 50)")
    ap.add_argument("--pred-tol", type=float, default=1e-4,
                    help="CG relative residual of the final solve (default 1e-4)")
    ap.add_argument("--rank", type=int, default=100,
                    help="rank of the pivoted-Cholesky preconditioner, 0 for none (default 100)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.n < 2 or a.ntest < 1 or a.iters < 0 or a.probes < 1:
        ap.error("--n must be at least 2; --ntest, --probes positive; --iters >= 0")
    dtype = getattr(torch, a.dtype)
    X, y, T, ftest = make_data(a.n, a.ntest, dtype, a.seed)
    gen = torch.Generator().manual_seed(a.seed + 1)

    print(f"GP hyperparameters: n={a.n} ntest={a.ntest} dim=2 dtype={a.dtype} "
          f"iters={a.iters} probes={a.probes} CG tol={a.tol} preconditioner rank={a.rank}")
    t0 = time.perf_counter()
    raw, warm, products = train(X, y, a.iters, a.lr, a.probes, a.tol, a.cg_iters, gen,
                                a.rank)
    t_train = time.perf_counter() - t0

    with torch.no_grad():
        t0 = time.perf_counter()
        pre = (preconditioner(pivoted_cholesky(X, raw, a.rank), hyper(raw)[2])
               if a.rank else None)
        alpha, iters = conjugate_gradients(lambda W: cov_matvec(X, raw, W), y,
                                           warm[:, :1] if warm is not None else None,
                                           a.pred_tol, 1000, pre)
        ell, var, noise = hyper(raw)
        mean = var * gauss_matvec(T, X, alpha, 1.0 / (2.0 * ell**2))[:, 0]
        t_pred = time.perf_counter() - t0
    rmse = float(((mean - ftest) ** 2).mean().sqrt())
    baseline = float(((ftest - y.mean()) ** 2).mean().sqrt())
    print(f"training: {t_train:.1f} s ({products} kernel products of {a.n} x {a.n} with "
          f"{a.probes + 1} columns, and {a.iters} gradient kernels)")
    print("learned vs true:")
    for k, v in zip(("lengthscale", "variance", "noise"), (ell, var, noise)):
        print(f"  {k:12s} {float(v):.4f}   true {TRUE[k]:.4f}   start {START[k]:.4f}")
    print(f"prediction: CG {iters} products, {t_pred:.1f} s")
    print(f"test RMSE vs the noise-free function: {rmse:.4f} (predicting the mean: "
          f"{baseline:.4f}; noise std {math.sqrt(TRUE['noise']):.4f})")
    return 0 if rmse < baseline else 1


if __name__ == "__main__":
    sys.exit(main())
