"""Gradients of the wide reductions through symred.torch on the CPU JIT, against torch autograd
of the same computation written densely: attention SumSoftMaxWeight((q|k) s, v) with respect to
q, k and v, and the Gaussian mat-vec Exp(-SqDist(x, y) g) b with respect to x, y and b. Each
gradient kernel must run on the fused two-product strategy (docs/wide.md)."""

import pytest

torch = pytest.importorskip("torch")

from symred import _lib  # noqa: E402
from symred.torch import Genred  # noqa: E402


FUSED = ("fused two-product", "symmetric fused two-product")


def _plans_of_grads(fn, indices):
    """The plans (sr_kernel_plan) of the gradient kernels (sr_kernel_grad) of fn's one torch
    kernel, with their explain text for messages; None where the forward kernel itself is not
    fused (no gemm on this machine: neither BLIS nor AVX-512F)."""
    (tk,) = fn._torch_kernels.values()
    if _lib.kernel_plan(tk.ptr)["inner"] not in FUSED:
        return None
    return {i: (_lib.kernel_plan(tk.grad(i).ptr),
                _lib.lib.sr_kernel_explain(tk.grad(i).ptr).decode()) for i in indices}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n, m, d, r", [(131, 257, 64, 64), (67, 101, 64, 17)])
def test_attention_gradients(dtype, n, m, d, r):
    g = torch.Generator().manual_seed(n + r)
    q, k = (torch.randn(rows, d, generator=g, dtype=dtype) * 0.3 for rows in (n, m))
    v = torch.randn(m, r, generator=g, dtype=dtype)
    G = torch.randn(n, r, generator=g, dtype=dtype)
    s = torch.tensor([0.5], dtype=dtype)
    fn = Genred("(q|k)*s", [f"q=Vi({d})", f"k=Vj({d})", "s=Pm(1)", f"v=Vj({r})"],
                reduction_op="SumSoftMaxWeight", axis=1, formula2="v")
    qs, ks, vs = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = fn(qs, ks, s, vs, backend="CPU")
    got = torch.autograd.grad(out, (qs, ks, vs), G)
    qd, kd, vd = (t.clone().requires_grad_(True) for t in (q, k, v))
    want_out = torch.softmax(qd @ kd.T * s, dim=1) @ vd
    want = torch.autograd.grad(want_out, (qd, kd, vd), G)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(out, want_out.detach(), **tol)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **tol)
    for i, (plan, text) in (_plans_of_grads(fn, (0, 1, 3)) or {}).items():
        assert plan["inner"] in FUSED, f"gradient w.r.t. {i}:\n{text}"


@pytest.mark.parametrize("r", [16, 64])
def test_gaussian_matvec_gradients(r):
    g = torch.Generator().manual_seed(r)
    dtype = torch.float32
    x, y = (torch.rand(rows, 3, generator=g, dtype=dtype) for rows in (131, 257))
    b = torch.randn(257, r, generator=g, dtype=dtype)
    G = torch.randn(131, r, generator=g, dtype=dtype)
    gam = torch.tensor([2.0], dtype=dtype)
    fn = Genred("Exp(-SqDist(x,y)*g)*b", ["x=Vi(3)", "y=Vj(3)", f"b=Vj({r})", "g=Pm(1)"],
                reduction_op="Sum", axis=1)
    xs, ys, bs = (t.clone().requires_grad_(True) for t in (x, y, b))
    got = torch.autograd.grad(fn(xs, ys, bs, gam, backend="CPU"), (xs, ys, bs), G)
    xd, yd, bd = (t.clone().requires_grad_(True) for t in (x, y, b))
    K = torch.exp(-((xd[:, None] - yd[None]) ** 2).sum(-1) * gam)
    want = torch.autograd.grad(K @ bd, (xd, yd, bd), G)
    for a, w in zip(got, want):
        torch.testing.assert_close(a, w, rtol=1e-4, atol=1e-4)
    # b's gradient is a transposed mat-vec with G as the wide right-hand side; x's and y's hold
    # the inner product (G_i|b_j), formed by a gemm from 24 columns on.
    plans = _plans_of_grads(fn, (0, 1, 2))
    if plans is None:
        return
    assert plans[2][0]["inner"] in FUSED, plans[2][1]
    if r >= 24:
        for i in (0, 1):
            assert plans[i][0]["inner"] in FUSED, plans[i][1]
