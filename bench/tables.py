#!/usr/bin/env python3
"""Writes docs/benchmarks.md from the recorded benchmark runs in bench/records/*.jsonl.

Each line of a records file is one run, as bench/record.h and bench/record.py write it. For
every benchmark the page shows the newest run of each command on each CPU model: the commit, the
date, the machine, the load average when it started, the command, and the rows as a table. When
the library (src/, include/) has changed since a run's commit, the table says by how many
commits, so an old figure is never read as the current one. The scaling plots that
bench/plots.py draws from the same records (docs/scaling-*.png) are shown with their benchmark.

    /usr/bin/python3 bench/plots.py    # redraws docs/scaling-*.png (matplotlib)
    python3 bench/tables.py            # rewrites docs/benchmarks.md
"""

import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "benchmarks.md")

# What each benchmark measures, and against which baseline in the same run.
ABOUT = {
    "bench-gauss": "The low-dimensional direct path, D = 3, N = M: the CPU JIT against two "
                   "hand-written OpenMP + `omp simd` loops of the same jobs in the same process: "
                   "bench/handloop.c compiled with the JIT's flags (`*_over_hand`) and the "
                   "stronger bench/handloop-fast.c (y copied to structure-of-arrays columns "
                   "in each call, `-ffast-math`, glibc's vector exponentials; `*_over_fast`, "
                   "the yardstick): the Gaussian mat-vec `Exp(-SqDist(x,y)*g)*b` in float32 "
                   "(symred_over_*) and float64 (f64_over_*), LogSumExp of `-SqDist(x,y)*g` and "
                   "ArgKMin (K = 10) of `SqDist(x,y)` in float32; ratios are loop time / symred "
                   "time (above 1: symred faster), median of alternating rounds (older rows: no "
                   "fast-math loop; the oldest, best times, float32 mat-vec only); cold first "
                   "call (empty cache) and warm creation (disk cache).",
    "bench-tier0": "The tile interpreter (tier 0, [tiers.md](tiers.md)) against the compiled "
                   "kernel (`SYMRED_JIT=sync`) and the reference interpreter on the same jobs in "
                   "one process, float32: the Gaussian mat-vec and its LogSumExp at D = 3, "
                   "ArgKMin (K = 10) at D = 16, kNN at D = 784 (the compiled kernel on the "
                   "gemm-epilogue); `*_t0_over_jit` and `*_t0_over_ref` are speed ratios (tier 0's "
                   "pairs per second over theirs, best of the reps). A new formula's first call "
                   "at N = M = 1000 with an empty cache, async (the default) and sync; ten calls "
                   "at N = M = 40 000 from creation in async mode over ten calls of the compiled "
                   "kernel (target <= 1.15).",
    "bench-budget": "A float64 Gaussian mat-vec at a size whose kernel matrix could never be held, "
                    "under a memory budget (`sr_ctx_set_mem_limit`): time, kernel workspace and "
                    "peak resident set size, rows checked against a double loop.",
    "bench-eval-block": "`sr_kernel_eval_block` (the SGPR benchmark's blocks) on the reference "
                        "interpreter against the JIT's generated block in ns per value, beside "
                        "the same kernel's Sum reduction in ns per pair and the module's cold "
                        "compile time.",
    "bench-half": "The Gaussian mat-vec `Exp(-SqDist(x,y)*g)*b`, D = 3, N = M, in bfloat16 and "
                  "float16 against float32 on the same values, the three in turn in one process; "
                  "ratios are times over float32's (below 1: faster).",
    "bench-grad": "The Gaussian mat-vec's gradient kernels (`sr_kernel_grad`) with respect to x "
                  "and y over the forward pass, the three interleaved in one process.",
    "bench-gemm": "`matvec`: the Gaussian mat-vec through the inner product on the direct path, "
                  "symred's AVX-512 gemm-epilogue and BLIS, over D; `knn`: ArgKMin k = 10 on "
                  "random data, direct against gemm; `fashion-mnist`: kNN on Fashion-MNIST with "
                  "each gemm kernel as a fraction of the FMA peak measured around each run.",
    "bench-simplify": "What the simplifier buys: `spellings` times naive spellings (e.g. "
                      "`Sum(Square(x-y))`) against symred's canonical ops (`SqDist`) in the same "
                      "process, target ratio <= 1.15; `hoisting` times an i-only factor with "
                      "`SYMRED_SIMPLIFY=0` against the simplifier moving it out of the reduction.",
    "bench_sharding": "symred.jax_sharding's overhead ([scale-out.md](scale-out.md)): the "
                      "Gaussian mat-vec (D = 3, float32, N = M) on one JAX host device against "
                      "the same total work on host devices sharing the same cores, the reduced "
                      "rows sharded (psum), both sides sharded (ppermute ring), and a plain "
                      "`jax.jit` on x sharded by rows over an Auto mesh (custom_partitioning); "
                      "ratio = time "
                      "over one device's, best of the alternating calls (target <= 1.3).",
    "bench_wide": "Wide outputs on the fused two-product strategy ([wide.md](wide.md)): `matvec` "
                  "is `Exp(-SqDist(x,y)*g)*b` with B of R columns against the dense `K @ B` with "
                  "K prebuilt (torch, MKL); `attention` is `SumSoftMaxWeight((q|k)*s, v)` against "
                  "`torch.nn.functional.scaled_dot_product_attention`; `attn_grad` is the same "
                  "attention's backward (q, k, v together, symred.torch) over symred's forward "
                  "(target <= 3), with PyTorch's backward / forward beside it. Times are the best "
                  "of the alternating rounds; ratio = symred / baseline time, the median over the "
                  "rounds of each round's pair (ratio_best: of the best times; records before "
                  "that column give the ratio of the best times).",
    "exp_underflow": "Narrow against wide Gaussians (Sum and LogSumExp, float32 and float64): "
                     "the time at c = 200 and 5000, where most exponents underflow, over the time "
                     "at c = 0.5 (over_wide), in one process.",
    "gpu_torch": "symred's CUDA backend (through its NumPy binding, host arrays) against PyTorch "
                 "on the same GPU: the chunked dense Gaussian mat-vec and `topk` kNN, "
                 "torch_over_symred = torch / symred time.",
    "gpytorch_iter": "Time per exact-GP training iteration in GPyTorch (ScaleKernel(RBFKernel), "
                     "Adam): symred.gpytorch against gpytorch.kernels.keops and GPyTorch's dense "
                     "kernel in one process; over_symred = backend / symred median.",
    "grad_torch": "The Gaussian mat-vec's backward (d/dx) over its forward through symred.torch, "
                  "and pykeops.torch beside it when it imports, median times in one process.",
    "jax-matvec": "symred.jax ([jax.md](jax.md)) inside `jax.jit` against symred called from "
                  "NumPy and against the same function in jax.numpy; its gradient through "
                  "`jax.grad` against symred.torch's.",
    "knn_faiss": "Exact kNN (ArgKMin of SqDist) against FAISS `IndexFlatL2` in the same script, "
                 "the neighbour sets compared; `--scaling` runs Fashion-MNIST's first N images "
                 "at several N with PyTorch's dense distances + `topk` as a third column.",
    "matvec_scaling": "Gaussian mat-vec `Exp(-g*SqDist(x,y))*b`, D = 3, float32, N = M, time "
                      "against N in one process: symred, NumPy (the kernel matrix in blocks of "
                      "1024 rows), torch dense (the whole matrix, while it fits in 1 GiB) and "
                      "pykeops on the CPU; a library whose next point would pass 10 s is "
                      "skipped from there (—).",
    "mpi-scaling": "Strong scaling of symred_mpi on one machine: 1 rank against 2 ranks (one "
                   "thread each) and 1 rank with 2 threads, the fastest of 2 alternated runs "
                   "each; efficiency = speedup / 2, wait = the 2-rank run's time waiting for the "
                   "ring.",
    "ranges_numpy": "Block-sparse ranges against the dense Gaussian convolution on clustered "
                    "points, with the dense run at bandwidth 1 as a second yardstick, the "
                    "fraction of pairs kept, the time to build the ranges and the truncation "
                    "error.",
    "solve_numpy": "`LazyTensor.solve` (conjugate gradients on symred mat-vecs) against "
                   "`numpy.linalg.solve` of the materialised matrix (building it included), "
                   "float64, 3 right-hand sides.",
    "solve_torch": "symred.torch's differentiable `KernelSolve`, forward + backward, against "
                   "`torch.linalg.solve` of the materialised matrix, median of 3 alternated runs.",
}


def git(*args):
    try:
        return subprocess.run(["git", "-C", ROOT] + list(args), capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def library_commits_since(commit):
    base = commit.replace("-dirty", "")
    if not base or base == "unknown":
        return None
    out = git("rev-list", "--count", f"{base}..HEAD", "--", "src", "include")
    return int(out) if out.isdigit() else None


def fmt(v):
    if isinstance(v, float):
        if v < 0:
            return "—"
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def load_records():
    runs = []
    for path in sorted(glob.glob(os.path.join(ROOT, "bench", "records", "*.jsonl"))):
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        runs.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        sys.exit(f"{path}:{n}: not a JSON record: {e}")
    return runs


def plot_lines(bench, runs):
    """Markdown for the scaling plots (bench/plots.py) drawn from this benchmark's runs: the
    image and a caption naming the run it shows, for each PNG that exists under docs/."""
    from plots import PLOTS, caption, newest  # bench/plots.py; needs no matplotlib here
    lines = []
    for plot in PLOTS:
        run = newest(runs, plot)
        if plot["bench"] == bench and run and os.path.exists(os.path.join(ROOT, "docs",
                                                                          plot["file"])):
            lines += [f"![{plot['title'].split(',')[0]} against N]({plot['file']})", "",
                      f"*The plot (bench/plots.py) shows `{run['command']}`: {caption(run)}. "
                      "Times are best-of-run wall-clock times on a machine other jobs may "
                      "have shared: compare the curves of one run, not runs.*", ""]
    return lines


def render(runs):
    lines = ["# Benchmarks", "",
             "Generated by `python3 bench/tables.py` from the recorded runs in "
             "[bench/records/](../bench/records/); do not edit by hand. Every figure is a run on "
             "the machine named with it, with the baseline measured in the same process or "
             "script; how to run each benchmark and record a run: [bench/README.md]"
             "(../bench/README.md); the plots are drawn from the same records by "
             "`bench/plots.py`.", ""]
    by_bench = {}
    for r in runs:
        by_bench.setdefault(r["bench"], []).append(r)
    for bench in sorted(by_bench):
        lines += [f"## {bench}", ""]
        if bench in ABOUT:
            lines += [ABOUT[bench], ""]
        lines += plot_lines(bench, by_bench[bench])
        newest = {}
        for r in by_bench[bench]:
            key = (r["cpu"], r["command"])
            if key not in newest or r["date"] > newest[key]["date"]:
                newest[key] = r
        for r in sorted(newest.values(), key=lambda r: (r["cpu"], r["command"])):
            since = library_commits_since(r["commit"])
            age = ""
            if since:
                age = f" — the library has changed in {since} commit{'s' if since > 1 else ''} since"
            load = ", ".join(f"{v:g}" for v in r["load"] if v >= 0)
            lines += [f"`{r['command']}` — commit {r['commit']}{age}; {r['date']}; {r['cpu']}, "
                      f"{r['cores']} CPUs, {r['threads']} threads; load average {load}", ""]
            tables = {}
            for row in r["rows"]:
                tables.setdefault(row.get("table", ""), []).append(row)
            for name, rows in tables.items():
                cols = []
                for row in rows:
                    cols += [c for c in row if c not in cols and c != "table"]
                if name:
                    lines += [f"*{name}*", ""]
                lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
                lines += ["| " + " | ".join(fmt(row.get(c, "")) for c in cols) + " |"
                          for row in rows]
                lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main():
    text = render(load_records())
    with open(OUT, "w") as f:
        f.write(text)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
