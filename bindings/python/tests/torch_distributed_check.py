"""The comparisons of test_torch_distributed.py: ``python torch_distributed_check.py OUTDIR
W1 [W2 ...]`` runs, for each world size W, W processes (torch.multiprocessing, gloo on the
CPU) that each write OUTDIR/w{W}-rank{R}.jsonl, one JSON object per comparison of their
symred.distributed result with the single-process symred.torch result on the whole data
(values: largest difference relative to the largest magnitude; indices: exact).
"""

import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

K = 3
NOUT, NRED = 10, 8
# Row splits per world size, uneven, with empty blocks and blocks shorter than K.
SPLITS = {1: ([NOUT], [NRED]), 2: ([7, 3], [1, 7]), 3: ([5, 0, 5], [2, 5, 1])}
REDUCTIONS = ["Sum", "LogSumExp", "SumSoftMaxWeight", "Min", "Max", "ArgMin", "ArgMax",
              "Min_ArgMin", "Max_ArgMax", "KMin", "ArgKMin", "KMin_ArgKMin"]


def spec(red, axis):
    o, r = ("Vi", "Vj") if axis == 1 else ("Vj", "Vi")
    al = [f"x = {o}(3)", f"y = {r}(3)", f"b = {r}(2)", "g = Pm(1)"]
    if red == "Sum":
        return "Exp(-g * SqDist(x, y)) * b", al, None
    if red == "LogSumExp":
        return "-g * SqDist(x, y)", al, None
    if red == "SumSoftMaxWeight":
        return "-g * SqDist(x, y)", al, "b"
    return "g * SqDist(x, y) * b", al, None


def data(dt, grid=False, special=False):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(NOUT, 3, generator=gen, dtype=dt)
    y = torch.randn(NRED, 3, generator=gen, dtype=dt)
    b = 0.5 + torch.rand(NRED, 2, generator=gen, dtype=dt)
    if grid:  # exact ties
        x, y, b = torch.round(2 * x), torch.round(2 * y), torch.ones_like(b)
    if special:  # reduced rows 0 and 3 NaN, 1, 2, 4, 5 and 6 +inf (ties), row 7 finite
        y[[0, 3]] = float("nan")
        b[[1, 2, 4, 5, 6]] = float("inf")
    return x, y, b, torch.tensor([0.7], dtype=dt)


def mine(a, sizes, rank):
    start = sum(sizes[:rank])
    return a[start:start + sizes[rank]]


def child(rank, world, port, outdir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import symred.torch as storch
    from symred.distributed import Genred

    out_split, red_split = SPLITS[world]
    lines = []
    made = {}

    def make(cls, red, axis, k=None, f2=None):
        """One Genred per reduction, axis and class, reused for both dtypes."""
        f, al, _ = spec(red, axis)
        key = (cls, red, axis, k, f2)
        if key not in made:
            made[key] = cls(f, al, reduction_op=red, axis=axis, opt_arg=k, formula2=f2)
        return made[key]

    def emit(**kw):
        lines.append(json.dumps(kw))

    def compare(case, got, want, dt):
        gots = got if isinstance(got, tuple) else (got,)
        wants = want if isinstance(want, tuple) else (want,)
        for o, w in zip(gots, wants):
            if tuple(o.shape) != tuple(w.shape):
                emit(case=case, kind="shape", got=list(o.shape), want=list(w.shape))
            elif not w.is_floating_point():
                emit(case=case, kind="indices", mismatches=int((o != w).sum()))
            else:
                # NaN and infinities where one process has them, the rest relative to the
                # largest finite value
                same = (torch.isnan(o) & torch.isnan(w)) | (o == w)
                fin = torch.isfinite(o) & torch.isfinite(w)
                if not bool((same | fin).all()):
                    emit(case=case, kind="values", rel=float("inf"), tol=0.0)
                    continue
                scale = max(float(w[fin].abs().max()) if fin.any() else 0.0, 1e-300)
                rel = float((o[fin] - w[fin]).abs().max()) / scale if fin.any() else 0.0
                emit(case=case, kind="values", rel=rel,
                     tol=1e-12 if dt == torch.float64 else 1e-5)

    def split_args(args, axis):
        x, y, b, g = args
        return (mine(x, out_split, rank), mine(y, red_split, rank),
                mine(b, red_split, rank), g)

    for dt in (torch.float64, torch.float32):
        full = data(dt)
        for axis in (1, 0):
            for red in REDUCTIONS:
                f, al, f2 = spec(red, axis)
                k = K if "KMin" in red else None
                dg = make(Genred, red, axis, k, f2)
                want = make(storch.Genred, red, axis, k, f2)(*full)
                want = tuple(mine(w, out_split, rank) for w in want) if isinstance(
                    want, tuple) else mine(want, out_split, rank)
                compare(f"w{world} {red} axis={axis} {str(dt)[6:]}",
                        dg(*split_args(full, axis)), want, dt)
    # exact ties: the lowest global index
    full = data(torch.float64, grid=True)
    for red in ("Min_ArgMin", "ArgMax", "KMin_ArgKMin"):
        f, al, f2 = spec(red, 1)
        k = K if "KMin" in red else None
        dg = make(Genred, red, 1, k)
        want = make(storch.Genred, red, 1, k)(*full)
        want = tuple(mine(w, out_split, rank) for w in want) if isinstance(
            want, tuple) else mine(want, out_split, rank)
        compare(f"w{world} ties {red}", dg(*split_args(full, 1)), want, torch.float64)
    # NaN and infinities among the reduced rows
    for dt, axis in ((torch.float64, 1), (torch.float32, 0)):
        full = data(dt, special=True)
        for red in REDUCTIONS:
            f, al, f2 = spec(red, axis)
            k = K if "KMin" in red else None
            want = make(storch.Genred, red, axis, k, f2)(*full)
            want = tuple(mine(w, out_split, rank) for w in want) if isinstance(
                want, tuple) else mine(want, out_split, rank)
            compare(f"w{world} nan inf {red} axis={axis}",
                    make(Genred, red, axis, k, f2)(*split_args(full, axis)), want, dt)
    # gradients: of the sum over the ranks of sum(out_mine * w_mine)
    for axis, red in [(1, "Sum"), (1, "LogSumExp"), (1, "SumSoftMaxWeight"), (1, "Min"),
                      (1, "Max"), (1, "KMin"), (0, "Sum"), (0, "KMin")]:
        dt = torch.float64
        f, al, f2 = spec(red, axis)
        k = K if "KMin" in red else None
        full = [a.clone().requires_grad_(True) for a in data(dt)]
        out = make(storch.Genred, red, axis, k, f2)(*full)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=dt)
        (out * w).sum().backward()
        part = [a.detach().clone().requires_grad_(True) for a in
                split_args([a.detach() for a in full], axis)]
        got = make(Genred, red, axis, k, f2)(*part)
        (got * mine(w, out_split, rank)).sum().backward()
        # (a rank with no output rows never read the parameter)
        gg = part[3].grad.clone() if part[3].grad is not None else torch.zeros_like(part[3])
        dist.all_reduce(gg)  # a parameter's gradient: each rank's share
        sides = (out_split, red_split, red_split)
        for name, p, a, sz in zip("xyb", part[:3], full[:3], sides):
            if p.grad is None and p.shape[0] == 0:
                continue  # no rows here
            if a.grad is None:  # a tensor the formula does not read
                assert p.grad is None or not p.grad.any(), (red, name)
                continue
            compare(f"w{world} grad {red} d/d{name} axis={axis}", p.grad,
                    mine(a.grad, sz, rank), dt)
        compare(f"w{world} grad {red} d/dg axis={axis}", gg, full[3].grad, dt)
    # LazyTensor: a kNN and a differentiated Gaussian sum
    from symred.distributed import Vi, Vj
    x, y, b, _ = data(torch.float64)
    want = (storch.Vi(x) - storch.Vj(y)).sqnorm2().argKmin(K, dim=1)
    got = (Vi(mine(x, out_split, rank)) - Vj(mine(y, red_split, rank))).sqnorm2().argKmin(
        K, dim=1)
    compare(f"w{world} lazy argKmin", got, mine(want, out_split, rank), torch.float64)
    xf = x.clone().requires_grad_(True)
    want = ((-storch.Vi(xf).sqdist(storch.Vj(y))).exp() * storch.Vj(b)).sum(dim=1)
    (want ** 2).sum().backward()
    xm = mine(x, out_split, rank).clone().requires_grad_(True)
    ym = mine(y, red_split, rank)
    got = ((-Vi(xm).sqdist(Vj(ym))).exp() * Vj(mine(b, red_split, rank))).sum(dim=1)
    (got ** 2).sum().backward()
    compare(f"w{world} lazy gauss", got, mine(want, out_split, rank), torch.float64)
    if xm.shape[0]:
        compare(f"w{world} lazy grad gauss d/dx", xm.grad, mine(xf.grad, out_split, rank),
                torch.float64)
    # K larger than the reduced rows of all ranks: ValueError on every rank
    try:
        Genred("SqDist(x, y)", ["x = Vi(3)", "y = Vj(3)"], reduction_op="KMin", axis=1,
               opt_arg=NRED + 1)(mine(data(torch.float64)[0], out_split, rank),
                                 mine(data(torch.float64)[1], red_split, rank))
        emit(case=f"w{world} K too large", kind="error", type=None, message="")
    except ValueError as e:
        emit(case=f"w{world} K too large", kind="error", type="ValueError", message=str(e))
    dist.barrier()
    dist.destroy_process_group()
    emit(case="done", kind="done")
    with open(os.path.join(outdir, f"w{world}-rank{rank}.jsonl"), "w") as fh:
        fh.write("\n".join(lines) + "\n")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    outdir = sys.argv[1]
    for world in map(int, sys.argv[2:]):
        mp.spawn(child, args=(world, free_port(), outdir), nprocs=world, join=True)
