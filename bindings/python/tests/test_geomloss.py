"""GeomLoss (PyPI) through pykeops_shim: SamplesLoss with the KeOps backends ("online",
"multiscale") on symred against its dense "tensorized" backend, values and gradients, float32,
relative 1e-4.

GeomLoss's tensorized distances are sqrt(max(|x - y|^2, 1e-8)), so its self-interaction terms
(distance 0) differ from KeOps' Norm2 by 1e-4 each; the reference here uses the exact distance
(torch.norm, whose gradient at 0 is 0 as KeOps' Sqrt), so that the comparison tests symred and
not that clamp. The multiscale backend runs with one cluster per point (cluster_scale tiny), so
that its coarse-to-fine schedule computes what the single-scale one does, through symred's
cluster helpers, from_matrix and block-sparse ranges (truncate=20: every pair kept whose
weight exceeds e^-20).
"""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("geomloss")

SHIM = Path(__file__).resolve().parents[1] / "pykeops_shim"


@pytest.fixture(scope="module")
def geomloss():
    """geomloss imported with ``pykeops`` resolving to symred (the shim), then forgotten again
    with the shim, so that the other tests see neither."""
    def forget():
        for name in [n for n in sys.modules
                     if n.split(".")[0] in ("geomloss", "pykeops", "pykeops_shim")]:
            del sys.modules[name]

    forget()
    sys.path.insert(0, str(SHIM))
    import pykeops_shim  # noqa: F401  (installs the finder)
    import geomloss as gl
    import geomloss._legacy.kernel_samples as ks
    import geomloss._legacy.sinkhorn_samples as ss
    import geomloss._legacy.utils as ut

    assert ss.keops_available and ks.keops_available, "geomloss did not import pykeops"
    assert ss.LazyTensor.__module__.startswith("symred")

    def exact_distances(x, y, use_keops=False):
        if use_keops:
            return ut.squared_distances(x, y, use_keops=True).sqrt()
        return (x.unsqueeze(-2) - y.unsqueeze(-3)).norm(dim=-1)

    saved = [(m, m.distances) for m in (ut, ks, ss)]
    for m, _ in saved:
        m.distances = exact_distances
    yield gl
    for m, d in saved:
        m.distances = d
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__module__ != "pykeops_shim"]
    sys.path.remove(str(SHIM))
    forget()


def _data(batch):
    g = torch.Generator().manual_seed(0)
    shape = (batch,) if batch else ()
    x = torch.rand(*shape, 40, 3, generator=g)
    y = torch.rand(*shape, 30, 3, generator=g) + 0.2
    a = torch.rand(*shape, 40, generator=g) + 0.1
    b = torch.rand(*shape, 30, generator=g) + 0.1
    return a / a.sum(-1, keepdim=True), x, b / b.sum(-1, keepdim=True), y


def _loss_and_grad(gl, loss, backend, kw, weighted, batch=0):
    torch.set_grad_enabled(True)  # GeomLoss switches it off inside its loops
    a, x, b, y = _data(batch)
    x = x.clone().requires_grad_(True)
    f = gl.SamplesLoss(loss, backend=backend, **kw)
    L = f(a, x, b, y) if weighted else f(x, y)
    (g,) = torch.autograd.grad(L.sum(), x)
    return L.detach(), g


CASES = [
    ("sinkhorn", dict(p=2, blur=0.05), True),
    ("sinkhorn", dict(p=2, blur=0.05), False),
    ("sinkhorn", dict(p=1, blur=0.05), True),
    ("sinkhorn", dict(p=2, blur=0.05, reach=0.5), True),
    ("energy", {}, True),
    ("gaussian", dict(blur=0.2), True),
    ("laplacian", dict(blur=0.2), True),
]
MULTISCALE = dict(cluster_scale=1e-6, truncate=20)


def _close(got, want, what):
    rel = float((got - want).norm() / want.norm())
    assert rel <= 1e-4, f"{what}: relative difference {rel:.2e} > 1e-4"


@pytest.mark.parametrize("backend", ["online", "multiscale"])
@pytest.mark.parametrize("loss,kw,weighted", CASES,
                         ids=[f"{c[0]}-{'-'.join(f'{k}{v}' for k, v in c[1].items())}"
                              f"{'-weighted' if c[2] else ''}" for c in CASES])
def test_matches_tensorized(geomloss, loss, kw, weighted, backend):
    extra = MULTISCALE if backend == "multiscale" else {}
    L0, g0 = _loss_and_grad(geomloss, loss, "tensorized", kw, weighted)
    L, g = _loss_and_grad(geomloss, loss, backend, dict(kw, **extra), weighted)
    _close(L, L0, f"{loss} {backend} value")
    if backend == "multiscale" and loss == "sinkhorn" and kw.get("p") == 1:
        # GeomLoss's multiscale Sinkhorn at p = 1 has another gradient than its tensorized
        # backend (relative 0.7 here) with any LogSumExp, a dense torch one included: the
        # reference is then that same multiscale code on the dense LogSumExp.
        g0 = _multiscale_on_dense_lse(geomloss, kw, extra, weighted)
    _close(g, g0, f"{loss} {backend} gradient")


def _multiscale_on_dense_lse(gl, kw, extra, weighted):
    """The gradient of GeomLoss's multiscale Sinkhorn with its KeOps LogSumExp replaced by a
    dense torch one (no symred involved) that honours the block-sparse ranges of a reduction
    over j."""
    ss = sys.modules["geomloss._legacy.sinkhorn_samples"]

    def dense_lse(cost, D, dtype="float32"):
        def lse(x, y, b, p, ranges=None):
            d = x[:, None, :] - y[None, :, :]
            c = d.norm(dim=-1) if cost.startswith("Norm2") else (d ** 2).sum(-1) / 2
            out = b.view(1, -1) - p * c
            if ranges is not None:  # the kept blocks only (from_matrix's row-major triple)
                keep = torch.zeros_like(out, dtype=torch.bool)
                ranges_i, slices_i, red_j = ranges[0], ranges[1], ranges[2]
                start = 0
                for k in range(ranges_i.shape[0]):
                    for t in range(start, int(slices_i[k])):
                        keep[ranges_i[k, 0]:ranges_i[k, 1], red_j[t, 0]:red_j[t, 1]] = True
                    start = int(slices_i[k])
                out = out.masked_fill(~keep, -float("inf"))
            return torch.logsumexp(out, dim=1, keepdim=True)
        return lse

    saved = ss.keops_lse
    ss.keops_lse = dense_lse
    try:
        return _loss_and_grad(gl, "sinkhorn", "multiscale", dict(kw, **extra), weighted)[1]
    finally:
        ss.keops_lse = saved


@pytest.mark.parametrize("loss,kw", [("sinkhorn", dict(p=2, blur=0.05)),
                                     ("gaussian", dict(blur=0.2))])
def test_batched_online_matches_tensorized(geomloss, loss, kw):
    L0, g0 = _loss_and_grad(geomloss, loss, "tensorized", kw, True, batch=2)
    L, g = _loss_and_grad(geomloss, loss, "online", kw, True, batch=2)
    assert L.shape == L0.shape == (2,)
    _close(L, L0, f"batched {loss} value")
    _close(g, g0, f"batched {loss} gradient")
