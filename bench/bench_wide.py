"""Wide outputs: the fused two-product strategy against dense products measured in the same run.

Two jobs, float32:
  matvec     out_i = sum_j exp(-g |x_i - y_j|^2) B_j, D = 3, B of width R: symred (which never
             builds K) against the dense product K @ B with K already built (torch's BLAS, MKL in
             PyTorch 2.x from PyPI), i.e. the cost of the product alone.
  attention  SumSoftMaxWeight((q|k) * s, v): symred against
             torch.nn.functional.scaled_dot_product_attention on the CPU, same process.
  attn_grad  the same through symred.torch: the backward (gradients with respect to q, k and v
             together: the log-normalizer and three gradient kernels) against symred's own
             forward in the same run, ratio backward / forward (target: at most 3); PyTorch's
             scaled_dot_product_attention backward / forward beside it.
After one warm-up run of each (which compiles or loads the kernel), symred and the baseline run
alternately for --reps rounds. The times printed are the best of the rounds; the ratio is the
median over the rounds of symred's time over the baseline's in the same round (for attn_grad,
of the backward over the forward), which a burst of load on a shared machine moves less than
the ratio of two best times; the records keep that one too (ratio_best). Prints one line per
case; with SYMRED_BENCH_RECORD=FILE set, appends the run to FILE as a record (bench/record.py).

    SYMRED_LIB=build/libsymred.so "$(scripts/pyenv.sh)/bin/python" bench/bench_wide.py
    ... bench/bench_wide.py --threads 1 --n 10000 --widths 16,64 --attn 4096:64
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def race(fa, fb, reps):
    """The times of fa and fb, each run once to warm up (compile or load the kernel, touch the
    memory), then alternately, so that the load of the shared machine hits both alike: two
    lists of reps times, round r's pair (a[r], b[r]) measured back to back."""
    fa()
    fb()
    ta, tb = [], []
    for _ in range(reps):
        for f, times in ((fa, ta), (fb, tb)):
            t = time.perf_counter()
            f()
            times.append(time.perf_counter() - t)
    return ta, tb


def strategy(plan):
    """The strategy of a kernel's pair work from its plan (Genred.plan): "fused" for the fused
    two-product, the symmetric driver's included; else the strategy's name ("direct",
    "gemm-epilogue", "reference")."""
    s = plan["inner"]
    return "fused" if "fused two-product" in s else s


def paired(ta, tb):
    """The median over the rounds of a[r] / b[r]: a ratio that a burst of load on the shared
    machine moves less than the ratio of the best times (which pairs two different rounds)."""
    return statistics.median(a / b for a, b in zip(ta, tb))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="N = M of the mat-vec")
    ap.add_argument("--widths", default="1,16,64,256,1024")
    ap.add_argument("--attn", default="4096:64,4096:128,16384:64,16384:128",
                    help="N:D pairs of the attention job (N = M), empty for none")
    ap.add_argument("--attn-grad", default="4096:64",
                    help="N:D pairs of the attention backward job, empty for none")
    ap.add_argument("--threads", type=int, default=0, help="0: all cores")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    threads = a.threads or os.cpu_count() or 1
    os.environ["SYMRED_NUM_THREADS"] = str(threads)  # read when the context is created
    sys.path.insert(0, str(HERE.parent / "bindings" / "python"))
    import numpy as np
    import torch
    import symred
    from record import Record  # bench/record.py, beside this file

    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    rec = Record("bench_wide")

    n = a.n
    x = rng.random((n, 3), dtype=np.float32)
    y = rng.random((n, 3), dtype=np.float32)
    g = np.array([1.0], np.float32)
    K = None
    for R in [int(w) for w in a.widths.split(",") if w]:
        b = rng.standard_normal((n, R), dtype=np.float32)
        k = symred.Genred("Exp(-SqDist(x,y)*g)*b",
                          ["x=Vi(3)", "y=Vj(3)", f"b=Vj({R})", "g=Pm(1)"],
                          reduction_op="Sum", axis=1)
        out = k(x, y, b, g)
        if K is None:
            xt, yt = torch.from_numpy(x), torch.from_numpy(y)
            K = torch.exp(-torch.cdist(xt, yt) ** 2 * float(g[0]))
        bt = torch.from_numpy(b)
        la, lb = race(lambda: k(x, y, b, g), lambda: K @ bt, a.reps)
        ts, tb, ratio = min(la), min(lb), paired(la, lb)
        err = float(np.abs(out - (K @ bt).numpy()).max() / max(1e-30, np.abs(out).max()))
        strat = strategy(k.plan())
        rec.row(job="matvec", n=n, d=3, r=R, symred_s=round(ts, 4), base_s=round(tb, 4),
                baseline="K @ B (torch, K prebuilt)", ratio=round(ratio, 3),
                ratio_best=round(ts / tb, 3),
                rel_err=float(f"{err:.2e}"), strategy=strat)
        print(f"matvec N=M={n} D=3 R={R:5d}  symred {ts:8.4f} s ({strat})  K@B {tb:8.4f} s"
              f"  ratio {ratio:5.2f}  rel.err {err:.1e}", flush=True)
    del K

    for pair in [p for p in a.attn.split(",") if p]:
        N, D = (int(v) for v in pair.split(":"))
        q = rng.standard_normal((N, D), dtype=np.float32)
        kk = rng.standard_normal((N, D), dtype=np.float32)
        v = rng.standard_normal((N, D), dtype=np.float32)
        s = np.array([1.0 / np.sqrt(D)], np.float32)
        k = symred.Genred("(q|k)*s", [f"q=Vi({D})", f"k=Vj({D})", "s=Pm(1)", f"v=Vj({D})"],
                          reduction_op="SumSoftMaxWeight", axis=1, formula2="v")
        out = k(q, kk, s, v)
        qt, kt, vt = (torch.from_numpy(t)[None, None] for t in (q, kk, v))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        la, lb = race(lambda: k(q, kk, s, v), lambda: sdpa(qt, kt, vt), a.reps)
        ts, tb, ratio = min(la), min(lb), paired(la, lb)
        ref = sdpa(qt, kt, vt)[0, 0].numpy()
        err = float(np.abs(out - ref).max() / max(1e-30, np.abs(ref).max()))
        strat = strategy(k.plan())
        rec.row(job="attention", n=N, d=D, r=D, symred_s=round(ts, 4), base_s=round(tb, 4),
                baseline="torch scaled_dot_product_attention", ratio=round(ratio, 3),
                ratio_best=round(ts / tb, 3),
                rel_err=float(f"{err:.2e}"), strategy=strat)
        print(f"attention N=M={N} D={D:3d}  symred {ts:8.4f} s ({strat})  sdpa {tb:8.4f} s"
              f"  ratio {ratio:5.2f}  rel.err {err:.1e}", flush=True)

    attn_grad(a, rng, rec, torch, race)

    rec.data["torch"] = torch.__version__
    rec.close()

def attn_grad(a, rng, rec, torch, race):
    """Attention's backward through symred.torch against its forward, and PyTorch's SDPA
    backward against its forward, all in this process."""
    import numpy as np
    import symred.torch as st

    for pair in [p for p in a.attn_grad.split(",") if p]:
        N, D = (int(v) for v in pair.split(":"))
        q, kk, v, G = (torch.from_numpy(rng.standard_normal((N, D), dtype=np.float32))
                       for _ in range(4))
        s = torch.tensor([1.0 / np.sqrt(D)], dtype=torch.float32)
        k = st.Genred("(q|k)*s", [f"q=Vi({D})", f"k=Vj({D})", "s=Pm(1)", f"v=Vj({D})"],
                      reduction_op="SumSoftMaxWeight", axis=1, formula2="v")
        qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, kk, v))

        def fwd():
            with torch.no_grad():
                k(q, kk, s, v)

        def bwd():
            out = k(qg, kg, s, vg)
            torch.autograd.grad(out, (qg, kg, vg), G)

        lf, lfb = race(fwd, bwd, a.reps)
        # The backward alone: forward + backward less the forward, of the best runs, and per
        # round for the ratio.
        tf, tb = min(lf), min(lfb) - min(lf)
        ratio = statistics.median((fb - f) / f for f, fb in zip(lf, lfb))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        qt, kt, vt = (t[None, None].clone().requires_grad_(True) for t in (q, kk, v))

        def tfwd():
            with torch.no_grad():
                sdpa(qt, kt, vt)

        def tbwd():
            torch.autograd.grad(sdpa(qt, kt, vt), (qt, kt, vt), G[None, None])

        lpf, lpfb = race(tfwd, tbwd, a.reps)
        pf, pb = min(lpf), min(lpfb) - min(lpf)
        pratio = statistics.median((fb - f) / f for f, fb in zip(lpf, lpfb))
        # The gradients against PyTorch's (the same attention, scale 1/sqrt(D)).
        out = k(qg, kg, s, vg)
        ours = torch.autograd.grad(out, (qg, kg, vg), G)
        ref = torch.autograd.grad(sdpa(qt, kt, vt), (qt, kt, vt), G[None, None])
        err = max(float((o - r[0, 0]).abs().max() / r.abs().max()) for o, r in zip(ours, ref))
        rec.row(job="attn_grad", n=N, d=D, r=D, symred_s=round(tb, 4), base_s=round(tf, 4),
                baseline="symred forward", ratio=round(ratio, 3), ratio_best=round(tb / tf, 3),
                torch_bwd_s=round(pb, 4), torch_fwd_s=round(pf, 4),
                torch_ratio=round(pratio, 3), rel_err=float(f"{err:.2e}"))
        print(f"attn_grad N=M={N} D={D:3d}  symred backward {tb:8.4f} s / forward {tf:8.4f} s"
              f"  ratio {ratio:5.2f}   (sdpa backward {pb:8.4f} s / forward {pf:8.4f} s"
              f"  ratio {pratio:5.2f})  rel.err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
