#!/usr/bin/python3
"""Exact kNN: symred against FAISS IndexFlatL2, on Fashion-MNIST or on random data.

Both run in this one process on the same float32 arrays: 60000 training images (the points) and
10000 test images (the queries), D = 784 (pixels / 255), k = 10. Prints both times, the ratio,
and checks that the neighbour sets agree up to exact ties (a pair of sets that differ must
differ only in points at the same distance as the k-th neighbour, distances recomputed in
float64).

    SYMRED_LIB=build/libsymred.so /usr/bin/python3 bench/knn_faiss.py [--train N] [--test M]
    SYMRED_LIB=build/libsymred.so /usr/bin/python3 bench/knn_faiss.py --random 100000,1000000 \
        --dims 3,10,100      # uniform random points and queries in [0,1)^D, every (n, D)
    SYMRED_LIB=build/libsymred.so /usr/bin/python3 bench/knn_faiss.py \
        --scaling 2500,5000,10000,20000,40000,60000 --test 2000
                             # time against N (the first N training images), with PyTorch's
                             # dense distances + topk as a third column (bench/plots.py draws it)

Needs Debian's dataset-fashion-mnist and python3-faiss. FAISS uses the system BLAS
(libblas.so.3); its threads are FAISS's OpenMP threads and that BLAS's own, as installed.
"""
import argparse
import gzip
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings",
                                "python"))
from symred import Genred  # noqa: E402

from record import Record  # noqa: E402  (bench/record.py, beside this file)

DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path, count):
    with gzip.open(path, "rb") as f:
        header = f.read(4)
        dims = [int.from_bytes(f.read(4), "big") for _ in range(header[3])]
        count = min(count, dims[0])
        item = int(np.prod(dims[1:]))
        return np.frombuffer(f.read(count * item), dtype=np.uint8).reshape(count, item)


def compare(name, xtr, xte, k, reps, faiss, rec):
    """Times symred's ArgKMin of SqDist and FAISS IndexFlatL2 on the same arrays, prints both,
    the ratio, and the neighbour-set check. Returns the number of sets that differ by more than
    exact ties."""
    n, d = xtr.shape
    m = xte.shape[0]
    print(f"{name}: {n} points x {m} queries, D = {d}, k = {k}, float32")
    knn = Genred("SqDist(q, p)", [f"q = Vi({d})", f"p = Vj({d})"], reduction_op="ArgKMin",
                 axis=1, opt_arg=k)
    t0 = time.perf_counter()
    knn(xte[:8], xtr[:64])  # compiles (or loads from the cache) the kernel: not timed
    t_first = time.perf_counter() - t0
    strategy = knn.plan(backend="CPU")["inner"]
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        idx_s = knn(xte, xtr).reshape(m, k)
        ts.append(time.perf_counter() - t0)
    t_s = min(ts)

    index = faiss.IndexFlatL2(d)
    index.add(xtr)
    tf = []
    for _ in range(reps):
        t0 = time.perf_counter()
        _, idx_f = index.search(xte, k)
        tf.append(time.perf_counter() - t0)
    t_f = min(tf)

    # Neighbour sets, up to exact ties at the k-th distance.
    xtr64, xte64 = xtr.astype(np.float64), xte.astype(np.float64)
    differ = tie_only = 0
    for q in range(m):
        s, f = set(idx_s[q].tolist()), set(idx_f[q].tolist())
        if s == f:
            continue
        differ += 1
        ds = np.sort(((xtr64[idx_s[q]] - xte64[q]) ** 2).sum(1))
        df = np.sort(((xtr64[idx_f[q]] - xte64[q]) ** 2).sum(1))
        # Same multiset of distances (to float32 rounding): the sets differ only by ties.
        if np.allclose(ds, df, rtol=1e-5, atol=1e-5):
            tie_only += 1
    real = differ - tie_only
    print(f"symred ({strategy}): {t_s:.3f} s ({2.0 * n * m * d / t_s / 1e9:.1f} GFLOP/s "
          f"equivalent; first call on a tiny input {t_first * 1e3:.0f} ms)")
    print(f"FAISS IndexFlatL2 ({faiss.omp_get_max_threads()} OpenMP threads): {t_f:.3f} s")
    print(f"speedup symred / FAISS: {t_f / t_s:.2f}x")
    print(f"neighbour sets: {m - differ} identical, {tie_only} differ only by exact ties, "
          f"{real} differ otherwise")
    rec.row(data=name, n=n, m=m, D=d, k=k, strategy=strategy, symred_s=round(t_s, 4),
            faiss_s=round(t_f, 4), faiss_over_symred=round(t_f / t_s, 3), identical=m - differ,
            ties_only=tie_only, other=real, faiss_threads=faiss.omp_get_max_threads())
    return real


def torch_topk(xtr, xte, k, reps):
    """Best time of the dense kNN a PyTorch user writes: the m x n matrix of squared distances
    (norms + one matrix product) and topk; None when torch does not import."""
    try:
        import torch
    except ImportError:
        return None
    # torch's import sets OpenMP's thread count to its intra-op count: every library here
    # gets all the CPUs.
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    p, q = torch.from_numpy(xtr), torch.from_numpy(xte)
    best = None
    for _ in range(reps):
        t0 = time.perf_counter()
        d2 = (q * q).sum(1, keepdim=True) + (p * p).sum(1) - 2.0 * (q @ p.T)
        d2.topk(k, dim=1, largest=False)
        t = time.perf_counter() - t0
        best = t if best is None else min(best, t)
    return best


def scaling(a, faiss, rec):
    """kNN time against N on the first N Fashion-MNIST training images, a.test queries:
    symred, FAISS IndexFlatL2 and torch's dense distances + topk at every N."""
    ns = [int(v) for v in a.scaling.split(",")]
    xtr_all = np.ascontiguousarray(read_idx(os.path.join(DIR, "train-images-idx3-ubyte.gz"),
                                            max(ns)).astype(np.float32) / 255.0)
    xte = np.ascontiguousarray(read_idx(os.path.join(DIR, "t10k-images-idx3-ubyte.gz"),
                                        a.test).astype(np.float32) / 255.0)
    bad = 0
    for n in ns:
        xtr = np.ascontiguousarray(xtr_all[:n])
        bad += compare("Fashion-MNIST exact kNN", xtr, xte, a.k, a.reps, faiss, rec)
        t_t = torch_topk(xtr, xte, a.k, a.reps)
        if t_t is not None:
            print(f"torch dense distances + topk: {t_t:.3f} s")
            rec.data["rows"][-1]["torch_topk_s"] = round(t_t, 4)
        print()
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", type=int, default=60000)
    ap.add_argument("--test", type=int, default=10000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--reps", type=int, default=1, help="runs of each; the best is reported")
    ap.add_argument("--random", help="comma-separated point counts: random data instead")
    ap.add_argument("--dims", default="3,10,100", help="with --random: comma-separated D")
    ap.add_argument("--scaling", help="comma-separated N: Fashion-MNIST's first N images, "
                    "with torch's dense topk beside FAISS")
    a = ap.parse_args()
    try:
        import faiss
    except ImportError:
        sys.exit("knn_faiss: python3-faiss is not installed (apt-get install python3-faiss)")
    rec = Record("knn_faiss")
    if a.scaling:
        bad = scaling(a, faiss, rec)
        rec.close()
        return 0 if bad == 0 else 1
    if a.random:
        rng = np.random.default_rng(0)
        bad = 0
        for n in [int(v) for v in a.random.split(",")]:
            for d in [int(v) for v in a.dims.split(",")]:
                xtr = rng.random((n, d), dtype=np.float32)
                xte = rng.random((a.test, d), dtype=np.float32)
                bad += compare("random uniform kNN", xtr, xte, a.k, a.reps, faiss, rec)
                print()
        rec.close()
        return 0 if bad == 0 else 1
    xtr = np.ascontiguousarray(read_idx(os.path.join(DIR, "train-images-idx3-ubyte.gz"),
                                        a.train).astype(np.float32) / 255.0)
    xte = np.ascontiguousarray(read_idx(os.path.join(DIR, "t10k-images-idx3-ubyte.gz"),
                                        a.test).astype(np.float32) / 255.0)
    real = compare("Fashion-MNIST exact kNN", xtr, xte, a.k, a.reps, faiss, rec)
    rec.close()
    return 0 if real == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
