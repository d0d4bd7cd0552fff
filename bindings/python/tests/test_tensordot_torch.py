"""TensorDot's derivative through symred.torch: pykeops' test_TensorDot_with_permute, gradients
against torch.tensordot's autograd."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed")

from symred.torch import LazyTensor  # noqa: E402


@pytest.mark.parametrize("case", [
    # (dims of x, dims of y, contracted axes of x, of y, permute): the pykeops case, and one
    # small enough for the JIT's unrolled TensorDot
    ((2, 3, 2, 2, 4), (2, 4, 2, 3, 2, 3), (4, 0, 2), (1, 4, 2), (4, 3, 2, 0, 1)),
    ((2, 3), (3, 2), (1,), (0,), (1, 0)),
])
def test_tensordot_gradients_match_torch(case):
    da, db, ca, cb, perm = case
    M, N = 4, 5
    gen = torch.Generator().manual_seed(3)
    x = torch.randn((M,) + da, dtype=torch.float64, generator=gen, requires_grad=True)
    y = torch.randn((N,) + db, dtype=torch.float64, generator=gen, requires_grad=True)
    # dense: out[i] = sum_j tensordot(x_i, y_j) with kept axis k at position perm[k]
    t = torch.tensordot(x, y, dims=([c + 1 for c in ca], [c + 1 for c in cb]))
    nka = len(da) - len(ca)
    # t has axes (i, kept of x..., j, kept of y...): sum j, then permute the kept axes
    t = t.sum(1 + nka)
    inv = np.argsort(perm)
    want = t.permute((0,) + tuple(int(k) + 1 for k in inv)).reshape(M, -1)
    X = LazyTensor(x.reshape(M, 1, -1))
    Y = LazyTensor(y.reshape(1, N, -1))
    got = X.keops_tensordot(Y, da, db, ca, cb, perm).sum(dim=1)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    e = torch.randn(want.shape, dtype=torch.float64, generator=gen)
    gx, gy = torch.autograd.grad(got, (x, y), e)
    wx, wy = torch.autograd.grad(want, (x, y), e)
    torch.testing.assert_close(gx, wx, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(gy, wy, rtol=1e-10, atol=1e-10)
