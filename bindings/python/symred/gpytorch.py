"""symred.gpytorch: GPyTorch kernels whose kernel-matrix products run on symred.

    from symred.gpytorch import RBFKernel, MaternKernel, PeriodicKernel

Drop-ins for ``gpytorch.kernels.keops.RBFKernel``, ``MaternKernel`` (nu = 0.5, 1.5, 2.5) and
``PeriodicKernel``: the same constructor arguments (``ard_num_dims``, ``batch_shape``,
``active_dims``, priors and constraints, ``nu``, ``period_length_*``), the same parameters
(``raw_lengthscale``, ``raw_period_length``, so state dicts load either way) and the same
values. ``forward`` returns linear_operator's ``KernelLinearOperator``; when the kernel matrix
is large, its covariance function returns a symbolic matrix whose ``@`` is one symred.torch
reduction ``sum_j k(x_i, y_j) v_j`` (leading batch dimensions in one launch, differentiable
with respect to the inputs, the hyperparameters and ``v``). So exact GP training and
prediction with conjugate gradients (GPyTorch's default above ``max_cholesky_size``) never
builds the n x n matrix: memory stays O(n).

When symred runs, as in GPyTorch's KeOps kernels: ``gpytorch.settings.use_keops`` is on (the
default) and both sides have at least ``gpytorch.settings.max_cholesky_size`` rows (800 by
default; below, GPyTorch takes a Cholesky factorisation of the dense matrix anyway). A side
with a single row (the 1 x 1 blocks GPyTorch evaluates for the diagonal and for single
entries) is computed by dense torch code, which is O(n) there.

``import symred`` never imports this module; it needs GPyTorch (and so torch >= 2).
docs/gpytorch.md.
"""

import functools
import math

try:
    import torch
    from gpytorch import settings as _settings
    from gpytorch.kernels import Kernel as _Kernel
    from gpytorch.kernels import PeriodicKernel as _GPeriodicKernel
    from linear_operator.operators import KernelLinearOperator
except ImportError as e:  # pragma: no cover - exercised where gpytorch is missing
    raise ImportError("symred.gpytorch needs GPyTorch and linear_operator (pip install "
                      "gpytorch); symred and symred.torch work without them") from e

from . import torch as _st

__all__ = ["RBFKernel", "MaternKernel", "PeriodicKernel"]

# k(x, y) of each kernel in symred's formula language, on inputs already scaled by the
# lengthscale (RBF, Matern) or by period / pi (periodic, whose weights w = -2 / lengthscale
# are a parameter). Matern's distance gets 1e-20 under the square root, as in GPyTorch, so
# that its derivative at x = y is 0 and not 0 * inf.
_DIST = "Sqrt(SqDist(x, y) + 1e-20)"
_FORMULAS = {
    "rbf": "Exp(-SqDist(x, y) / 2)",
    ("matern", 0.5): f"Exp(-{_DIST})",
    ("matern", 1.5): f"(1 + Sqrt(3) * {_DIST}) * Exp(-Sqrt(3) * {_DIST})",
    ("matern", 2.5): f"(1 + Sqrt(5) * {_DIST} + 5 / 3 * SqDist(x, y)) * Exp(-Sqrt(5) * {_DIST})",
    "periodic": "Exp(Sum(Square(Sin(x - y)) * w))",
}


def _dense(kind, x1, x2, w):
    """The same k(x1_i, x2_j) as a dense torch tensor (..., M, N), for small blocks."""
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    if kind == "periodic":
        return (diff.sin().square() * w[..., None, None, :]).sum(-1).exp()
    sq = diff.square().sum(-1)
    if kind == "rbf":
        return (-sq / 2).exp()
    nu = kind[1]
    d = (sq + 1e-20).sqrt()
    e = (-math.sqrt(2 * nu) * d).exp()
    if nu == 0.5:
        return e
    if nu == 1.5:
        return (1 + math.sqrt(3) * d) * e
    return (1 + math.sqrt(5) * d + 5.0 / 3.0 * sq) * e


@functools.lru_cache(maxsize=None)
def _genred(kind, dim, cols):
    """The symred reduction sum_j k(x_i, y_j) v_j for inputs of dimension ``dim`` and ``cols``
    right-hand sides, created once per process (its kernels are compiled per dtype)."""
    aliases = [f"x = Vi({dim})", f"y = Vj({dim})", f"v = Vj({cols})"]
    if kind == "periodic":
        aliases.append(f"w = Pm({dim})")
    return _st.Genred(f"({_FORMULAS[kind]}) * v", aliases, reduction_op="Sum", axis=1)


@functools.lru_cache(maxsize=None)
def _genred_grad(kind, dim, cols):
    """The symred reduction sum_j d/dx_i <k(x_i, y_j) b_j, a_i> (a: Vi, b: Vj, ``cols`` wide):
    the gradient of sum_ij <a_i, b_j> k(x_i, y_j) with respect to the x_i, one row each."""
    aliases = [f"x = Vi({dim})", f"y = Vj({dim})", f"b = Vj({cols})", f"a = Vi({cols})"]
    return _st.Genred(f"Grad(({_FORMULAS[kind]}) * b, x, a)", aliases, reduction_op="Sum",
                      axis=1)


# h(x, y) with grad_x k(x, y) = -h(x, y) (x - y), for the kernels where h is smooth at x = y
# (Matern 1/2's is 1/|x - y| times its value there: those take _genred_grad).
_RADIAL_H = {
    "rbf": "Exp(-SqDist(x, y) / 2)",
    ("matern", 1.5): f"3 * Exp(-Sqrt(3) * {_DIST})",
    ("matern", 2.5): f"5 / 3 * (1 + Sqrt(5) * {_DIST}) * Exp(-Sqrt(5) * {_DIST})",
}


def _radial_cols(dim):
    """The columns of c in _genred_radial: 1 + dim, at least 4 (the narrowest B that symred
    runs as a product of tiles, and so symmetric)."""
    return max(dim + 1, 4)


@functools.lru_cache(maxsize=None)
def _genred_radial(kind, dim, cols):
    """The symred reduction sum_j h(x_i, y_j) ((l_i|r'_j) + (r_i|l'_j)) c_j (l, r: Vi, l', r':
    Vj, ``cols`` wide; c: Vj of _radial_cols(dim) columns). With y = x, l' = l, r' = r and
    c = [1, x, 0...], it gives what the gradient of sum_ij (<l_i, r_j> + <r_i, l_j>) k(x_i, x_j)
    with respect to the x_i needs, and its formula is symmetric in (x, l, r) and (y, l', r'),
    so that symred forms each tile of it once for both triangles."""
    aliases = [f"x = Vi({dim})", f"y = Vj({dim})", f"l = Vi({cols})", f"r = Vi({cols})",
               f"l2 = Vj({cols})", f"r2 = Vj({cols})", f"c = Vj({_radial_cols(dim)})"]
    return _st.Genred(f"({_RADIAL_H[kind]}) * ((l | r2) + (r | l2)) * c", aliases,
                      reduction_op="Sum", axis=1)


class _SymbolicKernelMatrix:
    """K(x1, x2) without its entries: what the covariance function returns when symred runs.
    ``K @ v`` (v of shape (..., N, C) or (..., N)) is one symred reduction; the batch
    dimensions of x1, x2, v and the weights broadcast as in a dense matmul."""

    def __init__(self, kind, x1, x2, w):
        self.kind, self.x1, self.x2, self.w = kind, x1, x2, w

    @property
    def shape(self):
        batch = torch.broadcast_shapes(self.x1.shape[:-2], self.x2.shape[:-2])
        return batch + (self.x1.shape[-2], self.x2.shape[-2])

    def __matmul__(self, rhs):
        vector = rhs.dim() == 1
        v = rhs[:, None] if vector else rhs
        dtype = self.x1.dtype
        args = [self.x1.contiguous(), self.x2.contiguous(), v.to(dtype).contiguous()]
        if self.w is not None:
            args.append(self.w.to(dtype).contiguous())
        out = _genred(self.kind, self.x1.shape[-1], v.shape[-1])(*args)
        return out[..., 0] if vector else out


def _use_symred(x1, x2):
    m, n = x1.shape[-2], x2.shape[-2]
    limit = _settings.max_cholesky_size.value()
    return _settings.use_keops.on() and min(m, n) > 1 and m >= limit and n >= limit


def _covar_func(x1, x2, kind="rbf", lengthscale=None, **_):
    """KernelLinearOperator's covariance function (it passes the hyperparameters it needs
    gradients for as arguments): a symbolic matrix for large blocks, else dense."""
    w = None
    if kind == "periodic":  # lengthscale: (..., 1, D) or (..., 1, 1)
        w = (-2.0 / lengthscale[..., 0, :]).expand(*lengthscale.shape[:-2], x1.shape[-1])
    if _use_symred(x1, x2):
        return _SymbolicKernelMatrix(kind, x1, x2, w)
    return _dense(kind, x1, x2, w)


def _same(a, b):
    """Whether tensors a and b are the same array (so K(a, b) is symmetric)."""
    return a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape
                      and a.stride() == b.stride() and a.dtype == b.dtype)


class _SymredKernelOperator(KernelLinearOperator):
    """KernelLinearOperator whose bilinear derivative (the gradient of sum_ij <L_i, R_j> K_ij
    that GPyTorch's marginal likelihood asks for) is one symred reduction when the matrix is a
    symmetric K(x, x) on symred: by symmetry of k, the gradient with respect to x_k of both
    arguments together is sum_j d/dx_k k(x_k, x_j) <[L, R]_k, [R, L]_j>, so neither the
    product K R that autograd would form first nor a second gradient kernel (for the column
    argument) runs. For the kernels of _RADIAL_H that reduction is _genred_radial's (symmetric:
    each tile of it formed once), else _genred_grad's. Other cases (periodic's lengthscale,
    x1 != x2, small blocks): GPyTorch's."""

    def _bilinear_derivative(self, left_vecs, right_vecs):
        x1, x2 = self.x1, self.x2
        kind = self.nontensor_params.get("kind", "rbf")
        if (kind == "periodic" or len(self.representation()) != 2 or not _same(x1, x2)
                or not _use_symred(x1, x2)):
            return super()._bilinear_derivative(left_vecs, right_vecs)
        if not x1.requires_grad:
            return (None, None)
        if left_vecs.dim() == 1:
            left_vecs, right_vecs = left_vecs[:, None], right_vecs[:, None]
        dtype = x1.dtype
        x = x1.detach().contiguous()
        if kind in _RADIAL_H:
            # grad_x_k = -sum_j h_kj S_kj (x_k - x_j), S_kj = <L_k, R_j> + <R_k, L_j>: from
            # one symmetric reduction of [sum_j h S, sum_j h S x_j].
            l = left_vecs.to(dtype).contiguous()
            r = right_vecs.to(dtype).contiguous()
            d = x.shape[-1]
            c = torch.cat([torch.ones_like(x[..., :1]), x,
                           x.new_zeros(x.shape[:-1] + (_radial_cols(d) - 1 - d,))], -1)
            with torch.no_grad():
                o = _genred_radial(kind, d, l.shape[-1])(x, x, l, r, l, r, c.contiguous())
            return (o[..., 1:1 + d] - x * o[..., :1], None)
        a = torch.cat([left_vecs, right_vecs], -1).to(dtype).contiguous()
        b = torch.cat([right_vecs, left_vecs], -1).to(dtype).contiguous()
        with torch.no_grad():
            g = _genred_grad(kind, x.shape[-1], a.shape[-1])(x, x, b, a)
        return (g, None)


class _SymredKernel(_Kernel):
    """What the three kernels share: contiguous inputs (as GPyTorch's KeOps kernels) and the
    KernelLinearOperator, or its diagonal."""

    def __call__(self, *args, **kwargs):
        args = [a.contiguous() if torch.is_tensor(a) else a for a in args]
        kwargs = {k: v.contiguous() if torch.is_tensor(v) else v for k, v in kwargs.items()}
        return super().__call__(*args, **kwargs)

    @staticmethod
    def _operator(x1, x2, diag, kind, params):
        res = _SymredKernelOperator(x1, x2, covar_func=_covar_func, kind=kind, **params)
        return res.diagonal(dim1=-1, dim2=-2) if diag else res


class RBFKernel(_SymredKernel):
    """``gpytorch.kernels.keops.RBFKernel`` on symred: k(x, y) = exp(-|x - y|^2 / (2 l^2)),
    with ``gpytorch.kernels.RBFKernel``'s arguments (ard_num_dims, batch_shape,
    active_dims, lengthscale_prior, lengthscale_constraint)."""

    has_lengthscale = True

    def forward(self, x1, x2, diag=False, **params):
        x1_ = x1.div(self.lengthscale)
        x2_ = x1_ if x2 is x1 else x2.div(self.lengthscale)  # K(x, x) stays recognisable
        return self._operator(x1_, x2_, diag, "rbf", params)


class MaternKernel(_SymredKernel):
    """``gpytorch.kernels.keops.MaternKernel`` on symred: the Matern kernel of smoothness
    ``nu`` (0.5, 1.5 or 2.5; RuntimeError otherwise, as GPyTorch), with the inputs centred
    on the mean of x1 (as GPyTorch does, for accuracy) and scaled by the lengthscale."""

    has_lengthscale = True

    def __init__(self, nu=2.5, **kwargs):
        if nu not in {0.5, 1.5, 2.5}:
            raise RuntimeError("nu expected to be 0.5, 1.5, or 2.5")
        super().__init__(**kwargs)
        self.nu = nu

    def forward(self, x1, x2, diag=False, **params):
        mean = x1.reshape(-1, x1.size(-1)).mean(0)[(None,) * (x1.dim() - 1)]
        x1_ = (x1 - mean).div(self.lengthscale)
        x2_ = x1_ if x2 is x1 else (x2 - mean).div(self.lengthscale)
        return self._operator(x1_, x2_, diag, ("matern", self.nu), params)


class PeriodicKernel(_SymredKernel, _GPeriodicKernel):
    """``gpytorch.kernels.keops.PeriodicKernel`` on symred:
    k(x, y) = exp(-2 sum_d sin^2(pi |x_d - y_d| / p) / l_d), with
    ``gpytorch.kernels.PeriodicKernel``'s arguments and parameters (period_length and its
    prior / constraint, lengthscale, ard_num_dims, batch_shape)."""

    has_lengthscale = True

    def forward(self, x1, x2, diag=False, **params):
        scale = self.period_length / math.pi
        return self._operator(x1.div(scale), x2.div(scale), diag, "periodic",
                              dict(params, lengthscale=self.lengthscale))
