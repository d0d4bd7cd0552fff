"""Sparse GP regression (Titsias' collapsed bound, as GPflow's SGPR) on torch, with the n-sized
terms from symred under a memory budget or from dense torch matrices.

The model, formulas and memory accounting are in docs/sgpr.md. In short, with
K_uf = v E (E_ai = exp(-g |z_a - x_i|^2), g = 1 / (2 l^2), an isotropic SE kernel), the bound
needs only three n-sized quantities:

    P = K_uf K_fu  (M x M),   r = K_uf y  (M),   sum_i k(x_i, x_i) = n v,

and everything else is M x M algebra (shared by both systems here: :func:`collapsed_bound`).
``SymredTerms`` computes P blockwise over n from ``sr_kernel_eval_block`` blocks of E whose size
comes from the memory budget (with Q = E (dE/dg)^T beside it for the gradient, dE/dg being the
derivative formula built by symred's ``Grad``), and r by a symred.torch ``Sum`` reduction
differentiated by symred (``sr_kernel_grad``). ``DenseTerms`` materialises K_uf (M x n).
"""

import math
import os
import sys
import time

import numpy as np
import torch

_BINDINGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings",
                         "python")
if os.path.isdir(_BINDINGS) and _BINDINGS not in sys.path:
    sys.path.insert(0, os.path.abspath(_BINDINGS))

JITTER = 1e-6  # added to K_uu, as GPflow's default_jitter()
NOISE_STD = 0.1  # the noise of the synthetic targets: the test RMSE's floor
DIM = 3


def truth(x):
    """The known smooth function of the synthetic data (inputs in [0, 1]^3); its variance is
    about 0.4, so the signal-to-noise ratio is about 40 at NOISE_STD = 0.1."""
    x1, x2, x3 = x[:, 0], x[:, 1], x[:, 2]
    return (np.sin(2 * np.pi * 2 * x1) * np.cos(2 * np.pi * 1.5 * x2)
            + 0.5 * np.sin(2 * np.pi * 1.5 * (x1 + x2 + x3))
            + 0.3 * np.cos(2 * np.pi * 3 * x3 * x1))


def make_data(n_train, n_test, seed=0):
    """Synthetic 3-D regression data (the shape of UCI 3droad): x uniform on [0, 1]^3,
    y = truth(x) + N(0, NOISE_STD^2); a fixed-seed draw, train first, test after."""
    rng = np.random.default_rng(seed)
    x = rng.random((n_train + n_test, DIM))
    y = truth(x) + NOISE_STD * rng.standard_normal(n_train + n_test)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def inducing_points(x, M, seed=1):
    """Z: the first M rows of a fixed random permutation of the training inputs, so the Z of a
    smaller M is a subset of a larger one's; fixed during training."""
    perm = np.random.default_rng(seed).permutation(x.shape[0])
    return np.ascontiguousarray(x[perm[:M]])


# Initial hyperparameters (the same for every system): lengthscale, variance, noise variance.
INIT = {"lengthscale": 0.3, "variance": 1.0, "noise_variance": 0.1}


def sqdist(a, b):
    """|a_i - b_j|^2 (torch, dense)."""
    return ((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * a @ b.T).clamp_min(0)


def kuu(Z, g, v):
    """K_uu + jitter I (dense: M x M, not n-sized)."""
    return v * torch.exp(-g * sqdist(Z, Z)) + JITTER * torch.eye(Z.shape[0], dtype=Z.dtype)


def collapsed_bound(P, r, yy, n, trace_kff, Kuu, noise):
    """Titsias' bound as GPflow's SGPR.elbo writes it (A = L^-1 K_uf / sigma, B = I + A A^T),
    from P = K_uf K_fu, r = K_uf y, yy = y'y and sum_i k(x_i, x_i), differentiated by torch
    autograd through the Cholesky factors. The reference that :class:`CollapsedBound` (the one
    the benchmark trains with) is tested against."""
    L = torch.linalg.cholesky(Kuu)
    M = Kuu.shape[0]
    T = torch.linalg.solve_triangular(L, P, upper=False)  # L^-1 P
    AAT = torch.linalg.solve_triangular(L, T.T, upper=False) / noise  # L^-1 P L^-T / s2
    LB = torch.linalg.cholesky(AAT + torch.eye(M, dtype=P.dtype))
    Ar = torch.linalg.solve_triangular(L, r[:, None], upper=False)  # L^-1 r = sigma A y
    c = torch.linalg.solve_triangular(LB, Ar, upper=False) / noise
    return (-0.5 * n * math.log(2 * math.pi) - torch.log(torch.diagonal(LB)).sum()
            - 0.5 * n * torch.log(noise) - 0.5 * yy / noise + 0.5 * (c * c).sum()
            - 0.5 * trace_kff / noise + 0.5 * torch.diagonal(AAT).sum())


class CollapsedBound(torch.autograd.Function):
    """The same bound written with S = s K_uu + P = R R^T (s the noise variance):

        bound = -n/2 log 2pi - 1/2 logdet S + 1/2 logdet K_uu + (M - n)/2 log s - yy / (2 s)
                + r' S^-1 r / (2 s) - trace_kff / (2 s) + tr(K_uu^-1 P) / (2 s),

    with its gradient written out (docs/sgpr.md), so that the M x M algebra costs two Cholesky
    factors, two inverses and two products (about 7 M^3 flops, forward and backward) and
    keeps about ten M x M matrices, where autograd through GPflow's form took 2-3 times the
    time and four times the memory (measured at M = 2000). Inputs: P, r, K_uu, s, trace_kff;
    n and yy are numbers. forward also returns nothing else: the prediction factors come
    from :func:`prediction_factors`."""

    @staticmethod
    def forward(ctx, P, r, Kuu, s, trace_kff, n, yy):
        M = Kuu.shape[0]
        L = torch.linalg.cholesky(Kuu)
        R = torch.linalg.cholesky(s * Kuu + P)
        a = torch.cholesky_solve(r[:, None], R)[:, 0]
        Ki = torch.cholesky_inverse(L)
        KiP = Ki @ P
        trKiP = torch.diagonal(KiP).sum()
        logdet_S = 2 * torch.log(torch.diagonal(R)).sum()
        logdet_K = 2 * torch.log(torch.diagonal(L)).sum()
        ra = r @ a
        bound = (-0.5 * n * math.log(2 * math.pi) - 0.5 * logdet_S + 0.5 * logdet_K
                 + 0.5 * (M - n) * torch.log(s) - 0.5 * yy / s + 0.5 * ra / s
                 - 0.5 * trace_kff / s + 0.5 * trKiP / s)
        ctx.save_for_backward(R, a, Ki, KiP, Kuu, s, trace_kff, ra, trKiP)
        ctx.n, ctx.yy = n, yy
        return bound

    @staticmethod
    def backward(ctx, gb):
        R, a, Ki, KiP, Kuu, s, trace_kff, ra, trKiP = ctx.saved_tensors
        n, yy, M = ctx.n, ctx.yy, Kuu.shape[0]
        Si = torch.cholesky_inverse(R)
        aa = torch.outer(a, a)
        # d/dP = -S^-1/2 - a a'/(2s) + K^-1/(2s)
        # d/dK = -s S^-1/2 - a a'/2 + K^-1/2 - K^-1 P K^-1/(2s)
        gP = -0.5 * Si - (0.5 / s) * aa + (0.5 / s) * Ki
        gK = -0.5 * s * Si - 0.5 * aa + 0.5 * Ki - (0.5 / s) * (KiP @ Ki)
        gs = (-0.5 * (Si * Kuu).sum() + 0.5 * (M - n) / s + 0.5 * yy / s ** 2
              - 0.5 * (a @ Kuu @ a) / s - 0.5 * ra / s ** 2 + 0.5 * trace_kff / s ** 2
              - 0.5 * trKiP / s ** 2)
        gr = a / s
        gt = -0.5 / s
        return gb * gP, gb * gr, gb * gK, gb * gs, gb * gt, None, None


def prediction_factors(P, r, Kuu, s):
    """(L, R, a): L L' = K_uu, R R' = s K_uu + P, a = (s K_uu + P)^-1 r."""
    L = torch.linalg.cholesky(Kuu)
    R = torch.linalg.cholesky(s * Kuu + P)
    return L, R, torch.cholesky_solve(r[:, None], R)


def predict(kus_blocks, v, s, L, R, a):
    """Predictive mean and variance of y at test points (GPflow SGPR.predict_y):
    mean = K_su a, var = v - |L^-1 k_u|^2 + s |R^-1 k_u|^2 + s, from pairs (K_us block (M x b),
    work) given by kus_blocks(): work is an M x b tensor to solve into, or None (allocate)."""
    means, variances = [], []
    for Kus, work in kus_blocks():
        means.append(a[:, 0] @ Kus)
        q1 = torch.linalg.solve_triangular(L, Kus, upper=False, out=work).pow_(2).sum(0)
        q2 = torch.linalg.solve_triangular(R, Kus, upper=False, out=work).pow_(2).sum(0)
        variances.append(v - q1 + s * q2 + s)
    return torch.cat(means), torch.cat(variances)


def metrics(mean, var, y):
    """Test RMSE and NLPD (mean of -log N(y; mean, var))."""
    mean, var = mean.detach().numpy(), var.detach().numpy()
    rmse = float(np.sqrt(np.mean((mean - y) ** 2)))
    nlpd = float(np.mean(0.5 * np.log(2 * np.pi * var) + 0.5 * (y - mean) ** 2 / var))
    return rmse, nlpd


class DenseTerms:
    """The n-sized terms from a dense K_uf (M x n), differentiated by torch autograd."""

    name = "dense"

    def __init__(self, X, y, Z):
        self.X, self.y, self.Z = X, y, Z

    def __call__(self, g, v):
        Kuf = v * torch.exp(-g * sqdist(self.Z, self.X))
        return Kuf @ Kuf.T, Kuf @ self.y

    def kus_blocks(self, Xs, g, v):
        return lambda: [(v * torch.exp(-g * sqdist(self.Z, Xs)), None)]

    @staticmethod
    def bytes_needed(n, M):
        """K_uf's M x n doubles, and the two more M x n tensors autograd keeps (the squared
        distances and exp(-g r^2)); the M x M algebra is not counted."""
        return 3 * n * M * 8


class _BlockGram(torch.autograd.Function):
    """P_e(g) = E E^T, E_ai = exp(-g |z_a - x_i|^2), summed over blocks of the n columns.

    dP_e/dg = D E^T + E D^T with D = dE/dg, so dL/dg = sum_ab (G + G^T)_ab Q_ab where
    Q = E D^T. When g requires a gradient the forward accumulates Q beside P from the same
    blocks (E_b and D_b, the derivative formula Grad(E, g, 1) built by symred's symbolic
    differentiation, both from sr_kernel_eval_block), and the backward is one M x M product
    with no pass over n. Nothing n-sized is kept: two M x b blocks are alive at a time."""

    @staticmethod
    def forward(ctx, g, terms):
        M = terms.Z.shape[0]
        P = np.zeros((M, M))
        tmp = np.empty((M, M))
        want_q = ctx.needs_input_grad[0]
        Q = torch.zeros(M, M, dtype=torch.float64) if want_q else None
        for E, D in terms.blocks(g, derivative=want_q):
            np.matmul(E, E.T, out=tmp)  # NumPy's A A^T is a symmetric rank-k update (syrk)
            P += tmp
            if want_q:
                Q.addmm_(torch.from_numpy(E), torch.from_numpy(D).T)
        ctx.save_for_backward(Q)
        return torch.from_numpy(P)

    @staticmethod
    def backward(ctx, G):
        (Q,) = ctx.saved_tensors
        return ((G + G.T) * Q).sum().reshape(1), None


class SymredTerms:
    """The n-sized terms from symred, under a memory budget of ``budget`` bytes for the blocks.

    P = v^2 E E^T by :class:`_BlockGram` (blocks of E and dE/dg from ``sr_kernel_eval_block``,
    two M x b float64 blocks alive at once, b = budget / (2 M 8)), r = v sum_i E_ai y_i by a
    symred.torch Sum reduction (gradient by symred: sr_kernel_grad), and
    sum_i k(x_i, x_i) = n v.
    """

    name = "symred"

    def __init__(self, X, y, Z, budget):
        import symred.torch as srt

        self.X, self.y, self.Z = X, y, Z
        aliases = ["z=Vi(3)", "x=Vj(3)", "g=Pm(1)"]
        # eval_block through symred.torch: it runs with symred's thread count, not torch's.
        self.fE = srt.Genred("Exp(-g*SqDist(z,x))", aliases, axis=1)
        self.fD = srt.Genred("Grad(Exp(-g*SqDist(z,x)), g, e)", aliases + ["e=Pm(1)"], axis=1)
        self.fr = srt.Genred("Exp(-g*SqDist(z,x))*b", ["z=Vi(3)", "x=Vj(3)", "b=Vj(1)",
                                                       "g=Pm(1)"], axis=1)
        M, n = Z.shape[0], X.shape[0]
        if budget < 2 * M * 8:
            raise MemoryError(f"a budget of {budget} bytes holds no block of 2 x {M} doubles")
        self.block = min(n, budget // (2 * M * 8))
        # Flat, so that a narrower block is a contiguous view of the first M x nj values.
        self._bufs = [torch.empty(M * self.block, dtype=torch.float64) for _ in range(2)]

    def blocks(self, g, derivative=False, X=None, block=None):
        """(E_b, D_b) for blocks of ``block`` columns (default: the budget's) of X (the
        training inputs by default), NumPy views of the two budgeted buffers, each valid until
        the next pair is made; D_b is None unless ``derivative``."""
        X = self.X if X is None else X
        gt = g.detach().reshape(1)
        one = torch.ones(1, dtype=torch.float64)
        n, b, M = X.shape[0], min(block or self.block, self.block), self.Z.shape[0]
        for j0 in range(0, n, b):
            nj = min(b, n - j0)
            E, D = (buf[:M * nj].view(M, nj) for buf in self._bufs)
            self.fE.eval_block(self.Z, X, gt, rows=(0, M), cols=(j0, nj), out=E)
            if derivative:
                self.fD.eval_block(self.Z, X, gt, one, rows=(0, M), cols=(j0, nj), out=D)
            yield E.numpy(), (D.numpy() if derivative else None)

    def __call__(self, g, v):
        P = v * v * _BlockGram.apply(g.reshape(1), self)
        r = v * self.fr(self.Z, self.X, self.y[:, None], g.reshape(1))[:, 0]
        return P, r

    def kus_blocks(self, Xs, g, v):
        # In place in the two budgeted buffers: K_us = v E_b in the first, the triangular
        # solves into the second. Blocks of b/16 columns keep what torch may allocate inside
        # solve_triangular small beside them (the 0.8 GB buffers at M = 500 left no room for
        # three more M x 20 000 tensors: that run died in its predictions).
        def gen():
            for E, _ in self.blocks(g, X=Xs, block=max(1, self.block // 16)):
                Kus = torch.from_numpy(E).mul_(v)
                work = self._bufs[1][:Kus.numel()].view(Kus.shape)
                yield Kus, work
        return gen

    @staticmethod
    def bytes_needed(n, M, budget):
        """The blocks: two M x b doubles, b = budget / (2 M 8); the M x M algebra (P, Q and a
        temporary here) is not counted."""
        return 2 * M * 8 * max(1, min(n, budget // (2 * M * 8)))


def unpack(theta):
    """log-parameters -> (g, v, noise); g = 1 / (2 l^2)."""
    l, v, s2 = torch.exp(theta[0]), torch.exp(theta[1]), torch.exp(theta[2])
    return 0.5 / (l * l), v, s2


def train(terms, X, y, Xs, ys, iterations):
    """L-BFGS (torch, strong Wolfe line search) on the log hyperparameters for ``iterations``
    iterations, maximising the bound; then test RMSE and NLPD. Returns a dict of results."""
    n = X.shape[0]
    yy = float((y * y).sum())
    theta = torch.tensor([math.log(INIT["lengthscale"]), math.log(INIT["variance"]),
                          math.log(INIT["noise_variance"])], dtype=torch.float64,
                         requires_grad=True)
    evals = [0]

    def objective():
        g, v, s2 = unpack(theta)
        P, r = terms(g, v)
        return CollapsedBound.apply(P, r, kuu(terms.Z, g, v), s2, n * v, n, yy)

    def closure():
        opt.zero_grad()
        loss = -objective() / n
        loss.backward()
        evals[0] += 1
        return loss

    opt = torch.optim.LBFGS([theta], lr=1, max_iter=iterations, max_eval=10 * iterations,
                            tolerance_grad=0, tolerance_change=0, history_size=10,
                            line_search_fn="strong_wolfe")
    t0 = time.perf_counter()
    opt.step(closure)
    seconds = time.perf_counter() - t0
    iters = int(opt.state[opt._params[0]].get("n_iter", 0))
    with torch.no_grad():
        bound = objective()
        g, v, s2 = unpack(theta)
        P, r = terms(g, v)
        Kuu = kuu(terms.Z, g, v)
        mean, var = predict(terms.kus_blocks(Xs, g, v), v, s2,
                            *prediction_factors(P, r, Kuu, s2))
    rmse, nlpd = metrics(mean, var, ys.numpy())
    l, v, s2 = (float(t) for t in torch.exp(theta.detach()))
    return {"seconds": seconds, "iterations": iters, "evaluations": evals[0],
            "seconds_per_iter": seconds / max(iters, 1),
            "seconds_per_eval": seconds / max(evals[0], 1), "rmse": rmse, "nlpd": nlpd,
            "bound": float(bound), "lengthscale": l, "variance": v, "noise_variance": s2}
