#!/usr/bin/env python3
"""Time per exact-GP training iteration in GPyTorch: symred.gpytorch's kernel against
GPyTorch + pykeops (gpytorch.kernels.keops) and GPyTorch's dense kernel, in one process.

The model is what a new user writes: ExactGP, ConstantMean, ScaleKernel(RBFKernel), Gaussian
likelihood, Adam (lr 0.1), float32, GPyTorch's defaults (conjugate gradients above
max_cholesky_size = 800). One iteration = zero_grad, -mll forward, backward, step. Each
backend gets a fresh model with the same data and initial hyperparameters, one untimed
warm-up iteration (pykeops and symred compile their kernels there), then --iters timed ones;
the median is reported with the ratios. A backend that fails (pykeops without a working
compiler, dense out of memory) is reported with its error and skipped.

    SYMRED_LIB=build/libsymred.so PYTHONPATH=bindings/python \\
        "$(scripts/pyenv.sh)/bin/python" bench/gpytorch_iter.py            # n = 20 000
    ... bench/gpytorch_iter.py --n 5000 --iters 2 --backends symred,dense

With SYMRED_BENCH_RECORD set, the figures are appended to that file as data (bench/record.py):
a row per backend with its median, its ratio to symred and its last loss, and the torch and
gpytorch versions, the thread settings and the load average after the run beside them.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import gpytorch

from record import Record  # bench/record.py, beside this file


def base_kernel(backend, dim):
    if backend == "symred":
        import symred.gpytorch as sg
        return sg.RBFKernel(ard_num_dims=dim)
    if backend == "pykeops":
        import pykeops  # noqa: F401  (gpytorch's keops kernels fall back to dense without it)
        return gpytorch.kernels.keops.RBFKernel(ard_num_dims=dim)
    return gpytorch.kernels.RBFKernel(ard_num_dims=dim)


class GP(gpytorch.models.ExactGP):
    def __init__(self, x, y, base):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(base)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x),
                                                         self.covar_module(x))


def time_backend(backend, x, y, iters, seed):
    model = GP(x, y, base_kernel(backend, x.shape[1]))
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    times, losses = [], []
    for it in range(iters + 1):
        torch.manual_seed(seed + it)  # the same probe vectors for every backend
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if it > 0:
            times.append(dt)
        print(f"  {backend:8s} iter {it}{' (warm-up)' if it == 0 else ''}: {dt:8.2f} s  "
              f"loss {loss.item():.5f}", flush=True)
    return {"median_s": statistics.median(times), "times_s": times,
            "losses": losses}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="training points (default 20000)")
    ap.add_argument("--dim", type=int, default=3, help="input dimension (default 3)")
    ap.add_argument("--iters", type=int, default=3, help="timed iterations (default 3)")
    ap.add_argument("--backends", default="symred,pykeops,dense")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rec = Record("gpytorch_iter", argv=None if argv is None else [sys.argv[0]] + list(argv))

    torch.manual_seed(args.seed)
    x = torch.rand(args.n, args.dim)
    y = torch.sin(6 * x).sum(-1) + 0.1 * torch.randn(args.n)
    load_before = os.getloadavg()
    print(f"exact GP training iteration, n = {args.n}, d = {args.dim}, float32, "
          f"{rec.data['cpu']}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"gpytorch {gpytorch.__version__}, load {load_before[0]:.2f}", flush=True)
    results = {}
    for backend in args.backends.split(","):
        try:
            results[backend] = time_backend(backend, x, y, args.iters, args.seed)
        except Exception as e:  # noqa: BLE001 - any failure of a peer is reported, not fatal
            results[backend] = {"error": f"{type(e).__name__}: {e}"[:500]}
            print(f"  {backend}: failed: {results[backend]['error']}", flush=True)
    print("median time per iteration:")
    for backend, r in results.items():
        print(f"  {backend:8s} " + (f"{r['median_s']:8.2f} s" if "median_s" in r
                                    else "failed"))
    ratios = {}
    if "median_s" in results.get("symred", {}):
        for peer in ("pykeops", "dense"):
            if "median_s" in results.get(peer, {}):
                ratios[f"{peer}/symred"] = results[peer]["median_s"] / results["symred"]["median_s"]
                print(f"  {peer} / symred = {ratios[f'{peer}/symred']:.2f}")
    for backend, r in results.items():
        if "median_s" in r:
            rec.row(backend=backend, n=args.n, d=args.dim, iters=args.iters,
                    median_s=round(r["median_s"], 3),
                    over_symred=round(ratios.get(f"{backend}/symred", 1.0 if backend == "symred"
                                                 else -1.0), 2),
                    last_loss=round(r["losses"][-1], 5))
        else:
            rec.row(backend=backend, n=args.n, d=args.dim, iters=args.iters, error=r["error"])
    rec.data["torch"] = torch.__version__
    rec.data["gpytorch"] = gpytorch.__version__
    rec.data["env"] = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY",
                                                      "SYMRED_NUM_THREADS", "SYMRED_DEVICE")}
    rec.data["load_after"] = [round(v, 2) for v in os.getloadavg()]
    rec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
