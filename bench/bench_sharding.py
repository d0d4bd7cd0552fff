"""The overhead of symred.jax_sharding: a Gaussian mat-vec out_i = sum_j exp(-g |x_i - y_j|^2) b_j
(D = 3, float32, N = M = --n) on one JAX host device, then the same total work on --devices
host devices (XLA_FLAGS=--xla_force_host_platform_device_count, set here before jax is
imported) with the reduced rows sharded (partial sums and a psum) and with both sides sharded
(the ppermute ring), and a plain jax.jit of the Genred on x sharded by rows over a mesh of
Auto axes (XLA partitions the custom call). The host devices share the machine's cores, so
this measures what partitioning and the collectives cost, not a speedup. Prints each time (--reps timed calls
after one that compiles, each configuration's best; the configurations alternate call by call)
and the ratios to one device; records them with bench/record.py when SYMRED_BENCH_RECORD is
set.

    SYMRED_LIB=build/libsymred.so OMP_WAIT_POLICY=passive \\
        ~/.cache/symred-venv/bin/python bench/bench_sharding.py --n 100000 --reps 1
"""

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100000)
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--reps", type=int, default=1)
    a = ap.parse_args()
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={a.devices}")
    sys.path.insert(0, str(HERE.parent / "bindings" / "python"))
    sys.path.insert(0, str(HERE))
    import jax
    import jax.numpy as jnp
    import numpy as np

    from symred.jax import Genred
    from symred.jax_sharding import sharded

    try:  # made before timing: it notes the load average then
        from record import Record
        rec = Record("bench_sharding")
    except ImportError:
        rec = None
    n = a.n
    rng = np.random.default_rng(0)
    x, y = (jnp.asarray(rng.random((n, 3), dtype=np.float32)) for _ in range(2))
    b = jnp.asarray(rng.standard_normal((n, 1), dtype=np.float32))
    g = jnp.asarray(np.array([2.0], dtype=np.float32))
    gauss = Genred("Exp(-g * SqDist(x, y)) * b", ["x = Vi(3)", "y = Vj(3)", "b = Vj(1)",
                                                  "g = Pm(1)"], reduction_op="Sum", axis=1)
    mesh = jax.make_mesh((a.devices,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
    # A plain jax.jit of the Genred on x sharded by rows over a mesh of Auto axes (y, b and g
    # on every device): XLA partitions symred's custom call (custom_partitioning).
    auto = jax.make_mesh((a.devices,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    rows = jax.sharding.NamedSharding(auto, jax.sharding.PartitionSpec("d"))
    every = jax.sharding.NamedSharding(auto, jax.sharding.PartitionSpec())
    put = (jax.device_put(x, rows),) + tuple(jax.device_put(v, every) for v in (y, b, g))
    plain = jax.jit(lambda *v: gauss(*v))
    configs = {
        "1 device": jax.jit(gauss),
        f"{a.devices} devices, reduced rows sharded (psum)":
            jax.jit(sharded(gauss, mesh, reduced="d")),
        f"{a.devices} devices, both sides sharded (ring)":
            jax.jit(sharded(gauss, mesh, rows="d", reduced="d")),
        f"{a.devices} devices, plain jit, rows sharded": lambda *_: plain(*put),
    }
    ref = None
    for name, f in configs.items():  # compile, and check against one device
        out = np.asarray(f(x, y, b, g))
        ref = out if ref is None else ref
        err = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
        print(f"{name}: compiled; max relative difference to 1 device {err:.1e}", flush=True)
    times = {name: [] for name in configs}
    for _ in range(a.reps):
        for name, f in configs.items():
            t = time.perf_counter()
            f(x, y, b, g).block_until_ready()
            times[name].append(time.perf_counter() - t)
    base = min(times["1 device"])
    print(f"N = M = {n}, D = 3, float32, Gaussian Sum; load average {os.getloadavg()[0]:.1f} "
          f"at the end, {os.cpu_count()} CPUs")
    for name, ts in times.items():
        print(f"  {name:45s} {min(ts):8.3f} s   ratio to 1 device {min(ts) / base:.3f}")
        if rec is not None:
            rec.row(config=name, n=n, seconds=min(ts), ratio=min(ts) / base)
    if rec is not None:
        rec.close()


if __name__ == "__main__":
    main()
