"""Sparse GP regression (Titsias' collapsed bound, as GPflow's SGPR) with the n-sized terms
from symred under a memory budget or from dense matrices, and an M x M algebra written for
large M (in place, LAPACK and BLAS through SciPy).

The model, formulas and memory accounting are in docs/sgpr.md. In short, with
E_ai = exp(-g |z_a - x_i|^2) (g = 1 / (2 l^2), an isotropic SE kernel, K_uf = v E) and
D = dE/dg, the bound and its gradient with respect to (g, v, s) need only these n-sized sums:

    P = E E^T,  Q = E D^T  (M x M),   r = E y,  dr = D y  (M),   sum_i k(x_i, x_i) = n v,

and everything else is M x M algebra shared by every system (:func:`bound_and_grad`).
``SymredTerms`` computes P and Q blockwise over n from ``sr_kernel_eval_block`` blocks of E
and D (D is symred's symbolic derivative ``Grad(E, g, 1)``), the block width from the memory
budget, and r, dr by symred ``Sum`` reductions (the second one of the derivative formula).
``DenseTerms`` materialises E and D (M x n each).
"""

import math
import os
import sys
import time

import numpy as np
import torch
from scipy.linalg import blas, lapack

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



# ---- the reference: GPflow's form of the bound, torch autograd (tests) --------------------------


def sqdist(a, b):
    """|a_i - b_j|^2 (torch, dense)."""
    return ((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * a @ b.T).clamp_min(0)


def kuu(Z, g, v):
    """K_uu + jitter I (torch, dense)."""
    return v * torch.exp(-g * sqdist(Z, Z)) + JITTER * torch.eye(Z.shape[0], dtype=Z.dtype)


def collapsed_bound(P, r, yy, n, trace_kff, Kuu, noise):
    """Titsias' bound as GPflow's SGPR.elbo writes it (A = L^-1 K_uf / sigma, B = I + A A^T),
    from P = K_uf K_fu, r = K_uf y, yy = y'y and sum_i k(x_i, x_i), differentiated by torch
    autograd through the Cholesky factors: the reference that :func:`bound_and_grad` is
    tested against (not used for training)."""
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


# ---- the M x M algebra (every system) -----------------------------------------------------------

ROWS = 256  # the row blocks of the passes over M x M matrices (ROWS x M temporaries)


def sqdist_rows(A, B):
    """|a_i - b_j|^2 for the rows of A against those of B (NumPy, explicit differences: exactly
    0 where a row of A equals one of B)."""
    d = np.subtract.outer(A[:, 0], B[:, 0])
    d *= d
    for c in range(1, A.shape[1]):
        t = np.subtract.outer(A[:, c], B[:, c])
        t *= t
        d += t
    return d


def kernel_np(Z, g, out=None):
    """exp(-g |z_a - z_b|^2) (NumPy, M x M, built in row blocks; exactly 1 on the diagonal)."""
    M = Z.shape[0]
    K = np.empty((M, M)) if out is None else out
    for a0 in range(0, M, ROWS):
        blk = K[a0:a0 + ROWS]
        np.multiply(sqdist_rows(Z[a0:a0 + ROWS], Z), -g, out=blk)
        np.exp(blk, out=blk)
    return K


def kernel_dg_np(Z, g, out):
    """d/dg exp(-g |z_a - z_b|^2) = -|z_a - z_b|^2 exp(-g |z_a - z_b|^2), in row blocks."""
    M = Z.shape[0]
    for a0 in range(0, M, ROWS):
        d = sqdist_rows(Z[a0:a0 + ROWS], Z)
        blk = out[a0:a0 + ROWS]
        np.multiply(d, -g, out=blk)
        np.exp(blk, out=blk)
        blk *= d
        np.negative(blk, out=blk)
    return out


def inner(X, Y):
    """sum_ab X_ab Y_ab for two M x M arrays in their memory order (no copy). Right whatever
    the orders when one of them is symmetric."""
    return float(np.vdot(X.ravel("K"), Y.ravel("K")))


def fview(X):
    """X as a Fortran-contiguous array without a copy: X itself, or X.T for a C-contiguous X
    (the same matrix when X is symmetric; the algebra below only uses such views of symmetric
    matrices, or of Q, whose transpose gives the same results)."""
    if X.flags.f_contiguous:
        return X
    assert X.flags.c_contiguous
    return X.T


def _fill_lower(A):
    """A (Fortran order) holds a symmetric matrix in its lower triangle: copy it into the
    upper one (in the blocks of the C-order view A.T, whose upper triangle it is)."""
    C = A.T
    M = C.shape[0]
    for a0 in range(0, M, ROWS):
        a1 = min(M, a0 + ROWS)
        C[a1:, a0:a1] = C[a0:a1, a1:].T
        blk = C[a0:a1, a0:a1]
        low = np.tril_indices(a1 - a0, -1)
        blk[low] = blk.T[low]


def _check(name, info):
    if info != 0:
        raise np.linalg.LinAlgError(f"{name}: LAPACK info {info}")


def cholesky_(A):
    """A = L L^T in place (A Fortran-contiguous, L in its lower triangle); returns log det A."""
    c, info = lapack.dpotrf(A, lower=1, clean=0, overwrite_a=1)
    _check("dpotrf", info)
    assert np.shares_memory(c, A), "dpotrf did not work in place"
    return 2.0 * float(np.log(np.diagonal(A)).sum())


def cholesky_inverse_(A):
    """A holds L from :func:`cholesky_`: A becomes (L L^T)^-1 (both triangles)."""
    c, info = lapack.dpotri(A, lower=1, overwrite_c=1)
    _check("dpotri", info)
    assert np.shares_memory(c, A), "dpotri did not work in place"
    _fill_lower(A)


def lsolve(L, B):
    """L^-1 B for L lower triangular (Fortran), B a vector or M x b; a new array."""
    return blas.dtrsm(1.0, L, np.asfortranarray(B.reshape(B.shape[0], -1)), lower=1)


def _trsm_(L, X):
    """X <- L^-1 X in place (X Fortran-contiguous)."""
    b = blas.dtrsm(1.0, L, X, lower=1, overwrite_b=1)
    assert np.shares_memory(b, X), "dtrsm did not work in place"


def whiten_(L, X):
    """X <- L^-1 X L^-T in place (X Fortran-contiguous M x M): two triangular solves."""
    b = blas.dtrsm(1.0, L, X, lower=1, overwrite_b=1)
    b = blas.dtrsm(1.0, L, b, side=1, lower=1, trans_a=1, overwrite_b=1)
    assert np.shares_memory(b, X), "dtrsm did not work in place"


class Factors:
    """What the bound and the predictions share (see :func:`factor`)."""

    __slots__ = ("L", "W", "LC", "logdet_C", "a", "ra", "trW")


def factor(st, Z, g, v, s):
    """K_uu = L L^T, W = L^-1 P L^-T (in st.P's place), s I + W = L_C L_C^T (LC, a new
    array), rho = L^-1 r, a = (s I + W)^-1 rho, rho'a and tr W."""
    st.scale(v)
    f = Factors()
    f.W = W = fview(st.P)
    M = W.shape[0]
    f.L = L = np.asfortranarray(kernel_np(Z, g).T)  # symmetric: .T is a free Fortran view
    L *= v
    L.flat[::M + 1] += JITTER
    cholesky_(L)
    whiten_(L, W)
    f.trW = float(np.trace(W))
    f.LC = np.array(W, order="F")
    f.LC.flat[::M + 1] += s
    f.logdet_C = cholesky_(f.LC)
    rho = lsolve(L, v * st.r)[:, 0]
    f.a = lapack.dpotrs(f.LC, rho, lower=1)[0]
    f.ra = float(rho @ f.a)
    return f


def bound_and_grad(st, Z, g, v, s, n, yy, grad=True):
    """Titsias' collapsed bound F and (dF/dg, dF/dv, dF/ds), or without ``grad`` F and the
    :class:`Factors` (for :func:`predict`), from the n-sized sums ``st`` (:class:`Stats`;
    st.P and st.Q are overwritten).

    With P = v^2 E E^T, r = v E y, K = K_uu = v K_e + jitter I = L L^T, whitened matrices
    X_w = L^-1 X L^-T, W = P_w, C = s I + W = L_C L_C^T, rho = L^-1 r and a = C^-1 rho:

        F = -n/2 log 2pi - 1/2 logdet C + (M - n)/2 log s - y'y/(2s) + rho'a/(2s)
            - n v/(2s) + tr W/(2s)

    (GPflow's SGPR.elbo, C = s B). For a change (dK, dP, dr, ds) of the inputs, with
    V = dK_w, U = dP_w and dS_w = ds I + s V + U (docs/sgpr.md):

        dF = -1/2 <C^-1, dS_w> + 1/2 tr V - a'dS_w a/(2s) + a'L^-1 dr/s
             + (tr U - <W, V>)/(2s) + c_s ds - d(n v)/(2s),

    c_s = (M - n)/(2s) + y'y/(2s^2) - rho'a/(2s^2) + n v/(2s^2) - tr W/(2s^2). Directions:
    g: dK = v dK_e/dg, dP = v^2 (Q + Q^T), dr = v dr_e; v: dK = K_e, dP = 2 P/v, dr = r_e,
    d(n v) = n; s: ds = 1. Everything goes through triangular solves with L and L_C and one
    inverse of the well-conditioned C; no inverse of K (its condition number nears 1/jitter).
    Five M x M matrices are alive at the peak: P (W in place), Q (Q_w in place), L, C^-1 and
    one V."""
    f = factor(st, Z, g, v, s)
    L, W, Ci, a, ra, trW = f.L, f.W, f.LC, f.a, f.ra, f.trW
    M = W.shape[0]
    F = (-0.5 * n * math.log(2 * math.pi) - 0.5 * f.logdet_C + 0.5 * (M - n) * math.log(s)
         - 0.5 * yy / s + 0.5 * ra / s - 0.5 * n * v / s + 0.5 * trW / s)
    if not grad:
        return F, f
    cholesky_inverse_(Ci)
    Uq = fview(st.Q)
    whiten_(L, Uq)
    V = kernel_dg_np(Z, g, np.empty((M, M), order="F"))
    V *= v
    whiten_(L, V)
    Ci_Vg, trVg, aVga, W_Vg = inner(Ci, V), float(np.trace(V)), float(a @ (V @ a)), inner(W, V)
    kernel_np(Z, g, V.T)
    whiten_(L, V)
    Ci_Vv, trVv, aVva, W_Vv = inner(Ci, V), float(np.trace(V)), float(a @ (V @ a)), inner(W, V)
    del V
    Ci_U, trU, aUa = inner(Ci, Uq), float(np.trace(Uq)), float(a @ (Uq @ a))
    Ci_W, aWa = inner(Ci, W), float(a @ (W @ a))
    dg = (-0.5 * (s * Ci_Vg + 2 * Ci_U) + 0.5 * trVg - (s * aVga + 2 * aUa) / (2 * s)
          + v * float(a @ lsolve(L, st.dr)[:, 0]) / s + (2 * trU - W_Vg) / (2 * s))
    dv = (-0.5 * (s * Ci_Vv + 2 * Ci_W / v) + 0.5 * trVv - (s * aVva + 2 * aWa / v) / (2 * s)
          + float(a @ lsolve(L, st.r)[:, 0]) / s + (2 * trW / v - W_Vv) / (2 * s)
          - 0.5 * n / s)
    ds = (-0.5 * float(np.trace(Ci)) - float(a @ a) / (2 * s) + (M - n) / (2 * s)
          + yy / (2 * s * s) - ra / (2 * s * s) + n * v / (2 * s * s) - trW / (2 * s * s))
    return F, (dg, dv, ds)


def predict(terms, Xs, v, s, f, g):
    """Predictive mean and variance of y at Xs (GPflow's SGPR.predict_y) from the factors f
    (:func:`factor`): with k_u = K(Z, x*) and u = L^-1 k_u, mean = u'a and
    var = v - |u|^2 + s |L_C^-1 u|^2 + s. ``terms.kus_blocks`` gives the blocks of K(Z, Xs) /
    v with a flat buffer to solve them in (symred: its second budgeted buffer, so the
    predictions allocate nothing n-sized) or None (a new array)."""
    means, variances = [], []
    for E, work in terms.kus_blocks(Xs, g):
        M, b = E.shape
        u = (np.empty((M, b), order="F") if work is None
             else work[:M * b].reshape((M, b), order="F"))
        np.multiply(E, v, out=u)
        _trsm_(f.L, u)
        means.append(f.a @ u)
        uu = np.einsum("ij,ij->j", u, u)
        _trsm_(f.LC, u)
        variances.append(v - uu + s * np.einsum("ij,ij->j", u, u) + s)
    return np.concatenate(means), np.concatenate(variances)


def metrics(mean, var, y):
    """Test RMSE and NLPD (mean of -log N(y; mean, var))."""
    rmse = float(np.sqrt(np.mean((mean - y) ** 2)))
    nlpd = float(np.mean(0.5 * np.log(2 * np.pi * var) + 0.5 * (y - mean) ** 2 / var))
    return rmse, nlpd


# ---- the n-sized sums ---------------------------------------------------------------------------


class Stats:
    """The n-sized sums at one g: P = E E^T, Q = E D^T (M x M; Q None without a gradient),
    r = E y, dr = D y (M), E_ai = exp(-g |z_a - x_i|^2), D = dE/dg."""

    __slots__ = ("P", "Q", "r", "dr", "v")

    def __init__(self, P, Q, r, dr):
        self.P, self.Q, self.r, self.dr, self.v = P, Q, r, dr, None

    def scale(self, v):
        """P, Q -> v^2 P, v^2 Q in place (K_uf K_fu and its g-derivative's half), once."""
        if self.v is None:
            self.P *= v * v
            if self.Q is not None:
                self.Q *= v * v
            self.v = v
        elif self.v != v:
            raise ValueError(f"these sums were scaled by v = {self.v}, not {v}")


class DenseTerms:
    """The n-sized sums from dense E and D (M x n each, NumPy: 2 n M doubles, which is also
    the peak while E is built, its squared distances and one temporary)."""

    name = "dense"

    def __init__(self, X, y, Z):
        self.X, self.y, self.Z = X, y, Z

    def __call__(self, g, grad=True):
        E = sqdist_rows(self.Z, self.X)  # M x n
        D = np.multiply(E, -1.0) if grad else None
        np.multiply(E, -g, out=E)
        np.exp(E, out=E)
        if grad:
            D *= E
        return Stats(E @ E.T, E @ D.T if grad else None, E @ self.y,
                     D @ self.y if grad else None)

    def kus_blocks(self, Xs, g):
        yield np.exp(-g * sqdist_rows(self.Z, Xs)), None


class SymredTerms:
    """The n-sized sums from symred, under a memory budget of ``budget`` bytes for the blocks.

    P and Q accumulate over blocks of b columns of E and D from ``sr_kernel_eval_block`` (two
    M x b float64 blocks alive at once, b = budget / (2 M 8)): P += E_b E_b^T (BLAS dsyrk, one
    triangle) and Q += E_b D_b^T (dgemm), both in place in their M x M arrays; r and dr are
    symred Sum reductions of E y and of symred's derivative formula times y."""

    name = "symred"

    def __init__(self, X, y, Z, budget):
        from symred.numpy import Genred

        self.X, self.y, self.Z = X, np.ascontiguousarray(y[:, None]), Z
        aliases = ["z=Vi(3)", "x=Vj(3)", "g=Pm(1)"]
        self.fE = Genred("Exp(-g*SqDist(z,x))", aliases, axis=1)
        self.fD = Genred("Grad(Exp(-g*SqDist(z,x)), g, e)", aliases + ["e=Pm(1)"], axis=1)
        self.fr = Genred("Exp(-g*SqDist(z,x))*b", aliases + ["b=Vj(1)"], axis=1)
        self.fdr = Genred("Grad(Exp(-g*SqDist(z,x))*b, g, e)",
                          aliases + ["b=Vj(1)", "e=Pm(1)"], axis=1)
        M, n = Z.shape[0], X.shape[0]
        if budget < 2 * M * 8:
            raise MemoryError(f"a budget of {budget} bytes holds no block of 2 x {M} doubles")
        self.block = min(n, budget // (2 * M * 8))
        # Flat, so that a narrower block is a contiguous view of the first M x nj values.
        self._bufs = [np.empty(M * self.block) for _ in range(2)]
        self._P = self._Q = None

    def blocks(self, g, derivative=False, X=None, block=None):
        """(E_b, D_b) for blocks of ``block`` columns (default: the budget's) of X (the
        training inputs by default), views of the two budgeted buffers, each valid until the
        next pair is made; D_b is None unless ``derivative``."""
        X = self.X if X is None else X
        gp, one = np.array([g]), np.ones(1)
        n, b, M = X.shape[0], min(block or self.block, self.block), self.Z.shape[0]
        for j0 in range(0, n, b):
            nj = min(b, n - j0)
            E, D = (buf[:M * nj].reshape(M, nj) for buf in self._bufs)
            self.fE.eval_block(self.Z, X, gp, rows=(0, M), cols=(j0, nj), out=E)
            if derivative:
                self.fD.eval_block(self.Z, X, gp, one, rows=(0, M), cols=(j0, nj), out=D)
            yield E, (D if derivative else None)

    def __call__(self, g, grad=True):
        M = self.Z.shape[0]
        # P and Q live in Fortran order (BLAS's), reused from call to call. dsyrk fills P's
        # lower triangle (Fortran order); Q is E D^T read in Fortran order, i.e. its transpose
        # in NumPy's: the algebra only takes inner products with symmetric matrices and a'Qa.
        if self._P is None:
            self._P, self._Q = np.zeros((M, M), order="F"), np.zeros((M, M), order="F")
        P, Q = self._P, self._Q
        P.fill(0.0)
        Q.fill(0.0)
        for E, D in self.blocks(g, derivative=grad):
            # E is C-order M x nj, i.e. E^T in Fortran order: P += (E^T)^T (E^T).
            P = blas.dsyrk(1.0, E.T, beta=1.0, c=P, trans=1, lower=1, overwrite_c=1)
            if grad:
                Q = blas.dgemm(1.0, E.T, D.T, beta=1.0, c=Q, trans_a=1, overwrite_c=1)
        assert P is self._P and (not grad or Q is self._Q), "BLAS did not work in place"
        _fill_lower(P)
        gp = np.array([g])
        r = self.fr(self.Z, self.X, gp, self.y)[:, 0]
        dr = self.fdr(self.Z, self.X, gp, self.y, np.ones(1))[:, 0] if grad else None
        return Stats(P, Q if grad else None, r, dr)

    def kus_blocks(self, Xs, g):
        # E in the first budgeted buffer, the solves in the second.
        for E, _ in self.blocks(g, X=Xs):
            yield E, self._bufs[1]

    @staticmethod
    def bytes_needed(n, M, budget):
        """The blocks: two M x b doubles, b = budget / (2 M 8); the M x M algebra is not
        counted."""
        return 2 * M * 8 * max(1, min(n, budget // (2 * M * 8)))


def unpack(theta):
    """log-parameters (a sequence of 3 floats) -> (g, v, s) = (1 / (2 l^2), variance, noise
    variance)."""
    l, v, s = (math.exp(float(t)) for t in theta)
    return 0.5 / (l * l), v, s


def evaluate(terms, theta, grad=True):
    """The bound at log-parameters theta and, if ``grad``, its gradient with respect to theta
    (a NumPy array of 3)."""
    g, v, s = unpack(theta)
    n, y = terms.X.shape[0], terms.y.ravel()
    F, d = bound_and_grad(terms(g, grad=grad), terms.Z, g, v, s, n, float(y @ y), grad=grad)
    if not grad:
        return F, None
    dg, dv, ds = d
    return F, np.array([-2 * g * dg, v * dv, s * ds])


def train(terms, X, y, Xs, ys, iterations, log=False):
    """L-BFGS (torch's, strong Wolfe line search, on the log hyperparameters, maximising the
    bound / n) for ``iterations`` iterations, the gradient from :func:`evaluate`; then test RMSE
    and NLPD. Returns a dict of results."""
    n = X.shape[0]
    theta = torch.tensor([math.log(INIT["lengthscale"]), math.log(INIT["variance"]),
                          math.log(INIT["noise_variance"])], dtype=torch.float64)
    evals = [0]

    def closure():
        t = time.perf_counter()
        F, dF = evaluate(terms, theta.tolist())
        theta.grad = torch.from_numpy(-dF / n)
        evals[0] += 1
        if log:  # the long runs' progress (bench/exla: the child's log)
            print(f"evaluation {evals[0]}: bound/n {F / n:.6f} at (l, v, s) = "
                  f"{[round(math.exp(x), 6) for x in theta.tolist()]}, "
                  f"{time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
        return torch.tensor(-F / n, dtype=torch.float64)

    opt = torch.optim.LBFGS([theta], lr=1, max_iter=iterations, max_eval=10 * iterations,
                            tolerance_grad=0, tolerance_change=0, history_size=10,
                            line_search_fn="strong_wolfe")
    t0 = time.perf_counter()
    opt.step(closure)
    seconds = time.perf_counter() - t0
    iters = int(opt.state[opt._params[0]].get("n_iter", 0))
    g, v, s = unpack(theta.tolist())
    bound, f = bound_and_grad(terms(g, grad=False), terms.Z, g, v, s, n, float(y @ y),
                              grad=False)
    mean, var = predict(terms, Xs, v, s, f, g)
    rmse, nlpd = metrics(mean, var, ys)
    l = math.exp(float(theta[0]))
    return {"seconds": seconds, "iterations": iters, "evaluations": evals[0],
            "seconds_per_iter": seconds / max(iters, 1),
            "seconds_per_eval": seconds / max(evals[0], 1), "rmse": rmse, "nlpd": nlpd,
            "bound": float(bound), "lengthscale": l, "variance": v, "noise_variance": s}
