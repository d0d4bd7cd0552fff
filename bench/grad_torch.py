#!/usr/bin/python3
"""Backward over forward of the Gaussian mat-vec through symred.torch.

out_i = sum_j exp(-g |x_i - y_j|^2) b_j, D = 3, float32, N = M = 40000 by default; the
backward is the gradient with respect to x (one gradient kernel, a Sum over j). Both passes
run in this process on the same data; the figure is the ratio of their median times
(the goal: at most 1.3). pykeops.torch is put beside when it
imports (never required; not installed by deps.sh; e.g. a venv with --system-site-packages
and `pip install pykeops`), with the ratios symred/pykeops of each pass. With
SYMRED_BENCH_RECORD set, the figures are appended to that file as data (bench/record.py).

    SYMRED_LIB=build/libsymred.so PYTHONPATH=bindings/python python3 bench/grad_torch.py
"""

import argparse
import os
import statistics
import sys
import time

# torch sets OpenMP's thread count to its intra-op count (1 on the 2-core dev VM) at import;
# symred.torch restores its own for its kernels, pykeops does not. Every library here gets
# all the CPUs of the process unless OMP_NUM_THREADS says otherwise.
os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))

import torch  # noqa: E402

from symred.torch import Genred  # noqa: E402

from record import Record  # noqa: E402  (bench/record.py, beside this file)


def median_time(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(rec, name, K, x, y, b, g, reps):
    G = torch.ones(x.shape[0], 1, dtype=x.dtype)

    def forward():
        with torch.no_grad():
            K(x, y, b, g)

    out = K(x, y, b, g)  # warm-up: compiles the forward kernel
    torch.autograd.grad(out, x, G)  # and the gradient kernel
    t_fwd = median_time(forward, reps)
    outs = [K(x, y, b, g) for _ in range(reps)]  # graphs to run the backward of, untimed
    it = iter(outs)
    t_bwd = median_time(lambda: torch.autograd.grad(next(it), x, G), reps)
    pairs = x.shape[0] * y.shape[0]
    print(f"{name:16s} forward {t_fwd * 1e3:8.1f} ms ({pairs / t_fwd / 1e9:5.2f} G pairs/s)   "
          f"backward (d/dx) {t_bwd * 1e3:8.1f} ms   backward/forward {t_bwd / t_fwd:5.2f}")
    rec.row(library=name, n=x.shape[0], reps=reps, forward_ms=round(t_fwd * 1e3, 2),
            gpairs_per_s=round(pairs / t_fwd / 1e9, 3), backward_ms=round(t_bwd * 1e3, 2),
            backward_over_forward=round(t_bwd / t_fwd, 3))
    return t_fwd, t_bwd


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=40000, help="N = M (default 40000)")
    ap.add_argument("--reps", type=int, default=5, help="timed runs of each pass (default 5)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(a.n, 3, generator=gen).requires_grad_()
    y = torch.rand(a.n, 3, generator=gen)
    b = torch.randn(a.n, 1, generator=gen)
    g = torch.tensor([2.0])
    formula = "Exp(-g * SqDist(x, y)) * b"
    aliases = ["x = Vi(3)", "y = Vj(3)", "b = Vj(1)", "g = Pm(1)"]
    rec = Record("grad_torch")
    print(f"Gaussian mat-vec, D=3, float32, N=M={a.n}, median of {a.reps} runs, "
          f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    ours = measure(rec, "symred.torch", Genred(formula, aliases, reduction_op="Sum", axis=1),
                   x, y, b, g, a.reps)
    try:
        from pykeops.torch import Genred as KGenred
    except ImportError:
        print("pykeops.torch: not installed (optional; see bench/README.md)")
    else:
        theirs = measure(rec, "pykeops.torch",
                         KGenred(formula, aliases, reduction_op="Sum", axis=1), x, y, b, g, a.reps)
        print(f"symred.torch is {theirs[0] / ours[0]:.1f}x pykeops.torch on the forward, "
              f"{theirs[1] / ours[1]:.1f}x on the backward")
        rec.data["pykeops"] = getattr(sys.modules.get("pykeops"), "__version__", "unknown")
    rec.data["torch"] = torch.__version__
    rec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
