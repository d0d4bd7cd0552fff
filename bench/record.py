"""Benchmark figures as data, for the Python benchmarks (the C ones use bench/record.h).

A benchmark makes a Record before it starts timing, adds its result rows with row(), and
calls close() at the end: when the environment variable SYMRED_BENCH_RECORD names a file, one
JSON line is appended to it with the benchmark's name, the commit, the CPU model, the online
CPUs, the threads the run could use, the UTC date, the load average before the run, the
command line and the rows. bench/tables.py turns those files into docs/benchmarks.md.
"""

import datetime
import json
import os
import subprocess
import sys
import time

# The benchmarks time compiled code: kernel creation waits for the compiler unless the environment
# asks otherwise (symred reads SYMRED_JIT when it makes its context, after this import).
os.environ.setdefault("SYMRED_JIT", "sync")


def best(fn, reps):
    """The best time of reps calls of fn, after one untimed call that compiles the kernels
    (symred's JIT, XLA, pykeops) and warms the caches."""
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _commit():
    if os.environ.get("SYMRED_COMMIT"):
        return os.environ["SYMRED_COMMIT"]
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, check=True)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu():
    """The model name and the widest vector unit of the first CPU (one model name, AMD EPYC,
    covers machines with and without AVX-512), as bench/record.h writes them."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and ":" in line:
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = line.split()
                    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else ""
                    return f"{model} ({isa})" if isa else model
    except OSError:
        pass
    return model


class Record:
    def __init__(self, name, argv=None):
        argv = sys.argv if argv is None else argv
        cores = os.cpu_count() or 1
        threads = os.environ.get("SYMRED_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
        try:
            load = [round(v, 2) for v in os.getloadavg()]
        except OSError:
            load = [-1, -1, -1]
        self.data = {
            "bench": name,
            "commit": _commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "cpu": _cpu(),
            "cores": cores,
            "threads": int(threads) if threads else cores,
            "load": load,
            "command": " ".join([os.path.basename(argv[0])] + list(argv[1:])),
            "rows": [],
        }

    def row(self, **members):
        self.data["rows"].append(members)

    def close(self):
        path = os.environ.get("SYMRED_BENCH_RECORD")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(self.data) + "\n")
            print(f"record appended to {path}")
