"""symred.torch's backward of attention through sr_kernel_vjp, the fused backward
(docs/gradients.md): float64 gradcheck, the same gradients as the gradient kernels (the path
taken when sr_kernel_vjp declines), and the fallback for the kernels it declines. On the CPU
JIT (backend="CPU"): the tests' default device, the reference backend, has no fused backward."""

import pytest

torch = pytest.importorskip("torch")

import symred.torch as st  # noqa: E402


def _attention(d, r, formula="(q|k)*s"):
    return st.Genred(formula, [f"q=Vi({d})", f"k=Vj({d})", "s=Pm(1)", f"v=Vj({r})"],
                     reduction_op="SumSoftMaxWeight", axis=1, formula2="v")


@pytest.fixture
def fused_calls(monkeypatch):
    """Counts the backward calls that sr_kernel_vjp answered."""
    calls = []
    orig = st._fused_vjp

    def spy(*a):
        res = orig(*a)
        calls.append(res is not None)
        return res

    monkeypatch.setattr(st, "_fused_vjp", spy)
    return calls


def _inputs(n, m, d, r, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(rows, d, generator=g, dtype=dtype) * 0.5 for rows in (n, m))
    v = torch.randn(m, r, generator=g, dtype=dtype)
    s = torch.tensor([0.7], dtype=dtype)
    return q, k, s, v


def _fused_matches_kernels(fused_calls, monkeypatch, fn, ins, G, dtype, **kw):
    """The gradients of fn(*ins, **kw) along G by the fused backward (asserted taken) equal
    those of the gradient kernels (the path when sr_kernel_vjp declines); returns the fused
    ones."""

    def grads():
        x = [t.clone().requires_grad_(True) for t in ins]
        return torch.autograd.grad(fn(*x, backend="CPU", **kw), x, G)

    fused = grads()
    assert fused_calls == [True]
    monkeypatch.setattr(st, "_fused_vjp", lambda *a: None)
    kernels = grads()
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    for a, b in zip(fused, kernels):
        assert float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))
    return fused


def test_gradcheck_float64_runs_the_fused_backward(fused_calls):
    fn = _attention(5, 3)
    ins = [t.requires_grad_(True) for t in _inputs(7, 11, 5, 3, torch.float64)]
    assert torch.autograd.gradcheck(lambda *a: fn(*a, backend="CPU"), ins)
    assert fused_calls and all(fused_calls)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n, m, d, r", [(300, 517, 64, 65), (97, 13, 17, 16), (1, 1, 1, 1)])
def test_same_gradients_as_the_gradient_kernels(fused_calls, monkeypatch, dtype, n, m, d, r):
    fn = _attention(d, r)
    ins = _inputs(n, m, d, r, dtype, seed=n)
    G = torch.randn(n, r, dtype=dtype, generator=torch.Generator().manual_seed(1))

    _fused_matches_kernels(fused_calls, monkeypatch, fn, ins, G, dtype)


def test_declined_kernels_fall_back_to_the_gradient_kernels(fused_calls):
    fn = _attention(4, 3, "-SqDist(q,k)*s")
    q, k, s, v = (t.requires_grad_(True) for t in _inputs(9, 8, 4, 3, torch.float64))
    out = fn(q, k, s, v, backend="CPU")
    got = torch.autograd.grad(out.sum(), (q, k, v))
    w = torch.softmax(-((q[:, None] - k[None]) ** 2).sum(-1) * s, dim=1)
    want = torch.autograd.grad((w @ v).sum(), (q, k, v))
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-10)
    assert fused_calls == [False]
    (tk,) = fn._torch_kernels.values()
    assert tk.fused_vjp is False  # asked once, remembered


def test_double_backward_takes_the_gradient_kernels(fused_calls):
    fn = _attention(3, 2)
    ins = [t.requires_grad_(True) for t in _inputs(5, 6, 3, 2, torch.float64)]
    assert torch.autograd.gradgradcheck(lambda *a: fn(*a, backend="CPU"), ins)


def test_forward_keeps_the_log_normalizer_for_the_backward(monkeypatch):
    seen = []
    orig = st._fused_vjp

    def spy(*a):
        seen.append(a[7])  # lse
        return orig(*a)

    monkeypatch.setattr(st, "_fused_vjp", spy)
    fn = _attention(8, 4)
    q, k, s, v = _inputs(20, 30, 8, 4, torch.float32)
    q.requires_grad_(True)
    out = fn(q, k, s, v, backend="CPU")
    w = torch.softmax((q @ k.T) * s, dim=1)
    assert torch.allclose(out, w @ v, atol=1e-5)
    (gq,) = torch.autograd.grad(out.sum(), (q,))
    (want,) = torch.autograd.grad((w @ v).sum(), (q,))
    assert torch.allclose(gq, want, atol=1e-5)
    assert len(seen) == 1 and seen[0] is not None
    assert torch.allclose(seen[0], torch.logsumexp((q @ k.T) * s, dim=1).detach(), atol=1e-5)
    assert not hasattr(out, "_symred_lse")  # handed to the backward, not left on the output


@pytest.mark.parametrize("n, m", [(23, 41), (41, 23)])
def test_axis_0_runs_the_fused_backward(fused_calls, n, m):
    # out_j = sum_i softmax_i((q_j|k_i) s) v_i: q of the j side, k and v of the reduced i side
    fn = st.Genred("(q|k)*s", ["q=Vj(5)", "k=Vi(5)", "s=Pm(1)", "v=Vi(3)"],
                   reduction_op="SumSoftMaxWeight", axis=0, formula2="v")
    q, k, s, v = _inputs(m, n, 5, 3, torch.float64)  # q: m rows (j), k and v: n rows (i)
    ins = [t.requires_grad_(True) for t in (k, q, s, v)]
    out = fn(ins[1], ins[0], ins[2], ins[3], backend="CPU")
    assert out.shape == (m, 3)
    w = torch.softmax((ins[1] @ ins[0].T) * ins[2], dim=1)
    assert torch.allclose(out, w @ ins[3], atol=1e-10)
    got = torch.autograd.grad(out.sum(), ins)
    want = torch.autograd.grad((w @ ins[3]).sum(), ins)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-10)
    assert fused_calls == [True]
    assert torch.autograd.gradcheck(
        lambda kk, qq, ss, vv: fn(qq, kk, ss, vv, backend="CPU"), ins)


def _block_ranges(n, m, bn, bm, axis):
    """pykeops-style ranges (from_matrix, as torch int32 tensors) of n rows in clusters of bn
    and m columns in clusters of bm; row cluster 1 keeps no column cluster (its rows get no
    pair) and the others a diagonal band, so that intervals end inside the tiles. The dense
    mask of the kept pairs (n x m) beside them; axis 0: the same with rows and columns swapped
    (the output rows are then the m columns)."""
    import numpy as np
    from symred.cluster import from_matrix, swap_axes

    ri = np.array([[a, min(a + bn, n)] for a in range(0, n, bn)])
    rj = np.array([[b, min(b + bm, m)] for b in range(0, m, bm)])
    keep = np.array([[a != 1 and abs(a - b) <= 1 for b in range(len(rj))] for a in range(len(ri))])
    mask = np.zeros((n, m), dtype=bool)
    for a, (i0, i1) in enumerate(ri):
        for b, (j0, j1) in enumerate(rj):
            mask[i0:i1, j0:j1] = keep[a, b]
    ranges = from_matrix(ri, rj, keep)
    if axis == 0:
        ranges = swap_axes(ranges)
    return tuple(torch.from_numpy(r) for r in ranges), torch.from_numpy(mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n, m, bn, bm", [(130, 301, 17, 41), (1, 1, 1, 1), (97, 13, 10, 3)])
def test_block_sparse_ranges_run_the_fused_backward(fused_calls, monkeypatch, dtype, n, m, bn,
                                                    bm):
    fn = _attention(16, 5)
    ins = _inputs(n, m, 16, 5, dtype, seed=m)
    ranges, mask = _block_ranges(n, m, bn, bm, 1)
    G = torch.randn(n, 5, dtype=dtype, generator=torch.Generator().manual_seed(2))

    fused = _fused_matches_kernels(fused_calls, monkeypatch, fn, ins, G, dtype, ranges=ranges)
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    # the masked softmax on the rows that have pairs (the others: no gradient)
    q, k, s, v = (t.clone().requires_grad_(True) for t in ins)
    rows = mask.any(1)
    w = torch.softmax(((q @ k.T) * s).masked_fill(~mask, float("-inf"))[rows], dim=1)
    want = torch.autograd.grad(w @ v, (q, k, s, v), G[rows])
    for a, b in zip(fused, want):
        assert float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))


def test_block_sparse_ranges_axis_0_gradcheck(fused_calls):
    fn = st.Genred("(q|k)*s", ["q=Vj(4)", "k=Vi(4)", "s=Pm(1)", "v=Vi(3)"],
                   reduction_op="SumSoftMaxWeight", axis=0, formula2="v")
    n, m = 19, 23  # n rows of k and v (i, reduced), m of q (j, the output)
    ranges, mask = _block_ranges(m, n, 5, 4, 0)
    q, k, s, v = _inputs(m, n, 4, 3, torch.float64)
    ins = [t.requires_grad_(True) for t in (q, k, s, v)]
    out = fn(*ins, backend="CPU", ranges=ranges)
    rows = mask.any(1)
    w = torch.softmax(((ins[0] @ ins[1].T) * ins[2]).masked_fill(~mask, float("-inf"))[rows],
                      dim=1)
    assert torch.allclose(out[rows], w @ ins[3], atol=1e-10)
    got = torch.autograd.grad(out[rows].sum(), ins)
    want = torch.autograd.grad((w @ ins[3]).sum(), ins)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-10)
    assert fused_calls == [True]
    assert torch.autograd.gradcheck(
        lambda *a: fn(*a, backend="CPU", ranges=ranges)[rows], ins)
