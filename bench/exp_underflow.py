"""Narrow against wide Gaussians: the cost of Exp's underflow range on the CPU JIT.

    SYMRED_LIB=build/libsymred.so python3 bench/exp_underflow.py [N]

Sum of Exp(-c·|x-y|²)·b and LogSumExp of -c·|x-y|² over N×N points in the unit cube (3-D), for
c = 0.5 (no exponent below -1.5) and c = 200, 5000 (most exponents below -87, the float32
underflow range), float32 and float64, best of 3 after a warm-up, in one process. The ratio
narrow / wide is the slowdown of the underflow range: about 1 since symred's JIT clamps Exp's
argument (docs/semantics.md, "Exp's underflow"); 16-30x before. With SYMRED_BENCH_RECORD set,
the figures are appended to that file as data (bench/record.py).
"""

import sys
import time

import numpy as np

from symred.numpy import Genred

from record import Record  # bench/record.py, beside this file


def best_of(fn, reps=3):
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    rec = Record("exp_underflow")
    rng = np.random.default_rng(0)
    print(f"N = M = {n}, D = 3, points uniform in the unit cube")
    for dt in ("float32", "float64"):
        x = rng.random((n, 3)).astype(dt)
        y = rng.random((n, 3)).astype(dt)
        b = rng.random((n, 1)).astype(dt)
        for red in ("Sum", "LogSumExp"):
            times = {}
            for c in (0.5, 200.0, 5000.0):
                if red == "Sum":
                    g = Genred(f"Exp(-SqDist(x,y)*{c})*b", ["x=Vi(0,3)", "y=Vj(1,3)", "b=Vj(2,1)"],
                               reduction_op="Sum", axis=1)
                    times[c] = best_of(lambda: g(x, y, b))
                else:
                    g = Genred(f"-SqDist(x,y)*{c}", ["x=Vi(0,3)", "y=Vj(1,3)"],
                               reduction_op="LogSumExp", axis=1)
                    times[c] = best_of(lambda: g(x, y))
            wide = times[0.5]
            row = "  ".join(f"c={c:g}: {t:.3f} s ({t / wide:.2f}x)" for c, t in times.items())
            print(f"{dt:8s} {red:9s} {row}", flush=True)
            for c, t in times.items():
                rec.row(n=n, dtype=dt, reduction=red, c=c, seconds=round(t, 4),
                        over_wide=round(t / wide, 2))
    rec.close()


if __name__ == "__main__":
    main()
