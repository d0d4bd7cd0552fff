#!/usr/bin/env python3
"""symred's CUDA backend beside PyTorch on the same GPU, in one process.

Cases (float32): the Gaussian mat-vec sum_j exp(-g |x_i - y_j|^2) b_j at D = 3 with N = M, and
exact kNN (k = 10) of 1e6 queries among 1e4 points at D = 3 and 100. PyTorch runs what a user
would write: the dense kernel matrix (or distance matrix) in row chunks that fit in about 2 GB,
then `@ b` (or `topk`), with its inputs already on the GPU; symred is called through its NumPy
binding with host arrays (so its times include copying the inputs in and the results out).
Both are checked against each other (relative error of the mat-vec; agreement of the kNN
index sets up to float32 ties, counted). Prints one line per case with the ratio
torch / symred, and writes JSON with --json. With SYMRED_BENCH_RECORD set, the figures are
appended to that file as data (bench/record.py), with the GPU's name.

    SYMRED_LIB=path/to/libsymred.so python3 bench/gpu_torch.py [--max N] [--json FILE]

Needs a CUDA GPU and torch with CUDA; says so and exits 0 without them.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings",
                                "python"))
from symred import Genred  # noqa: E402

from record import Record  # noqa: E402  (bench/record.py, beside this file)

CHUNK_BYTES = 2 << 30


def best_of(fn, reps):
    best = None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        t = time.perf_counter() - t0
        best = t if best is None or t < best else best
    return best, out


def torch_gauss(torch, x, y, b, g):
    n, m = x.shape[0], y.shape[0]
    rows = max(1, CHUNK_BYTES // (4 * m))
    out = torch.empty(n, 1, device=x.device, dtype=x.dtype)
    yy = (y * y).sum(1)
    for i in range(0, n, rows):
        xc = x[i:i + rows]
        d2 = (xc * xc).sum(1, keepdim=True) + yy - 2.0 * xc @ y.T
        out[i:i + rows] = torch.exp(-g * d2.clamp_min_(0)) @ b
    torch.cuda.synchronize()
    return out


def torch_knn(torch, q, p, k):
    n, m = q.shape[0], p.shape[0]
    rows = max(1, CHUNK_BYTES // (4 * m))
    idx = torch.empty(n, k, device=q.device, dtype=torch.int64)
    pp = (p * p).sum(1)
    for i in range(0, n, rows):
        qc = q[i:i + rows]
        d2 = (qc * qc).sum(1, keepdim=True) + pp - 2.0 * qc @ p.T
        idx[i:i + rows] = torch.topk(d2, k, dim=1, largest=False).indices
    torch.cuda.synchronize()
    return idx


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max", type=int, default=1000000, help="largest N of the mat-vec")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("gpu_torch: no torch, nothing to compare")
        return 0
    if not torch.cuda.is_available():
        print("gpu_torch: no CUDA GPU, nothing to compare")
        return 0
    rec = Record("gpu_torch")
    dev = torch.device("cuda")
    print(f"gpu_torch: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    torch.backends.cuda.matmul.allow_tf32 = False  # exact float32 products, as symred
    rng = np.random.default_rng(0)
    results = []

    gauss = Genred("Exp(-SqDist(x,y)*g)*b", ["x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"],
                   reduction_op="Sum", axis=1)
    for n in [10**5, 10**6, 10**7]:
        if n > a.max:
            break
        x = rng.random((n, 3), dtype=np.float32)
        y = rng.random((n, 3), dtype=np.float32)
        b = rng.standard_normal((n, 1), dtype=np.float32)
        g = np.array([2.0], dtype=np.float32)
        gauss(x[:10], y[:10], b[:10], g, backend="GPU")  # compile, load
        reps = 3 if n <= 10**6 else 1
        ts, out_s = best_of(lambda: gauss(x, y, b, g, backend="GPU"), reps)
        xt, yt, bt = (torch.from_numpy(v).to(dev) for v in (x, y, b))
        torch_gauss(torch, xt[:1000], yt, bt, 2.0)  # warm-up
        tt, out_t = best_of(lambda: torch_gauss(torch, xt, yt, bt, 2.0), 1 if n > 10**5 else 3)
        out_t = out_t.cpu().numpy()
        err = float(np.max(np.abs(out_s - out_t)) / np.max(np.abs(out_t)))
        print(f"gauss D=3 N=M={n}: symred {ts:.4f} s, torch {tt:.4f} s, torch/symred "
              f"{tt / ts:.2f}, max rel. difference {err:.1e}")
        results.append({"case": "gauss", "N": n, "symred_s": ts, "torch_s": tt, "rel_diff": err})
        rec.row(table="gauss", N=n, symred_s=round(ts, 4), torch_s=round(tt, 4),
                torch_over_symred=round(tt / ts, 2), rel_diff=float(f"{err:.1e}"))

    nq, npnt, k = 10**6, 10**4, 10
    for d in [3, 100]:
        q = rng.random((nq, d), dtype=np.float32)
        p = rng.random((npnt, d), dtype=np.float32)
        knn = Genred("SqDist(x,y)", [f"x=Vi({d})", f"y=Vj({d})"], reduction_op="ArgKMin",
                     axis=1, opt_arg=k)
        knn(q[:10], p, backend="GPU")
        ts, idx_s = best_of(lambda: knn(q, p, backend="GPU"), 3)
        qt, pt = torch.from_numpy(q).to(dev), torch.from_numpy(p).to(dev)
        torch_knn(torch, qt[:1000], pt, k)
        tt, idx_t = best_of(lambda: torch_knn(torch, qt, pt, k), 3)
        idx_t = idx_t.cpu().numpy()
        same = np.mean([len(set(idx_s[i]) & set(idx_t[i])) / k for i in range(0, nq, 997)])
        print(f"knn k={k} D={d} nq={nq} np={npnt}: symred {ts:.4f} s, torch {tt:.4f} s, "
              f"torch/symred {tt / ts:.2f}, neighbour sets agree {same:.4f} (sampled)")
        results.append({"case": "knn", "D": d, "symred_s": ts, "torch_s": tt, "agree": same})
        rec.row(table="knn", k=k, D=d, nq=nq, np=npnt, symred_s=round(ts, 4),
                torch_s=round(tt, 4), torch_over_symred=round(tt / ts, 2),
                agree=round(float(same), 4))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "cases": results}, f, indent=1)
    rec.data["gpu"] = torch.cuda.get_device_name(0)
    rec.data["torch"] = torch.__version__
    rec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
