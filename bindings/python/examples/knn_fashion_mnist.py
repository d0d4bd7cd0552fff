#!/usr/bin/env python3
"""k-nearest-neighbour classification of Fashion-MNIST with a symred ArgKMin reduction.

Reads the IDX files of Debian's dataset-fashion-mnist package (/usr/share/datasets/
fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz), finds the k nearest training
images of each test image (squared Euclidean distance on pixels scaled to [0, 1]) and
predicts the majority label.

    python3 knn_fashion_mnist.py --train 2000 --test 200 --k 10
"""

import argparse
import gzip
import os
import sys
import time

import numpy as np

try:
    from symred import Genred
except ImportError as e:
    sys.exit(f"knn_fashion_mnist: {e}")

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}


def read_idx(path, count):
    """The first `count` items of an IDX file (images as (count, rows*cols) uint8)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        header = f.read(4)
        if len(header) != 4 or header[0] != 0 or header[1] != 0 or header[2] != 0x08:
            raise ValueError(f"{path}: not an IDX file of unsigned bytes")
        ndim = header[3]
        dims = [int.from_bytes(f.read(4), "big") for _ in range(ndim)]
        count = min(count, dims[0])
        item = int(np.prod(dims[1:])) if ndim > 1 else 1
        data = np.frombuffer(f.read(count * item), dtype=np.uint8)
        if data.size != count * item:
            raise ValueError(f"{path}: truncated")
        return data.reshape(count, item) if ndim > 1 else data


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", type=int, default=2000, help="training images used (default 2000)")
    ap.add_argument("--test", type=int, default=200, help="test images classified (default 200)")
    ap.add_argument("--k", type=int, default=10, help="neighbours (default 10)")
    ap.add_argument("--data-dir", default=DEFAULT_DIR)
    ap.add_argument("--backend", default="auto")
    a = ap.parse_args(argv)
    if a.train < 1 or a.test < 1 or not 1 <= a.k <= a.train:
        ap.error("need --train >= 1, --test >= 1 and 1 <= --k <= --train")

    paths = {key: os.path.join(a.data_dir, name) for key, name in FILES.items()}
    missing = [p for p in paths.values() if not os.path.exists(p)]
    if missing:
        print(f"knn_fashion_mnist: Fashion-MNIST not found ({', '.join(missing)} missing).\n"
              f"Install it with `apt-get install dataset-fashion-mnist` or pass --data-dir.",
              file=sys.stderr)
        return 2

    xtr = read_idx(paths["train_images"], a.train).astype(np.float32) / 255.0
    ytr = read_idx(paths["train_labels"], a.train).astype(np.int64)
    xte = read_idx(paths["test_images"], a.test).astype(np.float32) / 255.0
    yte = read_idx(paths["test_labels"], a.test).astype(np.int64)
    d = xtr.shape[1]

    knn = Genred("SqDist(q, p)", [f"q = Vi({d})", f"p = Vj({d})"],
                 reduction_op="ArgKMin", axis=1, opt_arg=a.k)
    t0 = time.perf_counter()
    idx = knn(xte, xtr, backend=a.backend)  # (test, k) int64, nearest first
    elapsed = time.perf_counter() - t0

    votes = ytr[idx.reshape(len(xte), a.k)]
    counts = np.zeros((len(xte), 10), dtype=np.int64)
    np.add.at(counts, (np.arange(len(xte))[:, None], votes), 1)
    pred = counts.argmax(axis=1)
    acc = float((pred == yte).mean())
    print(f"kNN Fashion-MNIST: train={len(xtr)} test={len(xte)} k={a.k} dim={d}")
    print(f"accuracy: {acc:.4f}")
    print(f"time: {elapsed:.3f} s ({len(xtr) * len(xte) / max(elapsed, 1e-9) / 1e6:.1f} M pairs/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
