"""Block-sparse ranges (pykeops' ``ranges=``): Genred and LazyTensor reductions against the
masked dense NumPy reduction, the cluster helpers (symred.numpy.cluster), bad ranges, and
symred.torch's forward and backward."""

import numpy as np
import pytest

from symred import SymredValueError
from symred.numpy import Genred, LazyTensor
from symred.numpy.cluster import (
    cluster_centroids,
    cluster_ranges,
    cluster_ranges_centroids,
    from_matrix,
    grid_cluster,
    sort_clusters,
    swap_axes,
)

ALIASES = ["x = Vi(3)", "y = Vj(3)"]
F2 = "Concat(SqDist(x, y), (x|y))"


def dense_F(x, y):
    sq = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
    return np.stack([sq, x @ y.T], axis=-1)  # (nx, ny, 2)


def mask_of(ranges, axis, nx, ny):
    """The (nx, ny) pairs a triple of the 6-tuple reduces, written out with plain loops."""
    rg, sl, red = ranges[0:3] if axis == 1 else ranges[3:6]
    m = np.zeros((nx, ny) if axis == 1 else (ny, nx), dtype=bool)
    prev = 0
    for c in range(len(rg)):
        for q in range(prev, sl[c]):
            m[rg[c][0]:rg[c][1], red[q][0]:red[q][1]] = True
        prev = sl[c]
    return m if axis == 1 else m.T


def random_ranges(nx, ny, seed, drop=1):
    """Random clusters of both sides, a random keep matrix, one row cluster dropped (its rows
    get the identity) and one with nothing kept."""
    rng = np.random.default_rng(seed)

    def clusters(n):
        cuts = np.unique(np.concatenate([[0, n], rng.integers(0, n + 1, size=4)]))
        return np.stack([cuts[:-1], cuts[1:]], axis=1)

    ri, rj = clusters(nx), clusters(ny)
    keep = rng.random((len(ri), len(rj))) < 0.5
    keep[0, :] = False
    R = list(from_matrix(ri, rj, keep))
    # The last cluster of the output side of axis `drop` is in no block: identity there.
    if drop == 1 and len(ri) > 2:
        R[0], R[1] = R[0][:-1], R[1][:-1]
    if drop == 0 and len(rj) > 2:
        R[3], R[4] = R[3][:-1], R[4][:-1]
    return tuple(R)


def masked_reduce(red, Fd, M, axis, K=3, W=None):
    """pykeops' reductions of the (nx, ny, D) values over the allowed pairs M (nx, ny)."""
    if axis == 0:
        Fd, M = Fd.transpose(1, 0, 2), M.T
        W = W.transpose(1, 0, 2) if W is not None else None
    Mx = M[..., None]
    big = np.where(Mx, Fd, np.inf)
    small = np.where(Mx, Fd, -np.inf)
    none = ~M.any(1)[:, None]
    if red == "Sum":
        return np.where(Mx, Fd, 0).sum(1)
    if red == "Min":
        return big.min(1)
    if red == "Max":
        return small.max(1)
    if red == "ArgMin":
        return np.where(none, -1, big.argmin(1))
    if red == "ArgMax":
        return np.where(none, -1, small.argmax(1))
    if red in ("KMin", "ArgKMin"):
        order = np.argsort(big, axis=1, kind="stable")[:, :K]
        vals = np.take_along_axis(big, order, axis=1)
        idx = np.where(np.isinf(vals), -1, order)
        return vals if red == "KMin" else idx
    if red == "LogSumExp":
        m = small.max(1, keepdims=True)
        m = np.where(np.isinf(m), 0, m)
        with np.errstate(divide="ignore"):
            return (m + np.log(np.exp(small - m).sum(1, keepdims=True)))[:, 0]
    if red == "SumSoftMaxWeight":
        m = small.max(1, keepdims=True)
        e = np.where(Mx, np.exp(small - np.where(np.isinf(m), 0, m)), 0)
        with np.errstate(invalid="ignore"):
            return (e * W).sum(1) / e.sum(1)
    raise AssertionError(red)


REDS = ["Sum", "Min", "Max", "ArgMin", "ArgMax", "KMin", "ArgKMin", "LogSumExp",
        "SumSoftMaxWeight"]


@pytest.mark.parametrize("red", REDS)
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_genred_against_masked_dense(red, axis, dtype):
    nx, ny = 23, 31
    rng = np.random.default_rng(1)
    x = rng.standard_normal((nx, 3)).astype(dtype)
    y = rng.standard_normal((ny, 3)).astype(dtype)
    R = random_ranges(nx, ny, 3 + axis, drop=axis)
    M = mask_of(R, axis, nx, ny)
    xd, yd = x.astype(np.float64), y.astype(np.float64)
    kw = {}
    formula, W = F2, None
    if red in ("KMin", "ArgKMin"):
        kw["opt_arg"] = 3
    if red == "SumSoftMaxWeight":
        formula = "-SqDist(x, y)"
        kw["formula2"] = "y" if axis == 1 else "x"
        W = np.broadcast_to(yd[None] if axis == 1 else xd[:, None], (nx, ny, 3))
    g = Genred(formula, ALIASES, reduction_op=red, axis=axis, **kw)
    out = g(x, y, ranges=R)
    Fd = dense_F(xd, yd)[..., :1] if red == "SumSoftMaxWeight" else dense_F(xd, yd)
    if red == "SumSoftMaxWeight":
        Fd = -Fd
    want = masked_reduce(red, Fd, M, axis, W=W)
    if red in ("ArgMin", "ArgMax", "ArgKMin"):
        np.testing.assert_array_equal(out.reshape(want.shape), want)
    else:
        tol = 1e-4 if dtype == np.float32 else 1e-10
        np.testing.assert_allclose(out.reshape(want.shape), want, rtol=tol, atol=tol)


def test_cpu_jit_backend():
    """The JIT (not the reference the other tests default to) on a bigger clustered case."""
    nx, ny = 700, 900
    rng = np.random.default_rng(2)
    x, y = rng.random((nx, 2)), rng.random((ny, 2))
    b = rng.random((ny, 1))
    xl, yl = grid_cluster(x, 0.1), grid_cluster(y, 0.1)
    rx, cx, _ = cluster_ranges_centroids(x, xl)
    ry, cy, _ = cluster_ranges_centroids(y, yl)
    x, xl = sort_clusters(x, xl)
    (y, b), yl = sort_clusters((y, b), yl)
    keep = ((cx[:, None] - cy[None]) ** 2).sum(-1) < 0.25 ** 2
    R = from_matrix(rx, ry, keep)
    g = Genred("Exp(-SqDist(x, y) * 20) * b", ["x = Vi(2)", "y = Vj(2)", "b = Vj(1)"], axis=1)
    out = g(x, y, b, ranges=R, backend="CPU")
    K = np.exp(-((x[:, None] - y[None]) ** 2).sum(-1) * 20) * keep[xl][:, yl]
    np.testing.assert_allclose(out[:, 0], K @ b[:, 0], rtol=1e-10, atol=1e-12)
    assert g.plan(backend="CPU")["backend"] == "cpu-jit", g.explain(backend="CPU")
    # The same pattern by mask_of: from_matrix's triples agree with the cluster mask.
    np.testing.assert_array_equal(mask_of(R, 1, nx, ny), keep[xl][:, yl])
    np.testing.assert_array_equal(mask_of(R, 0, nx, ny), keep[xl][:, yl])


def test_lazytensor_ranges():
    nx, ny = 40, 50
    rng = np.random.default_rng(4)
    x, y, b = rng.random((nx, 3)), rng.random((ny, 3)), rng.random((ny, 2))
    R = random_ranges(nx, ny, 9)
    M = mask_of(R, 1, nx, ny)
    X, Y, B = LazyTensor(x[:, None, :]), LazyTensor(y[None, :, :]), LazyTensor(b[None, :, :])
    K = (-((X - Y) ** 2).sum(-1)).exp()
    Kd = np.exp(-((x[:, None] - y[None]) ** 2).sum(-1)) * M
    # ranges= on the reduction
    np.testing.assert_allclose((K * B).sum(dim=1, ranges=R), Kd @ b, rtol=1e-12)
    # K.ranges, kept through the product with B (pykeops' attribute)
    K.ranges = R
    np.testing.assert_allclose((K * B).sum(dim=1), Kd @ b, rtol=1e-12)
    Kd0 = np.exp(-((x[:, None] - y[None]) ** 2).sum(-1)) * mask_of(R, 0, nx, ny)
    np.testing.assert_allclose((K * B).sum(dim=0), Kd0.sum(0)[:, None] * b, rtol=1e-12)
    idx = (((X - Y) ** 2).sum(-1)).argmin(dim=1)
    assert idx.shape == (nx, 1)


def test_cluster_helpers():
    x = np.array([[0.0], [5.0], [0.4], [0.3], [2.0]])
    lab = grid_cluster(x, 1.0)
    np.testing.assert_array_equal(lab, [0, 2, 0, 0, 1])
    xs, ls = sort_clusters(x, lab)
    np.testing.assert_array_equal(xs[:, 0], [0.0, 0.4, 0.3, 2.0, 5.0])
    np.testing.assert_array_equal(ls, [0, 0, 0, 1, 2])
    np.testing.assert_array_equal(cluster_ranges(ls), [[0, 3], [3, 4], [4, 5]])
    r, c, w = cluster_ranges_centroids(x, lab, weights=np.array([1.0, 1, 1, 2, 1]))
    np.testing.assert_array_equal(r, [[0, 3], [3, 4], [4, 5]])
    np.testing.assert_allclose(c[:, 0], [(0 + 0.4 + 0.6) / 4, 2.0, 5.0])
    np.testing.assert_allclose(w, [4, 1, 1])
    np.testing.assert_allclose(cluster_centroids(x, lab)[:, 0], [0.7 / 3, 2.0, 5.0])
    # grid_cluster in any dimension: same label iff same cell
    p = np.random.default_rng(0).random((200, 4))
    lab4 = grid_cluster(p, 0.5)
    cells = np.floor(p / 0.5)
    same = (cells[:, None] == cells[None]).all(-1)
    np.testing.assert_array_equal(lab4[:, None] == lab4[None], same)
    ri = np.array([[0, 2], [2, 5]])
    rj = np.array([[0, 1], [1, 4], [4, 6]])
    keep = np.array([[True, False, True], [False, True, False]])
    R = from_matrix(ri, rj, keep)
    assert all(a.dtype == np.int32 for a in R)
    np.testing.assert_array_equal(R[1], [2, 3])
    np.testing.assert_array_equal(R[2], [[0, 1], [4, 6], [1, 4]])
    np.testing.assert_array_equal(R[4], [1, 2, 3])
    np.testing.assert_array_equal(R[5], [[0, 2], [2, 5], [0, 2]])
    S = swap_axes(R)
    assert S[0] is R[3] and S[3] is R[0] and swap_axes(None) is None
    with pytest.raises(ValueError, match="keep must have shape"):
        from_matrix(ri, rj, keep.T)


def test_import_paths():
    import symred.numpy
    import symred.numpy.cluster as c

    assert c.from_matrix is from_matrix and symred.numpy.cluster is c


GOOD = ([[0, 3], [3, 5]], [1, 2], [[0, 4], [2, 6]], [[0, 6]], [2], [[0, 3], [3, 5]])


@pytest.mark.parametrize(
    "bad, cls, msg",
    [
        ((GOOD[0], GOOD[1], GOOD[2]), ValueError, "6-tuple"),
        (([[0, 3], [2, 5]],) + GOOD[1:], SymredValueError, "overlap"),
        ((GOOD[0], GOOD[1], [[0, 4], [2, 9]]) + GOOD[3:], SymredValueError, "not inside"),
        ((GOOD[0], [2, 1], GOOD[2]) + GOOD[3:], SymredValueError, "slices_i"),
        ((GOOD[0], [1, 3], GOOD[2]) + GOOD[3:], SymredValueError, "slices_i"),
        ((GOOD[0], [2, 2], [[0, 4], [2, 6]]) + GOOD[3:], SymredValueError, "count twice"),
        (([[3, 0], [3, 5]],) + GOOD[1:], SymredValueError, "start > end"),
        ((np.array(GOOD[0], dtype=np.float32),) + GOOD[1:], TypeError, "integer arrays"),
        ((GOOD[0], [[1], [2]]) + GOOD[2:], ValueError, r"slices_i must have shape \(n,\)"),
        ((GOOD[0], [1]) + GOOD[2:], ValueError, "2 blocks but slices_i has 1"),
    ],
)
def test_bad_ranges(bad, cls, msg):
    g = Genred(F2, ALIASES, reduction_op="Sum", axis=1)
    x, y = np.zeros((5, 3)), np.zeros((6, 3))
    with pytest.raises(cls, match=msg):
        g(x, y, ranges=bad)
    g(x, y, ranges=GOOD)  # still usable


def test_torch_forward_backward():
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    from symred.torch import Genred as TGenred
    from symred.torch.cluster import from_matrix as tfrom_matrix

    nx, ny = 30, 40
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(nx, 3, dtype=torch.float64, generator=gen).requires_grad_()
    y = torch.randn(ny, 3, dtype=torch.float64, generator=gen).requires_grad_()
    b = torch.randn(ny, 2, dtype=torch.float64, generator=gen).requires_grad_()
    ri = torch.tensor([[0, 10], [10, 30]], dtype=torch.int32)
    rj = torch.tensor([[0, 15], [15, 25], [25, 40]], dtype=torch.int32)
    keep = torch.tensor([[True, False, True], [False, True, True]])
    R = tfrom_matrix(ri, rj, keep)
    # As pykeops.torch.cluster.from_matrix: the ranges keep their dtype, slices are int64.
    assert [t.dtype for t in R] == [torch.int32, torch.int64, torch.int32] * 2
    M = torch.from_numpy(mask_of([t.numpy() for t in R], 1, nx, ny))
    for red in ("Sum", "LogSumExp"):
        g = TGenred("Exp(-SqDist(x, y)) * b" if red == "Sum" else "-SqDist(x, y) + b",
                    ["x = Vi(3)", "y = Vj(3)", "b = Vj(2)"], reduction_op=red, axis=1)
        out = g(x, y, b, ranges=R)
        sq = ((x[:, None] - y[None]) ** 2).sum(-1)
        if red == "Sum":
            want = ((torch.exp(-sq) * M)[..., None] * b[None]).sum(1)
        else:
            want = torch.logsumexp(torch.where(M[..., None], -sq[..., None] + b[None],
                                               torch.tensor(-float("inf"),
                                                            dtype=torch.float64)), 1)
        assert torch.allclose(out, want, rtol=1e-10, atol=1e-12)
        gx, gy, gb = torch.autograd.grad(out.sum(), (x, y, b))
        wx, wy, wb = torch.autograd.grad(want.sum(), (x, y, b))
        for a, w in ((gx, wx), (gy, wy), (gb, wb)):
            assert torch.allclose(a, w, rtol=1e-9, atol=1e-12)


def test_torch_host_round_trip_of_cuda_tensors_with_ranges(monkeypatch):
    """CUDA tensors with ranges run through host copies (_run_ranges_via_host; the CUDA run
    itself is in test_torch_cuda.py, skipped without a GPU). Here the same path is forced on
    CPU tensors, so that its plumbing (host copies, outputs copied back, indices) is checked
    against the direct run on every machine."""
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    import symred.torch as st

    nx, ny = 23, 31
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(nx, 3, dtype=torch.float64, generator=gen).requires_grad_()
    y = torch.randn(ny, 3, dtype=torch.float64, generator=gen)
    R = random_ranges(nx, ny, seed=5, drop=2)
    g = st.Genred(F2, ALIASES, reduction_op="Sum", axis=1)
    gm = st.Genred(F2, ALIASES, reduction_op="Min_ArgMin", axis=0)
    want = g(x, y, ranges=R)
    want_gx = torch.autograd.grad(want.sum(), x)[0]
    want_m = gm(x.detach(), y, ranges=R)
    calls = []
    real_run = st._run

    def forced(kern, nx_, ny_, ranges, args):
        if ranges is None:
            return real_run(kern, nx_, ny_, ranges, args)
        calls.append(kern.red)
        first = next(a for a in args if a is not None)
        values = idx = None
        nout = nx_ if kern.axis == 1 else ny_
        if kern.red not in st._INDEX_ONLY:
            values = torch.full((nout, kern.out_dim), float("nan"), dtype=first.dtype)
        if kern.red in st._WITH_INDICES:
            idx = torch.full((nout, kern.out_dim), -7, dtype=torch.int64)
        return st._run_ranges_via_host(kern, nx_, ny_, ranges, list(args), values, idx)

    monkeypatch.setattr(st, "_run", forced)
    out = g(x, y, ranges=R)
    gx = torch.autograd.grad(out.sum(), x)[0]
    v, i = gm(x.detach(), y, ranges=R)
    assert calls == ["Sum", "Sum", "Min_ArgMin"]  # forward, gradient kernel, Min_ArgMin
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    torch.testing.assert_close(gx, want_gx, rtol=0, atol=0)
    torch.testing.assert_close(v, want_m[0], rtol=0, atol=0)
    torch.testing.assert_close(i, want_m[1], rtol=0, atol=0)
