"""One configuration of an eXLA experiment, in its own process (started by common.run_child).

    python bench/exla/child.py '<config as JSON>'
    python bench/exla/child.py --plot NAME RECORDS.json OUT.png   # exp_NAME.plot (run.py)

Applies RLIMIT_AS when the config asks for it (before any peer is imported), imports
exp_<experiment>, calls its run(config) and prints the result as JSON on the last stdout line:
run()'s fields plus `self_peak_rss_bytes` (VmHWM, see self_peak_rss_bytes). MemoryError, and
errors whose text says an allocation failed, become status "oom"; ImportError becomes "skipped" with the
message; anything else "error" with the message's tail (the traceback goes to stderr).
"""

import importlib
import json
import os
import resource
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

OOM_WORDS = ("resource_exhausted", "out of memory", "bad_alloc", "cannot allocate memory",
             "failed to allocate", "ebudget", "oom when allocating")


def plot(name, records_path, png_path):
    """Runs exp_<name>.plot in this interpreter (the venv's, which sees matplotlib)."""
    with open(records_path) as f:
        records = json.load(f)
    importlib.import_module("exp_" + name).plot(records, png_path)


def self_peak_rss_bytes():
    """This process's peak RSS: VmHWM of /proc/self/status, which counts from the exec. Linux's
    getrusage ru_maxrss keeps the high-water mark of the process before its exec, so a child of
    a large process (a pytest run that imported PyTorch 2 and jax: 640 MB) would report the
    parent's size; ru_maxrss only where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main():
    if sys.argv[1] == "--plot":
        return plot(*sys.argv[2:5])
    config = json.loads(sys.argv[1])
    if config.get("rlimit"):
        limit = int(config["limit_bytes"]) + common.RLIMIT_ALLOWANCE
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        mod = importlib.import_module("exp_" + config["experiment"])
        result = mod.run(config) or {}
        result.setdefault("status", "ok")
    except MemoryError as e:
        traceback.print_exc()
        result = {"status": "oom", "reason": f"MemoryError: {e}"[-400:]}
    except ImportError as e:
        traceback.print_exc()
        result = {"status": "skipped", "reason": f"cannot import a peer: {e}"[-400:]}
    except Exception as e:  # noqa: BLE001 — every failure becomes a record, never a crash
        traceback.print_exc()
        text = f"{type(e).__name__}: {e}"
        status = "oom" if any(w in text.lower() for w in OOM_WORDS) else "error"
        result = {"status": status, "reason": text[-400:]}
    result["self_peak_rss_bytes"] = self_peak_rss_bytes()
    sys.stdout.flush()
    print("\n" + json.dumps(result, default=float), flush=True)


if __name__ == "__main__":
    main()
