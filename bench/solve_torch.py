#!/usr/bin/python3
"""symred.torch's differentiable KernelSolve against torch.linalg.solve of the materialised
matrix, in this process on the same data: a = (alpha I + K)^-1 b and the backward of a.sum()
(dL/dx and dL/db), K the Gaussian kernel exp(-2 |x_i - x_j|^2) of uniform points in [0, 1]^2,
alpha = 0.5, 3 right-hand sides, float64, eps = 1e-8. Prints both times (forward + backward;
the dense one includes building the matrix), their ratio, and the largest differences of a
and of dL/dx. Median of 3 runs each, alternated. With SYMRED_BENCH_RECORD set, the figures are
appended to that file as data (bench/record.py).

    SYMRED_LIB=build/libsymred.so PYTHONPATH=bindings/python python3 bench/solve_torch.py [n]
"""

import statistics
import sys
import time

import torch

from symred.torch import KernelSolve

from record import Record  # bench/record.py, beside this file


def main(n):
    rec = Record("solve_torch")
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(n, 2, dtype=torch.float64, generator=gen).requires_grad_()
    b = torch.rand(n, 3, dtype=torch.float64, generator=gen).requires_grad_()
    g = torch.tensor([2.0], dtype=torch.float64)
    Kinv = KernelSolve("Exp(-g * SqDist(x, y)) * b",
                       ["x = Vi(2)", "y = Vj(2)", "b = Vj(3)", "g = Pm(1)"], "b", axis=1)

    def symred_run():
        return Kinv(x, x, b, g, alpha=0.5, eps=1e-8)

    def dense_run():
        A = torch.exp(-g * ((x[:, None] - x[None]) ** 2).sum(-1))
        return torch.linalg.solve(A + 0.5 * torch.eye(n, dtype=x.dtype), b)

    def timed(fn):
        x.grad = b.grad = None
        t = time.perf_counter()
        a = fn()
        a.sum().backward()
        return time.perf_counter() - t, a.detach(), x.grad.clone()

    timed(symred_run)  # compiles the kernels (cached afterwards)
    ts, td = [], []
    for _ in range(3):
        t, a_s, gx_s = timed(symred_run)
        ts.append(t)
        t, a_d, gx_d = timed(dense_run)
        td.append(t)
    s, d = statistics.median(ts), statistics.median(td)
    da = float((a_s - a_d).abs().max())
    dgx = float((gx_s - gx_d).abs().max() / gx_d.abs().max())
    print(f"n = {n}: symred.torch KernelSolve forward + backward {s * 1e3:.0f} ms, dense "
          f"torch.linalg.solve {d * 1e3:.0f} ms, dense / symred = {d / s:.1f}; "
          f"max |a - dense| = {da:.1e}, max |dL/dx - dense| / max "
          f"|dL/dx| = {dgx:.1e} "
          f"(torch threads: {torch.get_num_threads()})")
    rec.row(n=n, symred_ms=round(s * 1e3, 1), dense_ms=round(d * 1e3, 1),
            dense_over_symred=round(d / s, 2), max_diff_a=float(f"{da:.1e}"),
            rel_diff_grad_x=float(f"{dgx:.1e}"), torch_threads=torch.get_num_threads())
    rec.data["torch"] = torch.__version__
    rec.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4000)
