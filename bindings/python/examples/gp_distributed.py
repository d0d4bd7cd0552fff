#!/usr/bin/env python3
"""Exact Gaussian-process regression with the training data sharded across torch.distributed ranks.

Each rank holds its own rows of the training inputs X and targets y (the counts need not be
equal, and a rank may hold none) and its own share of the test points. Conjugate gradients
solve (K + s^2 I) alpha = y with K_ij = exp(-|x_i - x_j|^2 / (2 l^2)) never built: each step's
mat-vec is one symred.distributed reduction, in which the ranks' blocks of X and of the search
direction travel around a ring, and each dot product is an all_reduce. The prediction at each
rank's test points reduces over every rank's training rows the same way. Rank 0 then gathers
the data and solves the same problem in one process with symred.torch, and prints the largest
difference between the two, first of one kernel mat-vec, then of the predictions (the two
solves stop at the same residual but round differently, so their predictions agree to about
the tolerance times the system's condition number).

    python3 gp_distributed.py --ranks 3 --n 2000     # spawns 3 gloo ranks on this machine
    torchrun --nproc-per-node 3 gp_distributed.py    # or let torchrun start them

Exit status 0 when the sharded mat-vec equals one process's (relative 1e-12 in float64, 1e-5
in float32), the predictions agree (1e-6, 1e-3) and beat predicting the mean.
"""

import argparse
import os
import socket
import sys

import numpy as np

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    import symred.torch as storch
    from symred.distributed import Genred
except ImportError as e:  # torch or the package is missing: say so plainly
    sys.exit(f"gp_distributed: {e}")

FORMULA = "Exp(-g * SqDist(x, y)) * b"


def truth(x):
    """A smooth test function of d variables."""
    return np.sin(3.0 * x).sum(axis=1) + 0.5 * np.cos(5.0 * x[:, 0])


def problem(a):
    """The whole data set, the same on every rank (drawn from one seed)."""
    rng = np.random.default_rng(a.seed)
    X = rng.uniform(0.0, 1.0, (a.n, a.dim))
    T = rng.uniform(0.0, 1.0, (a.ntest, a.dim))
    y = truth(X) + a.noise * rng.standard_normal(a.n)
    return X, T, y


def shares(n, world):
    """Uneven row counts per rank that add up to n: rank r gets about (r + 1) parts."""
    w = np.arange(1, world + 1, dtype=float)
    cuts = np.floor(np.cumsum(w) / w.sum() * n).astype(int)
    return np.diff(np.concatenate([[0], cuts]))


def aliases(d):
    return [f"x = Vi({d})", f"y = Vj({d})", "b = Vj(1)", "g = Pm(1)"]


def cg(matvec, dot, b, tol, maxiter):
    """Conjugate gradients on this rank's rows; dot() sums over the ranks."""
    x = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = dot(r, r)
    bnorm = dot(b, b) ** 0.5
    for it in range(1, maxiter + 1):
        Ap = matvec(p)
        alpha = rr / dot(p, Ap)
        x += alpha * p
        r -= alpha * Ap
        rr_new = dot(r, r)
        if rr_new**0.5 <= tol * bnorm:
            return x, it
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x, maxiter


def run(rank, world, a):
    dt = getattr(torch, a.dtype)
    X, T, y = problem(a)
    cx = np.concatenate([[0], np.cumsum(shares(a.n, world))])
    ct = np.concatenate([[0], np.cumsum(shares(a.ntest, world))])
    mine, tmine = slice(cx[rank], cx[rank + 1]), slice(ct[rank], ct[rank + 1])
    x = torch.tensor(X[mine], dtype=dt)
    t = torch.tensor(T[tmine], dtype=dt)
    b = torch.tensor(y[mine, None], dtype=dt)
    g = torch.tensor([1.0 / (2.0 * a.lengthscale**2)], dtype=dt)
    s2 = a.noise**2

    kmv = Genred(FORMULA, aliases(a.dim), reduction_op="Sum", axis=1)

    def dot(u, v):
        s = (u * v).sum().reshape(1).to(torch.float64)
        dist.all_reduce(s)
        return float(s)

    kb = kmv(x, x, b, g)  # one mat-vec, K y, for the comparison below
    alpha, iters = cg(lambda p: kmv(x, x, p, g) + s2 * p, dot, b, a.tol, a.maxiter)
    mean = kmv(t, x, alpha, g)

    # Rank 0 gathers the results and compares them with one process's.
    parts, kparts = [None] * world, [None] * world
    dist.all_gather_object(parts, mean[:, 0].tolist())
    dist.all_gather_object(kparts, kb[:, 0].tolist())
    if rank != 0:
        return 0
    sharded = np.concatenate([np.asarray(q) for q in parts])
    k_sharded = np.concatenate([np.asarray(q) for q in kparts])
    one = storch.Genred(FORMULA, aliases(a.dim), reduction_op="Sum", axis=1)
    xa, ta = torch.tensor(X, dtype=dt), torch.tensor(T, dtype=dt)
    ya = torch.tensor(y[:, None], dtype=dt)

    def dot1(u, v):
        return float((u * v).sum().to(torch.float64))

    alpha1, iters1 = cg(lambda p: one(xa, xa, p, g) + s2 * p, dot1, ya, a.tol, a.maxiter)
    single = one(ta, xa, alpha1, g)[:, 0].numpy()
    k_single = one(xa, xa, ya, g)[:, 0].numpy()

    def rel(u, v):
        return float(np.abs(u - v).max() / max(np.abs(v).max(), 1e-300))

    kdiff, diff = rel(k_sharded, k_single), rel(sharded, single)
    f_true = truth(T)
    rmse = float(np.sqrt(np.mean((sharded - f_true) ** 2)))
    baseline = float(np.sqrt(np.mean((f_true - y.mean()) ** 2)))
    print(f"GP regression on {world} ranks (gloo): n={a.n} (rows per rank "
          f"{', '.join(str(int(c)) for c in np.diff(cx))}) ntest={a.ntest} dim={a.dim} "
          f"dtype={a.dtype}")
    print(f"CG: {iters} iterations sharded, {iters1} in one process")
    print(f"largest difference from one process: mat-vec K y {kdiff:.2e}, prediction "
          f"{diff:.2e} (relative)")
    print(f"test RMSE vs the noise-free function: {rmse:.4f} "
          f"(predicting the mean: {baseline:.4f}; noise level {a.noise})")
    kbound, bound = (1e-12, 1e-6) if a.dtype == "float64" else (1e-5, 1e-3)
    return 0 if kdiff <= kbound and diff <= bound and rmse < baseline else 1


def spawned(rank, world, port, a):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        code = run(rank, world, a)
    finally:
        dist.destroy_process_group()
    if code:
        sys.exit(code)  # mp.spawn raises ProcessExitedException in the parent


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=3,
                    help="gloo ranks to spawn (default 3; ignored under torchrun)")
    ap.add_argument("--n", type=int, default=2000, help="training points (default 2000)")
    ap.add_argument("--ntest", type=int, default=200, help="test points (default 200)")
    ap.add_argument("--dim", type=int, default=3, help="input dimension (default 3)")
    ap.add_argument("--lengthscale", type=float, default=0.3)
    ap.add_argument("--noise", type=float, default=0.1, help="noise standard deviation s")
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--tol", type=float, default=1e-8)
    ap.add_argument("--maxiter", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.n < 1 or a.ntest < 1 or a.dim < 1 or a.ranks < 1:
        ap.error("--n, --ntest, --dim and --ranks must be positive")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        dist.init_process_group("gloo")
        try:
            return run(dist.get_rank(), dist.get_world_size(), a)
        finally:
            dist.destroy_process_group()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.spawn(spawned, args=(a.ranks, port, a), nprocs=a.ranks)
    except mp.ProcessExitedException:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
