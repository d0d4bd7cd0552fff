"""Shared pieces of the eXLA experiments: paths, the child runner, timing, data sets, symred.

Used by run.py (the parent: one child process per configuration) and by the experiment modules
exp_<name>.py (which run inside the child). Nothing here imports a peer (jax, pykeops, faiss,
gpflow): those are imported by the experiment's run() in the child, so a missing one becomes a
"skipped" record and never stops the suite.
"""

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
VENV_PYTHON = HERE / ".venv" / "bin" / "python"
SYSTEM_PYTHON = "/usr/bin/python3"

# The address space a child may use beyond its config's limit_bytes when it asks for
# rlimit=True: RLIMIT_AS = limit_bytes + RLIMIT_ALLOWANCE. RLIMIT_AS counts virtual memory, and a
# Python process with numpy, OpenBLAS threads and (for JAX) XLA's thread pools and code reserves
# far more address space than it touches. Measured start-up footprints (VmPeak after a tiny
# case): JAX 0.92 GB, pykeops 0.76 GB, numpy 60 MB. With 1 GiB, JAX could not allocate the
# 800 MB matrix of n = 1e4 under a 1 GB limit while NumPy could; 1.5 GiB lets both run it, so
# the limit bites on the experiment's arrays, not on the interpreter. A peer with a small
# footprint can use up to limit_bytes + (1.5 GiB - its footprint) for its arrays: the limit is
# coarse by that much (docs/exla.md).
RLIMIT_ALLOWANCE = 3 << 29  # 1.5 GiB

# Fields that identify a record (run.py's resume key).
KEY_FIELDS = ("experiment", "system", "dataset", "n", "m", "d", "M", "k", "distance",
              "limit_bytes")

STATUSES = ("ok", "oom", "error", "skipped", "timeout")


def record_key(rec):
    return tuple(rec.get(f) for f in KEY_FIELDS)


def key_text(rec):
    """A short readable name of a record, also used for its log file name."""
    parts = [str(rec.get("experiment")), str(rec.get("system"))]
    for f in KEY_FIELDS[2:]:
        v = rec.get(f)
        if v is not None:
            parts.append(f"{f}={v}")
    return " ".join(parts)


def child_python():
    """The interpreter for children: the benchmark's venv when setup.sh made it."""
    return str(VENV_PYTHON) if VENV_PYTHON.exists() else SYSTEM_PYTHON


# ---- BLAS ---------------------------------------------------------------------------------------

OPENBLAS = str(HERE / ".openblas" / "usr" / "lib" / "x86_64-linux-gnu" / "openblas-openmp")


def avx512():
    """Whether the CPU has AVX-512 F/BW/VL/DQ (Intel or AMD)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return False
    return all(x in flags for x in ("avx512f", "avx512bw", "avx512vl", "avx512dq"))


def blas_env(env):
    """The environment of children whose peers call BLAS (the SGPR and kNN runs). Debian's default
    BLAS here is BLIS with its generic kernels (17 GFLOP/s in a float64 GEMM on one thread, 27 on
    two, on the 2-core VM), where the NumPy, FAISS and TensorFlow wheels people install bring
    OpenBLAS or MKL: setup.sh unpacks Debian's OpenBLAS (libopenblas0-openmp) into
    bench/exla/.openblas and these children load it through LD_LIBRARY_PATH (130-170 GFLOP/s
    float64 on a quiet machine with its AVX-512 kernels: OPENBLAS_CORETYPE=SkylakeX where the
    CPU has them). symred does not use it (it dlopens BLIS for its gemm epilogue). torch sets
    OpenMP to one thread when imported on these VMs, so OMP_NUM_THREADS is the number of CPUs.
    Without bench/exla/.openblas the system's BLAS is used; the runs record which
    (blas_loaded)."""
    if os.path.isdir(OPENBLAS):
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            filter(None, [OPENBLAS, env.get("LD_LIBRARY_PATH", "")]))
        if avx512():
            env["OPENBLAS_CORETYPE"] = "SkylakeX"
    env.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    return env


def blas_loaded():
    """The BLAS and LAPACK libraries this process has loaded (from /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if ".so" in line}
    except OSError:
        return []
    return sorted(p for p in libs if any(w in os.path.basename(p) for w in
                                         ("blas", "lapack", "blis")))


# ---- symred -------------------------------------------------------------------------------------


def find_symred_lib(build=True):
    """Path of libsymred.so: $SYMRED_LIB, else build-ci/, build/ or the newest other build*/
    of the checkout (not a sanitizer build), else (build=True) a Release build into
    build-exla/ with the checkout's CMake."""
    env = os.environ.get("SYMRED_LIB")
    if env:
        return env
    for name in ("build-ci", "build"):
        p = REPO / name / "libsymred.so"
        if p.is_file():
            return str(p)
    # Not a sanitizer build: it cannot be loaded into an interpreter without a preload.
    found = [p for p in REPO.glob("build*/libsymred.so")
             if p.is_file() and "asan" not in p.parent.name]
    if found:
        return str(max(found, key=lambda p: p.stat().st_mtime))
    if not build:
        return None
    bdir = REPO / "build-exla"
    subprocess.run(["cmake", "-S", str(REPO), "-B", str(bdir), "-DCMAKE_BUILD_TYPE=Release"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(bdir), "-j2", "--target", "symred"], check=True,
                   stdout=subprocess.DEVNULL)
    return str(bdir / "libsymred.so")


def strategy(genred):
    """The CPU strategy of a symred Genred's pair work (its plan): "gemm-epilogue", "direct",
    "fused two-product", ... ("reference" without a C compiler)."""
    return genred.plan(backend="CPU")["inner"]


def import_symred():
    """The symred Python package of this checkout (bindings/python), on $SYMRED_LIB."""
    path = str(REPO / "bindings" / "python")
    if path not in sys.path:
        sys.path.insert(0, path)
    import symred
    return symred


# ---- timing -------------------------------------------------------------------------------------


def best_of(fn, warmup=None, reps=3, max_seconds=20.0):
    """Times fn(): one warm-up call (warmup() when given, e.g. a compile on a tiny input, else
    fn() itself), then up to `reps` timed calls, stopping early once the timed calls together
    took max_seconds. Returns (fields, last result of fn) with fields = {"seconds": the best
    timed call, "first_seconds": the warm-up call, "reps": timed calls made}."""
    t0 = time.perf_counter()
    out = (warmup or fn)()
    first = time.perf_counter() - t0
    times = []
    spent = 0.0
    while len(times) < reps and (not times or spent < max_seconds):
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        times.append(dt)
        spent += dt
    return {"seconds": min(times), "first_seconds": first, "reps": len(times)}, out


def jax_cpu():
    """jax on the CPU (in the child; raises ImportError where jax is not installed)."""
    import jax
    jax.config.update("jax_platforms", "cpu")
    return jax


def best_of_jit(fn, args, cfg):
    """best_of for a JAX function: jax.jit(fn) compiled for args (timed: compile_seconds),
    then run as best_of(reps=cfg["reps"], max_seconds=cfg["max_seconds"]) with the result
    waited for. Returns (fields, result as NumPy)."""
    import numpy as np
    jax = jax_cpu()
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_seconds = time.perf_counter() - t0
    fields, out = best_of(lambda: compiled(*args).block_until_ready(), reps=cfg.get("reps", 3),
                          max_seconds=cfg.get("max_seconds", 30))
    fields["compile_seconds"] = compile_seconds
    return fields, np.asarray(out)


# ---- data sets ----------------------------------------------------------------------------------

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian dataset-fashion-mnist


def _read_idx(path, count):
    """The first `count` items of an IDX file (big-endian header: magic with the number of
    dimensions in its last byte, then one uint32 per dimension, then uint8 data)."""
    with gzip.open(path, "rb") as f:
        header = f.read(4)
        dims = [int.from_bytes(f.read(4), "big") for _ in range(header[3])]
        count = min(count, dims[0])
        item = 1
        for v in dims[1:]:
            item *= v
        import numpy as np
        return np.frombuffer(f.read(count * item), dtype=np.uint8).reshape(count, item)


def fashion_mnist(n_train=60000, n_test=10000):
    """(train, test) float32 arrays of Fashion-MNIST images, pixels / 255, D = 784."""
    import numpy as np
    tr = _read_idx(FASHION_DIR / "train-images-idx3-ubyte.gz", n_train)
    te = _read_idx(FASHION_DIR / "t10k-images-idx3-ubyte.gz", n_test)
    return (np.ascontiguousarray(tr, dtype=np.float32) / np.float32(255.0),
            np.ascontiguousarray(te, dtype=np.float32) / np.float32(255.0))


def random_points(n, d, seed, dtype="float32"):
    """n points uniform in [0, 1)^d from a seeded generator."""
    import numpy as np
    return np.random.default_rng(seed).random((n, d), dtype=np.float32).astype(dtype, copy=False)


# ---- the child runner (parent side) -------------------------------------------------------------


def _classify(rc_signal, stderr_tail, rlimit):
    """Status of a child that printed no result: killed, or an interpreter-level failure."""
    text = stderr_tail.lower()
    oom_words = ("memoryerror", "bad_alloc", "resource_exhausted", "out of memory",
                 "cannot allocate memory", "failed to allocate", "oom when allocating")
    if any(w in text for w in oom_words):
        return "oom"
    if rc_signal in (signal.SIGKILL, signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS) and rlimit:
        return "oom"
    return "error"


def run_child(config, log_path, timeout, env=None, python=None):
    """Runs one config in its own process (child.py) and returns the record: the config, the
    fields its run() returned, `status`, `peak_rss_bytes` and `wall_seconds`.

    The child's stdout and stderr go to log_path; its last stdout line is the JSON result.
    Peak RSS: the child's own getrusage(RUSAGE_SELF) maximum when it reported one (this
    excludes compiler processes it started), else wait4's figure for the process tree.
    A child past `timeout` seconds is killed with its process group ("timeout")."""
    python = python or child_python()
    cmd = [python, str(HERE / "child.py"), json.dumps(config)]
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    out_path = log_path.with_suffix(".out")
    load = os.getloadavg()[0]  # the machine is shared: how busy it was when the run started
    t0 = time.perf_counter()
    with open(out_path, "wb") as out, open(log_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, start_new_session=True,
                                cwd=str(REPO))
        timed_out = False
        while True:
            pid, wstatus, rusage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if timeout and time.perf_counter() - t0 > timeout:
                timed_out = True
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                pid, wstatus, rusage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(wstatus)
    wall = time.perf_counter() - t0
    rec = dict(config)
    rec["wall_seconds"] = round(wall, 3)
    rec["loadavg_1min"] = load
    rec["peak_rss_bytes"] = rusage.ru_maxrss * 1024
    lines = out_path.read_bytes().decode(errors="replace").strip().splitlines()
    stderr_tail = log_path.read_bytes()[-4000:].decode(errors="replace")
    result = None
    if lines:
        try:
            result = json.loads(lines[-1])
        except ValueError:
            result = None
    if timed_out:
        rec["status"] = "timeout"
        rec["reason"] = f"killed after {timeout:.0f} s"
        return rec
    if isinstance(result, dict):
        rec.update(result)
        rec.setdefault("status", "ok")
        if result.get("self_peak_rss_bytes"):
            rec["peak_rss_bytes"] = result["self_peak_rss_bytes"]
        return rec
    sig = -proc.returncode if proc.returncode < 0 else None
    rec["status"] = _classify(sig, stderr_tail,
                              config.get("rlimit") or config.get("rlimit_in_run"))
    how = (f"killed by signal {signal.Signals(sig).name}" if sig
           else f"exit status {proc.returncode}")
    tail = " | ".join(line.strip() for line in stderr_tail.strip().splitlines()[-3:])
    rec["reason"] = f"{how}, no result; stderr: {tail[-400:]}"
    return rec
