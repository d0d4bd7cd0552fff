"""The yardstick of bench-strip: torch's sgemm (MKL in PyTorch 2.x from PyPI) on one thread, on
the same shapes, GFLOP/s of the thread's CPU time (best of 5 rounds of about 20 ms each).

  abt  C (M x N) = A (M x K) B^T    (torch.mm(a, b.t()))
  av   C (M x N) += A (M x K) V     (torch.addmm(c, a, v, out=c))

    OMP_WAIT_POLICY=passive "$(scripts/pyenv.sh)/bin/python" bench/strip_torch.py [M:N:K,...]
"""
import sys
import time

DEFAULT = ("12:512:64,12:256:128,48:512:64,256:256:64,256:256:128,12:64:512,"
           "12:128:256,48:64:512,256:64:256,256:128:256,12:16:64,256:16:256")


def per_call(f):
    """Best CPU seconds per call of f over 5 rounds of about 20 ms."""
    f()
    n = 1
    while True:
        t0 = time.thread_time()
        for _ in range(n):
            f()
        t = time.thread_time() - t0
        if t > 0.02:
            break
        n *= 4
    best = t / n
    for _ in range(4):
        t0 = time.thread_time()
        for _ in range(n):
            f()
        best = min(best, (time.thread_time() - t0) / n)
    return best


def main():
    import torch
    torch.set_num_threads(1)
    shapes = [tuple(int(v) for v in s.split(":")) for s in
              (sys.argv[1] if len(sys.argv) > 1 else DEFAULT).split(",") if s]
    print(f"torch {torch.__version__}, MKL {torch.backends.mkl.is_available()}, one thread, "
          "GFLOP/s of CPU time")
    print(f"{'M':>5} {'N':>5} {'K':>5}  {'abt':>7} {'av':>7}")
    for M, N, K in shapes:
        a, b, v, c = torch.randn(M, K), torch.randn(N, K), torch.randn(K, N), torch.zeros(M, N)
        t1 = per_call(lambda: torch.mm(a, b.t(), out=c))
        t2 = per_call(lambda: torch.addmm(c, a, v, out=c))
        g = 2 * M * N * K / 1e9
        print(f"{M:5d} {N:5d} {K:5d}  {g / t1:7.1f} {g / t2:7.1f}", flush=True)


if __name__ == "__main__":
    main()
