"""Gaussian mat-vec out_i = sum_j exp(-g |x_i - y_j|^2) b_j in JAX, three ways, in one run:
jax.jit of symred.jax (one XLA custom call), symred from NumPy (the same kernel without XLA),
and the same function written in jax.numpy under jax.jit (XLA builds the N x M matrix); then
the gradient with respect to x through jax.grad (symred.jax) and through symred.torch's
autograd. Prints the times (best of --reps calls, after a warm-up that compiles; symred.jax
and symred from NumPy alternate call by call) and the ratios; records them with bench/record.py when SYMRED_BENCH_RECORD is set.

    SYMRED_LIB=build/libsymred.so ~/.cache/symred-venv/bin/python bench/jax_matvec.py

--mem-grid N1,N2,...: instead, the memory grid. For each N = M, the jitted symred.jax
mat-vec and the jitted jax.numpy one each run once in a child process under RLIMIT_AS =
--mem-limit (bytes, default 4e9); each row records the outcome ("ok", or "oom" when JAX
cannot allocate or the child dies under the limit), the time of one call after a warm-up at
a small size, and the child's peak resident memory (ru_maxrss). jax.numpy needs the N x M
matrix (4 N^2 bytes in float32); symred.jax needs the inputs and the output.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "bindings" / "python"))
sys.path.insert(0, str(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import symred  # noqa: E402
import symred.jax as sjax  # noqa: E402

from record import best  # noqa: E402  (bench/record.py, beside this file)

FORMULA = "Exp(-g * SqDist(x, y)) * b"
ALIASES = ["x = Vi(3)", "y = Vj(3)", "b = Vj(1)", "g = Pm(1)"]


def best_interleaved(fns, reps):
    """best() of several functions whose calls alternate, so that a change of load on the
    shared machine hits them alike."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(reps):
        for t, fn in zip(times, fns):
            t0 = time.perf_counter()
            fn()
            t.append(time.perf_counter() - t0)
    return [min(t) for t in times]


def mem_child(system, n):
    """One call of the mat-vec of ``system`` at N = M = n (run in a child under RLIMIT_AS):
    prints "ok <seconds> <peak rss bytes>" or "oom <message>"."""
    import resource

    def make(m):
        rng = np.random.default_rng(0)
        return (jnp.asarray(rng.random((m, 3), dtype=np.float32)),
                jnp.asarray(rng.random((m, 3), dtype=np.float32)),
                jnp.asarray(rng.standard_normal((m, 1), dtype=np.float32)),
                jnp.asarray([2.0], dtype=jnp.float32))

    if system == "symred_jax":
        fn = jax.jit(sjax.Genred(FORMULA, ALIASES, reduction_op="Sum", axis=1))
    else:
        @jax.jit
        def fn(x, y, b, g):
            d2 = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
            return jnp.exp(-g[0] * d2) @ b
    try:
        fn(*make(100)).block_until_ready()  # compiles symred's kernel; XLA recompiles per shape
        args = make(n)
        t = time.perf_counter()
        fn(*args).block_until_ready()
        dt = time.perf_counter() - t
    except (MemoryError, RuntimeError) as e:  # XLA's RESOURCE_EXHAUSTED is a RuntimeError
        print("oom", str(e).splitlines()[0][:200])
        return
    print(f"ok {dt:.6f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}")


def mem_grid(sizes, limit, rec):
    import resource
    import subprocess

    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    print(f"memory grid, Gaussian mat-vec N = M, D = 3, float32, RLIMIT_AS = {limit / 1e9:.1f} GB")
    for n in sizes:
        for system in ("symred_jax", "jax_numpy"):
            p = subprocess.run([sys.executable, __file__, "--mem-child", system, str(n)],
                               capture_output=True, text=True, preexec_fn=limited)
            last = (p.stdout.strip().splitlines() or [""])[-1].split(" ", 2)
            if p.returncode == 0 and last[0] == "ok":
                outcome, secs, rss = "ok", float(last[1]), int(last[2])
                print(f"  N = {n:>8}  {system:10}  ok   {secs:9.3f} s   peak RSS {rss / 1e6:8.0f} MB")
            else:
                outcome, secs, rss = "oom", None, None
                why = " ".join(last[1:]) if last[0] == "oom" else (
                    f"exit status {p.returncode}: " + (p.stderr.strip().splitlines() or [""])[-1][:120])
                print(f"  N = {n:>8}  {system:10}  out of memory under the limit ({why})")
            if rec is not None:
                rec.row(case="mem_grid", n=n, d=3, dtype="float32", system=system,
                        outcome=outcome, seconds=secs, peak_rss_bytes=rss, limit_bytes=limit)
    if rec is not None:
        rec.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-torch", action="store_true", help="skip the symred.torch gradient")
    ap.add_argument("--mem-grid", help="comma-separated N: the memory grid instead")
    ap.add_argument("--mem-limit", type=float, default=4e9, help="RLIMIT_AS of the grid's runs")
    ap.add_argument("--mem-child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.mem_child:
        return mem_child(a.mem_child[0], int(a.mem_child[1]))
    if a.mem_grid:
        try:
            from record import Record
            rec = Record("jax-matvec")
        except ImportError:
            rec = None
        return mem_grid([int(float(v)) for v in a.mem_grid.split(",")], int(a.mem_limit), rec)
    n = a.n
    try:  # made before timing: it notes the load average then
        from record import Record
        rec = Record("jax-matvec")
    except ImportError:
        rec = None
    rng = np.random.default_rng(0)
    x = rng.random((n, 3), dtype=np.float32)
    y = rng.random((n, 3), dtype=np.float32)
    b = rng.standard_normal((n, 1), dtype=np.float32)
    g = np.array([2.0], dtype=np.float32)
    ct = rng.standard_normal((n, 1), dtype=np.float32)
    xj, yj, bj, gj, ctj = (jnp.asarray(v) for v in (x, y, b, g, ct))

    gn = symred.Genred(FORMULA, ALIASES, reduction_op="Sum", axis=1)
    gj_red = sjax.Genred(FORMULA, ALIASES, reduction_op="Sum", axis=1)
    f_sym = jax.jit(gj_red)

    @jax.jit
    def f_dense(x, y, b, g):
        d2 = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
        return jnp.exp(-g[0] * d2) @ b

    out_sym = np.asarray(f_sym(xj, yj, bj, gj))
    out_np = gn(x, y, b, g)
    out_dense = np.asarray(f_dense(xj, yj, bj, gj))
    scale = np.abs(out_np).max()
    print(f"max |symred.jax - symred numpy| / max|out| = {np.abs(out_sym - out_np).max() / scale:.2e}")
    print(f"max |symred.jax - jax.numpy|    / max|out| = {np.abs(out_sym - out_dense).max() / scale:.2e}")

    t_sym, t_np = best_interleaved([lambda: f_sym(xj, yj, bj, gj).block_until_ready(),
                                    lambda: gn(x, y, b, g)], a.reps)
    t_dense = best(lambda: f_dense(xj, yj, bj, gj).block_until_ready(), max(1, a.reps // 2))

    grad_sym = jax.jit(jax.grad(lambda x: (gj_red(x, yj, bj, gj) * ctj).sum()))
    t_grad = best(lambda: grad_sym(xj).block_until_ready(), a.reps)
    t_torch = None
    if not a.no_torch:
        import torch

        import symred.torch as storch

        gt = storch.Genred(FORMULA, ALIASES, reduction_op="Sum", axis=1)
        xt = torch.from_numpy(x).requires_grad_(True)
        yt, bt, gt_, ctt = (torch.from_numpy(v) for v in (y, b, g, ct))

        def torch_grad():
            (gx,) = torch.autograd.grad(gt(xt, yt, bt, gt_), [xt], ctt)
            return gx

        t_torch = best(torch_grad, a.reps)
        gx_t = torch_grad().numpy()
        gx_j = np.asarray(grad_sym(xj))
        print(f"max |grad symred.jax - grad symred.torch| / max = "
              f"{np.abs(gx_j - gx_t).max() / np.abs(gx_t).max():.2e}")

    print(f"\nGaussian mat-vec N = M = {n}, D = 3, float32, best of {a.reps} "
          f"(jax {jax.__version__}, {jax.default_backend()})")
    print(f"  jax.jit(symred.jax)        {t_sym * 1e3:9.2f} ms")
    print(f"  symred (NumPy)             {t_np * 1e3:9.2f} ms   symred.jax / numpy = "
          f"{t_sym / t_np:.3f} (target <= 1.10)")
    print(f"  jax.jit(jax.numpy dense)   {t_dense * 1e3:9.2f} ms   jax.numpy / symred.jax = "
          f"{t_dense / t_sym:.1f}x (target >= 10)")
    print(f"  jax.grad wrt x (symred.jax){t_grad * 1e3:9.2f} ms   (forward + backward: "
          f"{t_grad / t_sym:.2f}x the forward)")
    if t_torch is not None:
        print(f"  symred.torch grad wrt x    {t_torch * 1e3:9.2f} ms   symred.jax / torch = "
              f"{t_grad / t_torch:.3f} (target <= 1.10)")

    if rec is None:
        return
    rec.row(case="matvec", n=n, d=3, dtype="float32", symred_jax_s=t_sym, symred_numpy_s=t_np,
            jax_numpy_s=t_dense, ratio_vs_numpy=t_sym / t_np, speedup_vs_jnp=t_dense / t_sym)
    rec.row(case="grad_x", n=n, d=3, dtype="float32", symred_jax_s=t_grad,
            symred_torch_s=t_torch,
            ratio_vs_torch=(t_grad / t_torch) if t_torch else None)
    rec.close()


if __name__ == "__main__":
    main()
