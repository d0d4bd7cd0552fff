"""symred.torch under PyTorch 2.x's function transforms: torch.func.grad, vjp, jacrev (also
nested, for second derivatives) and torch.vmap on Genred and LazyTensor reductions, each
against the same transform of the dense torch computation. torch.vmap must run the batch as
one launch (counted). These need torch >= 2 and skip only on older torch (Debian's 1.13,
where the autograd Functions keep the ctx-style forward that test_torch.py covers)."""

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed")

import numpy as np  # noqa: E402

import symred.torch as st  # noqa: E402
from symred.torch import Genred, KernelSolve, LazyTensor, Vi, Vj  # noqa: E402

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
needs_func = pytest.mark.skipif(not TORCH2, reason="torch.func needs PyTorch >= 2")

NX, NY, D, E, B = 7, 6, 3, 2, 4
ALIASES = ["x = Vi(3)", "y = Vj(3)", "b = Vj(2)", "g = Pm(1)"]
F = "Exp(-g * SqDist(x, y)) * b"
DT = torch.float64


def inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(NX, D, dtype=DT, generator=gen)
    y = torch.randn(NY, D, dtype=DT, generator=gen)
    b = torch.randn(NY, E, dtype=DT, generator=gen)
    g = torch.tensor([0.6], dtype=DT)
    return x, y, b, g


def dense_F(x, y, b, g):
    return torch.exp(-g * ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1))[..., None] * b[None]


REDS = {
    "Sum": lambda Fd, axis: Fd.sum(axis),
    "LogSumExp": lambda Fd, axis: torch.logsumexp(Fd, axis),
    "Min": lambda Fd, axis: Fd.min(axis).values,
}


def pair(red, axis):
    """The symred reduction and its dense torch twin, both functions of (x, y, b, g)."""
    K = Genred(F, ALIASES, reduction_op=red, axis=axis)
    return K, (lambda x, y, b, g: REDS[red](dense_F(x, y, b, g), axis))


def close(a, b, tol=1e-10):
    assert a.shape == b.shape, (a.shape, b.shape)
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.fixture
def launches(monkeypatch):
    """Counts the kernel launches of symred.torch (calls of its _run)."""
    count = [0]
    real = st._run

    def counting(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(st, "_run", counting)
    return count


def test_function_style_matches_torch_version():
    # PyTorch 2.x gets the transform-friendly Functions; 1.13 the ctx-style ones.
    assert st._FUNC_STYLE == TORCH2
    assert hasattr(st._Reduce, "setup_context") == TORCH2


@needs_func
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("red", sorted(REDS))
def test_grad_each_argument(red, axis):
    K, dense = pair(red, axis)
    args = inputs()
    for argnum in range(4):
        got = torch.func.grad(lambda *a: K(*a).square().sum(), argnums=argnum)(*args)
        want = torch.func.grad(lambda *a: dense(*a).square().sum(), argnums=argnum)(*args)
        close(got, want)


@needs_func
@pytest.mark.parametrize("axis", [0, 1])
def test_vjp(axis):
    K, dense = pair("Sum", axis)
    args = inputs()
    out, vjp = torch.func.vjp(K, *args)
    out_d, vjp_d = torch.func.vjp(dense, *args)
    close(out, out_d)
    v = torch.randn(out.shape, dtype=DT, generator=torch.Generator().manual_seed(3))
    for got, want in zip(vjp(v), vjp_d(v)):
        close(got, want)


@needs_func
def test_jacrev_and_second_derivatives():
    K, dense = pair("LogSumExp", 1)
    x, y, b, g = inputs()
    close(torch.func.jacrev(K, argnums=(0, 3))(x, y, b, g)[0],
          torch.func.jacrev(dense, argnums=(0, 3))(x, y, b, g)[0])
    # Double backward: the Hessian of a scalar loss in g and in y, by reverse over reverse.
    for argnum in (3, 1):
        def loss(fn):
            return lambda *a: fn(*a).sin().sum()

        got = torch.func.jacrev(torch.func.jacrev(loss(K), argnums=argnum), argnums=argnum)(
            x, y, b, g)
        want = torch.func.jacrev(torch.func.jacrev(loss(dense), argnums=argnum),
                                 argnums=argnum)(x, y, b, g)
        close(got, want, 1e-9)


@needs_func
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("in_dims", [(0, None, None, None), (None, 0, None, None),
                                     (None, None, 1, None), (None, None, None, 0),
                                     (0, 0, None, 0), (1, None, 0, None)])
def test_vmap_is_one_launch(in_dims, axis, launches):
    K, dense = pair("Sum", axis)
    base = inputs()
    gen = torch.Generator().manual_seed(7)
    args = []
    for a, d in zip(base, in_dims):
        if d is None:
            args.append(a)
        else:
            a = torch.stack([a + 0.3 * torch.randn(a.shape, dtype=DT, generator=gen).abs()
                             for _ in range(B)], d)
            args.append(a)
    got = torch.vmap(K, in_dims=in_dims)(*args)
    assert launches[0] == 1
    want = torch.stack([dense(*[a if d is None else a.select(d, k)
                                for a, d in zip(args, in_dims)]) for k in range(B)])
    close(got, want)


@needs_func
def test_nested_vmap_is_one_launch(launches):
    K, dense = pair("Sum", 1)
    x, y, b, g = inputs()
    xs = torch.randn(3, B, NX, D, dtype=DT)
    gs = torch.rand(3, 1, dtype=DT) + 0.2
    inner = torch.vmap(K, in_dims=(0, None, None, None))
    got = torch.vmap(inner, in_dims=(0, None, None, 0))(xs, y, b, gs)
    assert launches[0] == 1
    want = torch.stack([torch.stack([dense(xx, y, b, gs[a]) for xx in xs[a]])
                        for a in range(3)])
    close(got, want)


@needs_func
def test_vmap_out_dims_and_lazytensor(launches):
    x, y, b, g = inputs()
    xs = torch.randn(B, NX, D, dtype=DT)

    def f(x):
        K_ij = (-Vi(x).sqdist(Vj(y)) * 0.6).exp()
        return (K_ij * LazyTensor(b[None])).sum(dim=1)

    got = torch.vmap(f, out_dims=1)(xs)
    assert launches[0] == 1
    want = torch.stack([dense_F(xx, y, b, g).sum(1) for xx in xs], 1)
    close(got, want)


@needs_func
@pytest.mark.parametrize("batched_y", [False, True])
def test_vmap_indices_are_per_batch(batched_y):
    # ArgMin over j: with a batched reduced side each batch has its own rows 0..NY-1.
    Kv = Genred("SqDist(x, y)", ["x = Vi(3)", "y = Vj(3)"], reduction_op="Min_ArgMin", axis=1)
    xs = torch.randn(B, NX, D, dtype=DT)
    ys = torch.randn(B, NY, D, dtype=DT) if batched_y else torch.randn(NY, D, dtype=DT)
    vals, idx = torch.vmap(Kv, in_dims=(0, 0 if batched_y else None))(xs, ys)
    d2 = ((xs[:, :, None, :] - (ys if batched_y else ys[None])[:, None, :, :]) ** 2).sum(-1)
    close(vals[..., 0], d2.min(-1).values)
    assert torch.equal(idx[..., 0], d2.argmin(-1))


@needs_func
def test_vmap_of_grad_per_batch_parameter():
    # Per-batch hyperparameters: the batched parameter is read as a per-row variable.
    K, dense = pair("Sum", 1)
    x, y, b, _ = inputs()
    gs = torch.rand(B, 1, dtype=DT) + 0.2
    for argnum in (0, 3):
        got = torch.vmap(torch.func.grad(lambda *a: K(*a).square().sum(), argnums=argnum),
                         in_dims=(None, None, None, 0))(x, y, b, gs)
        want = torch.vmap(torch.func.grad(lambda *a: dense(*a).square().sum(),
                                          argnums=argnum), in_dims=(None, None, None, 0))(
            x, y, b, gs)
        close(got, want)


@needs_func
def test_jacrev_of_min_and_softmax_weight():
    # jacrev is a vmap over the backward: the backward kernels' vmap rule with the selected
    # indices (Min) and the log-normalizer (SumSoftMaxWeight).
    K, dense = pair("Min", 1)
    x, y, b, g = inputs()
    close(torch.func.jacrev(K, argnums=1)(x, y, b, g),
          torch.func.jacrev(dense, argnums=1)(x, y, b, g))
    S = Genred("-g * SqDist(x, y)", ALIASES[:2] + ["g = Pm(1)", "b = Vj(2)"],
               reduction_op="SumSoftMaxWeight", axis=1, formula2="b")

    def dense_s(x, y, g, b):
        w = torch.softmax(-g * ((x[:, None] - y[None]) ** 2).sum(-1), 1)
        return w @ b

    close(torch.func.jacrev(S, argnums=(0, 2))(x, y, g, b)[1],
          torch.func.jacrev(dense_s, argnums=(0, 2))(x, y, g, b)[1])


@needs_func
def test_vmap_with_ranges_and_batch_dims(launches):
    # Block-sparse ranges given to the call: the same pattern in every vmapped batch.
    x, y, b, g = inputs()
    ri = np.array([[0, 3], [3, NX]])
    rj = np.array([[0, 2], [2, NY]])
    ranges = (ri, np.array([1, 2]), rj, rj, np.array([1, 2]), ri)
    xs = torch.randn(B, NX, D, dtype=DT)
    K = Genred(F, ALIASES, axis=1)
    got = torch.vmap(lambda x: K(x, y, b, g, ranges=ranges))(xs)
    mask = torch.zeros(NX, NY, 1, dtype=DT)
    mask[:3, :2] = mask[3:, 2:] = 1
    want = torch.stack([(dense_F(xx, y, b, g) * mask).sum(1) for xx in xs])
    close(got, want)
    # A call with its own leading batch dimension, vmapped: still one launch.
    launches[0] = 0
    ys = torch.randn(3, NY, D, dtype=DT)
    got = torch.vmap(lambda x: K(x, ys, b, g))(xs)
    assert launches[0] == 1
    want = torch.stack([torch.stack([dense_F(xx, yy, b, g).sum(1) for yy in ys])
                        for xx in xs])
    close(got, want)


@needs_func
def test_kernel_solve_grad_and_vmap_refused():
    x, _, _, _ = inputs()
    rhs = torch.randn(NX, 1, dtype=DT)
    Ks = KernelSolve("Exp(-SqDist(x, y)) * a", ["x = Vi(3)", "y = Vj(3)", "a = Vj(1)"], "a",
                     axis=1)

    def dense_solve(x, r):
        A = torch.exp(-((x[:, None] - x[None]) ** 2).sum(-1)) + torch.eye(NX, dtype=DT)
        return torch.linalg.solve(A, r)

    got = torch.func.grad(lambda r: Ks(x, x, r, alpha=1.0, eps=1e-14).sum())(rhs)
    close(got, torch.func.grad(lambda r: dense_solve(x, r).sum())(rhs), 1e-8)
    with pytest.raises(RuntimeError):
        torch.vmap(lambda r: Ks(x, x, r, alpha=1.0))(torch.randn(2, NX, 1, dtype=DT))


def tangents(seed=5):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(a.shape, dtype=DT, generator=gen) for a in inputs())


@needs_func
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("red", sorted(REDS))
def test_jvp_matches_dense(red, axis):
    # Forward mode: the tangent kernel (sr_kernel_jvp) along all four tangents at once, and
    # along the parameter's alone (the other tangents None).
    K, dense = pair(red, axis)
    args, dargs = inputs(), tangents()
    out, got = torch.func.jvp(K, args, dargs)
    out_d, want = torch.func.jvp(dense, args, dargs)
    close(out, out_d)
    close(got, want)
    only_g = (torch.zeros_like(args[0]), torch.zeros_like(args[1]), torch.zeros_like(args[2]),
              dargs[3])
    close(torch.func.jvp(lambda g: K(*args[:3], g), (args[3],), (dargs[3],))[1],
          torch.func.jvp(dense, args, only_g)[1])


@needs_func
@pytest.mark.parametrize("axis", [0, 1])
def test_jacfwd_each_argument(axis):
    # jacfwd is a vmap over jvp: the tangent kernel's vmap rule, with a batched tangent of an
    # unbatched parameter (both read per output row: the parameter repeated per batch).
    K, dense = pair("Sum", axis)
    args = inputs()
    for argnum in range(4):
        close(torch.func.jacfwd(K, argnums=argnum)(*args),
              torch.func.jacfwd(dense, argnums=argnum)(*args))


@needs_func
def test_jvp_of_softmax_weight_and_kmin():
    x, y, b, g = inputs()
    dx, dy, db, dg = tangents()
    S = Genred("-g * SqDist(x, y)", ALIASES, reduction_op="SumSoftMaxWeight", axis=0,
               formula2="b * (x | y)")

    def dense_s(x, y, b, g):
        s = torch.softmax(-g * ((x[:, None] - y[None]) ** 2).sum(-1), 0)
        return (s[..., None] * b[None] * (x @ y.T)[..., None]).sum(0)

    close(torch.func.jvp(S, (x, y, b, g), (dx, dy, db, dg))[1],
          torch.func.jvp(dense_s, (x, y, b, g), (dx, dy, db, dg))[1])
    Km = Genred("g * SqDist(x, y)", ALIASES, reduction_op="KMin", axis=1, opt_arg=3)

    def dense_k(x, y, b, g):
        return torch.topk(g * ((x[:, None] - y[None]) ** 2).sum(-1), 3, 1, largest=False).values

    close(torch.func.jvp(Km, (x, y, b, g), (dx, dy, db, dg))[1],
          torch.func.jvp(dense_k, (x, y, b, g), (dx, dy, db, dg))[1])


@needs_func
def test_hessian_forward_over_reverse():
    # hessian = jacfwd(jacrev): the tangent kernels of the gradient kernels.
    K, dense = pair("Sum", 1)
    args = inputs()
    got = torch.func.hessian(lambda *a: K(*a).square().sum(), argnums=(0, 1, 2, 3))(*args)
    want = torch.func.hessian(lambda *a: dense(*a).square().sum(), argnums=(0, 1, 2, 3))(*args)
    for i in range(4):
        for j in range(4):
            close(got[i][j], want[i][j], 1e-9)


@needs_func
def test_jvp_lazytensor_batch_dims_and_weighted_logsumexp():
    # Leading batch dimensions (block-sparse ranges) and the weighted LogSumExp (c + log of a
    # Sum of exp(F - c) w), as pykeops' own torch.func tests use them.
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 5, 1, 2, dtype=DT, generator=gen)
    y = torch.randn(3, 1, 4, 2, dtype=DT, generator=gen)
    w = torch.rand(3, 1, 4, 1, dtype=DT, generator=gen) + 0.5
    dargs = tuple(torch.randn(a.shape, dtype=DT, generator=gen) for a in (x, y, w))

    def lazy(x, y, w):
        d2 = ((LazyTensor(x) - LazyTensor(y)) ** 2).sum(-1)
        return d2.logsumexp(axis=2, weight=LazyTensor(w))

    def dense(x, y, w):
        return torch.logsumexp(((x - y) ** 2).sum(-1, keepdim=True) + w.log(), 2)

    close(torch.func.jvp(lazy, (x, y, w), dargs)[1], torch.func.jvp(dense, (x, y, w), dargs)[1])


@needs_func
def test_weighted_logsumexp_hessian_in_float32_as_accurate_as_dense():
    # pykeops' test_torch_func_logsumexp in float32: the Hessian of a norm of weighted
    # LogSumExps, against float64. The dense torch formula's own float32 error is the yardstick
    # (4.0e-6 of 7.2 on the 2-vCPU machine; symred's 4.1e-6, 2.4e-5 for the former form
    # LogSumExp + log SumSoftMaxWeight, whose weights carried the rounding of the LogSumExp).
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 4, 10, 1, 2, generator=gen)
    y = torch.randn(5, 1, 1, 20, 2, generator=gen)
    w = torch.rand(5, 4, 1, 20, 1, generator=gen)

    def dense(x, y, w):
        d2 = ((x - y) ** 2).sum(-1)[..., None]
        return ((d2.exp() * w).sum(2)).log().norm()

    def lazy(x, y, w):
        d2 = ((LazyTensor(x) - LazyTensor(y)) ** 2).sum(-1)
        return d2.logsumexp(axis=2, other=LazyTensor(w)).norm()

    exact = torch.func.hessian(dense)(x.double(), y.double(), w.double())
    err_dense = float((torch.func.hessian(dense)(x, y, w).double() - exact).abs().max())
    err = float((torch.func.hessian(lazy)(x, y, w).double() - exact).abs().max())
    assert err <= 2 * err_dense, (err, err_dense)


def test_forward_ad_dual_numbers():
    # torch.autograd.forward_ad (PyTorch 1.13 as well): the jvp rule of the Function.
    import torch.autograd.forward_ad as fwAD

    K, dense = pair("LogSumExp", 1)
    args, dargs = inputs(), tangents()
    with fwAD.dual_level():
        dual = [fwAD.make_dual(a, t) for a, t in zip(args, dargs)]
        got = fwAD.unpack_dual(K(*dual)).tangent
        want = fwAD.unpack_dual(dense(*dual)).tangent
    close(got, want)


@needs_func
def test_jvp_with_ranges_given_as_tensors():
    # Block-sparse ranges as int64 tensors under torch.func.jvp (whose .numpy() refuses even
    # a plain tensor): two diagonal blocks, against the masked dense jvp.
    x, y, b, g = inputs()
    dx, dy, db, dg = tangents()
    T = torch.tensor
    rg = (T([[0, 4], [4, NX]]), T([1, 2]), T([[0, 3], [3, NY]]),
          T([[0, 3], [3, NY]]), T([1, 2]), T([[0, 4], [4, NX]]))
    mask = torch.zeros(NX, NY, dtype=DT)
    mask[:4, :3] = 1
    mask[4:, 3:] = 1
    K, dense = pair("Sum", 1)
    got = torch.func.jvp(lambda x, y: K(x, y, b, g, ranges=rg), (x, y), (dx, dy))[1]
    want = torch.func.jvp(lambda x, y: (dense_F(x, y, b, g) * mask[..., None]).sum(1),
                          (x, y), (dx, dy))[1]
    close(got, want)
