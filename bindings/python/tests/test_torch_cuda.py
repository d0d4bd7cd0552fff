"""symred.torch on CUDA tensors (sr_kernel_run_device: inputs and outputs stay on the GPU).

Skipped, with the reason, where torch has no CUDA device. On a GPU machine run it alone:

    SYMRED_LIB=$PWD/build/libsymred.so /usr/bin/python3 -m pytest -v -rs \\
        bindings/python/tests/test_torch_cuda.py

(conftest.py sets SYMRED_DEVICE=reference for the rest of the suite; CUDA tensors always use
the CUDA backend, whatever SYMRED_DEVICE says.)
"""

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch (torch.cuda.is_available() is False): the "
                "CUDA tests of symred.torch need a GPU", allow_module_level=True)

import symred.torch as st  # noqa: E402
from symred.torch import Genred, LazyTensor  # noqa: E402

ALIASES = ["x = Vi(3)", "y = Vj(3)", "b = Vj(2)", "g = Pm(1)"]
F = "Exp(-g * SqDist(x, y)) * b"


def inputs(dtype, n=300, m=200, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, dtype=dtype, generator=gen)
    y = torch.randn(m, 3, dtype=dtype, generator=gen)
    b = torch.randn(m, 2, dtype=dtype, generator=gen)
    g = torch.tensor([0.6], dtype=dtype)
    return x, y, b, g


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("red", ["Sum", "LogSumExp", "Min", "SumSoftMaxWeight"])
@pytest.mark.parametrize("axis", [0, 1])
def test_cuda_matches_cpu_forward_and_backward(red, axis, dtype):
    cpu = [t.requires_grad_() for t in inputs(dtype)]
    gpu = [t.detach().cuda().requires_grad_() for t in cpu]
    kw = dict(formula2="b * Elem(x, 0)") if red == "SumSoftMaxWeight" else {}
    formula = "-g * SqDist(x, y)" if red == "SumSoftMaxWeight" else F
    fn = Genred(formula, ALIASES, reduction_op=red, axis=axis, **kw)
    out_c = fn(*cpu, backend="CPU")
    out_g = fn(*gpu)
    assert out_g.is_cuda and out_g.dtype == dtype
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(out_g.cpu(), out_c.detach(), **tol)
    G = torch.randn_like(out_c)
    gc = torch.autograd.grad((out_c * G).sum(), cpu)
    gg = torch.autograd.grad((out_g * G.cuda()).sum(), gpu)
    for name, a, b in zip("xybg", gc, gg):
        assert b.is_cuda
        torch.testing.assert_close(b.cpu(), a, **tol, msg=f"d/d{name}")


def test_cuda_gradcheck_and_gradgradcheck():
    x, y, b, g = (t.cuda().requires_grad_() for t in inputs(torch.float64, n=5, m=4))
    fn = Genred(F, ALIASES, reduction_op="LogSumExp", axis=1)
    assert torch.autograd.gradcheck(fn, (x, y, b, g))
    assert torch.autograd.gradgradcheck(fn, (x, y, b, g))


def test_cuda_pointers_are_passed_in_place(monkeypatch):
    seen = []
    real = st._pointer
    monkeypatch.setattr(st, "_pointer", lambda t: seen.append(real(t)) or real(t))
    x, y, b, g = (t.cuda() for t in inputs(torch.float32))
    out = Genred(F, ALIASES, axis=1)(x, y, b, g)
    assert out.is_cuda
    for t in (x, y, b, g):
        assert t.data_ptr() in seen
    assert out.data_ptr() in seen


def test_cuda_lazytensor_and_backend_errors():
    x, y, b, g = (t.cuda() for t in inputs(torch.float32))
    K = (-LazyTensor(x[:, None]).sqdist(LazyTensor(y[None]))).exp()
    out = (K * LazyTensor(b[None])).sum(dim=1)
    assert out.is_cuda and out.shape == (300, 2)
    # A parameter given as a number or a CPU tensor follows the data to the GPU.
    ref = Genred(F, ALIASES, axis=1)(x, y, b, g)
    torch.testing.assert_close(Genred(F, ALIASES, axis=1)(x, y, b, 0.6), ref)
    torch.testing.assert_close(Genred(F, ALIASES, axis=1)(x, y, b, g.cpu()), ref)
    with pytest.raises(ValueError, match="runs on the CPU"):
        Genred(F, ALIASES, axis=1)(x, y, b, g, backend="CPU")
    with pytest.raises(ValueError, match="one device"):
        Genred(F, ALIASES, axis=1)(x, y.cpu(), b, g)


def test_cuda_ranges_and_batches_match_cpu():
    """CUDA tensors with block-sparse ranges (through host copies: sr_kernel_run_device has no
    ranges) and with batch dimensions (which run as ranges), forward and backward, against the
    same calls on CPU tensors. Written without a GPU; docs/torch.md."""
    from symred.torch.cluster import from_matrix

    x, y, b, g = (t.requires_grad_() for t in inputs(torch.float64, n=60, m=50))
    ri = torch.tensor([[0, 20], [20, 60]])
    rj = torch.tensor([[0, 10], [10, 35], [35, 50]])
    R = from_matrix(ri, rj, torch.tensor([[True, False, True], [False, True, True]]))
    fn = Genred(F, ALIASES, axis=1)
    gpu = [t.detach().cuda().requires_grad_() for t in (x, y, b, g)]
    out_c, out_g = fn(x, y, b, g, ranges=R), fn(*gpu, ranges=R)
    assert out_g.is_cuda
    torch.testing.assert_close(out_g.cpu(), out_c.detach(), rtol=1e-9, atol=1e-11)
    for a, c in zip(torch.autograd.grad(out_g.sum(), gpu), torch.autograd.grad(out_c.sum(),
                                                                              (x, y, b, g))):
        assert a.is_cuda
        torch.testing.assert_close(a.cpu(), c, rtol=1e-9, atol=1e-11)
    xb, yb = torch.randn(3, 40, 3, dtype=torch.float64), torch.randn(3, 30, 3,
                                                                   dtype=torch.float64)
    knn = Genred("SqDist(x, y)", ALIASES[:2], reduction_op="ArgKMin", opt_arg=4, axis=1)
    torch.testing.assert_close(knn(xb.cuda(), yb.cuda()).cpu(), knn(xb, yb))
