#!/usr/bin/env python3
"""Exact GP regression in GPyTorch with symred's kernels (symred.gpytorch).

An ExactGP with ScaleKernel(symred.gpytorch.<kernel>) is trained by Adam on the exact
marginal likelihood, then predicts at test points and prints the RMSE against the noise-free
function. GPyTorch runs conjugate gradients (above max_cholesky_size) and every kernel-matrix
product is a symred reduction: the n x n matrix is never built, so n = 100 000 runs in
O(n) memory (GPyTorch's dense kernel would need n^2 * 4 bytes = 40 GB in float32).

    python gpytorch_exact.py                          # n = 2000, a few seconds
    python gpytorch_exact.py --n 100000 --iters 10    # the large case (minutes on 2 cores)
    python gpytorch_exact.py --kernel matern --nu 1.5
"""

import argparse
import sys
import time

try:
    import torch
    import gpytorch
    import symred.gpytorch as sg
except ImportError as e:  # torch, gpytorch or symred missing: say so plainly
    sys.exit(f"gpytorch_exact: {e}")


def truth(x):
    return torch.sin(3.0 * x).sum(-1) + 0.5 * torch.cos(5.0 * x[:, 0])


class ExactGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, likelihood, base):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(base)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x),
                                                         self.covar_module(x))


def make_kernel(name, dim, nu):
    if name == "rbf":
        return sg.RBFKernel(ard_num_dims=dim)
    if name == "matern":
        return sg.MaternKernel(nu=nu, ard_num_dims=dim)
    return sg.PeriodicKernel(ard_num_dims=dim)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="training points (default 2000)")
    ap.add_argument("--ntest", type=int, default=500, help="test points (default 500)")
    ap.add_argument("--dim", type=int, default=2, help="input dimension (default 2)")
    ap.add_argument("--iters", type=int, default=10, help="Adam steps (default 10)")
    ap.add_argument("--kernel", choices=["rbf", "matern", "periodic"], default="rbf")
    ap.add_argument("--nu", type=float, default=2.5, help="Matern smoothness (0.5, 1.5, 2.5)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    torch.manual_seed(args.seed)
    x = torch.rand(args.n, args.dim)
    y = truth(x) + 0.1 * torch.randn(args.n)
    xt = torch.rand(args.ntest, args.dim)

    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = ExactGP(x, y, likelihood, make_kernel(args.kernel, args.dim, args.nu))
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    print(f"exact GP, n = {args.n}, d = {args.dim}, kernel = {args.kernel}, float32")
    model.train()
    for it in range(args.iters):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        opt.step()
        print(f"iter {it + 1:3d}  loss {loss.item():.4f}  noise "
              f"{likelihood.noise.item():.4f}  {time.perf_counter() - t0:.2f} s", flush=True)

    model.eval()
    t0 = time.perf_counter()
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        mean = likelihood(model(xt)).mean
    rmse = float((mean - truth(xt)).square().mean().sqrt())
    print(f"prediction at {args.ntest} points: {time.perf_counter() - t0:.2f} s, RMSE against "
          f"the noise-free function {rmse:.4f} (noise sd 0.1)")
    return 0 if rmse < 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
