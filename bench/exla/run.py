#!/usr/bin/python3
"""The eXLA experiments (Artemev et al., "Memory Safe Computations with XLA Compiler", 2022),
reproduced with symred beside the systems people would use instead.

    bench/exla/setup.sh                       # once: the peers (jax, pykeops, gpflow) in .venv
    python3 bench/exla/run.py [--quick] [--out DIR] [--only mem,knn,sgpr] [--timeout S]
                              [--where FIELD=VALUE,...]

Writes DIR/results.json (default bench/exla/out) and DIR/<experiment>.png. Every configuration
runs in its own process, so an out-of-memory or a crash of a peer is a record, never the end of
the suite. The run resumes: a record of DIR/results.json with the same key (experiment, system,
dataset, sizes, distance, limit_bytes) and status "ok", "oom" or "skipped" is kept and not run
again; "error" is run again, and so is "timeout" when --timeout is now larger. After a
timeout, the larger sizes of the same series are recorded as skipped ("not run: ...") without
being started, and reconsidered on the next run. results.json is rewritten (atomically) after
every record.

The interface of an experiment module bench/exla/exp_<name>.py (run.py imports it to call
configs(), so it imports its peers and numpy only inside run() and plot()):

- ``configs(quick: bool) -> list[dict]``: one dict per run. Required keys: ``experiment``
  (== name), ``system``, the sizes that apply (``n``, ``m``, ``d``, ``M``, ``k``,
  ``dataset``, ``distance``) and ``limit_bytes``. Optional: ``rlimit: True`` (the child runs
  under RLIMIT_AS = limit_bytes + common.RLIMIT_ALLOWANCE, set before anything is imported;
  ``rlimit_in_run: True`` when run() sets a limit itself: either way a child killed by a
  signal is recorded as "oom"),
  ``timeout`` (seconds; else --timeout), and any other JSON field run() needs.
- ``run(config: dict) -> dict``: executed in the child (bench/exla/child.py, with
  bench/exla/ on sys.path, so ``import common`` works; the symred library is $SYMRED_LIB and
  ``common.import_symred()`` imports the bindings). Returns measured fields (``seconds``,
  ``compile_seconds``, ``recall``, ``rmse``, ``nlpd``, ...) and optionally ``status`` /
  ``reason``. MemoryError (or being killed under the rlimit) is recorded as "oom", ImportError
  as "skipped" with the message, any other exception as "error" with its tail.
- ``child_env(env: dict) -> dict`` (optional): the environment of this experiment's children,
  from the common one (exp_sgpr.py and exp_knn.py use it to give the peers an optimised BLAS).
- ``plot(records: list[dict], path: str) -> None``: draws the module's records (all statuses)
  into the PNG at path with matplotlib (Agg backend); run.py calls it in a child process
  (`child.py --plot`) with the children's interpreter.

run.py adds to each record ``status``, ``peak_rss_bytes`` (the child's own peak RSS, see
common.run_child), ``wall_seconds`` (the child process, start-up included), ``loadavg_1min``
(when it started: the machine is shared), ``timeout_used``, ``quick`` and ``recorded_at``.
The children use
bench/exla/.venv/bin/python when setup.sh made it, else /usr/bin/python3 (peers then "skipped").
Environment given to every child: SYMRED_LIB (found or built, common.find_symred_lib),
SYMRED_CACHE_DIR and the pykeops build folder under DIR, EXLA_OUT=DIR, OMP/BLAS threads left
as the machine has them, then the module's child_env if it has one.

--where M=10000,system=symred runs only the configurations whose fields have these values (the
others are neither run nor touched in results.json): one point of a grid, or the most
important one first.
"""

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

EXPERIMENTS = ("mem", "knn", "sgpr")
KEEP = ("ok", "oom", "skipped")


def load_results(path):
    if not path.exists():
        return []
    with open(path) as f:
        return json.load(f)


def save_results(path, records):
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as f:
        json.dump(records, f, indent=1, default=float)
        f.write("\n")
    os.replace(tmp, path)


def is_done(old, timeout):
    """Whether an earlier record stands for this run (see the module docstring)."""
    if old is None:
        return False
    if old.get("status") == "timeout":
        return timeout <= float(old.get("timeout_used", 0))
    if old.get("status") == "skipped" and str(old.get("reason", "")).startswith("not run:"):
        return False
    return old.get("status") in KEEP


def child_env(out):
    env = dict(os.environ)
    env["SYMRED_LIB"] = common.find_symred_lib()
    env.setdefault("SYMRED_CACHE_DIR", str(out / "symred-cache"))
    env["EXLA_OUT"] = str(out)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    Path(env["SYMRED_CACHE_DIR"]).mkdir(parents=True, exist_ok=True, mode=0o700)
    return env


def previous_failure(records, cfg):
    """A record of the same experiment, system, dataset, distance, d and limit at a smaller n
    that timed out: larger sizes are not started (recorded as skipped, "not run: ...")."""
    for r in records:
        if (r.get("status") == "timeout" and r.get("experiment") == cfg["experiment"]
                and r.get("system") == cfg["system"]
                and all(r.get(f) == cfg.get(f)
                        for f in ("dataset", "distance", "d", "m", "k", "limit_bytes"))
                and (r.get("n") or 0) < (cfg.get("n") or 0)
                and (r.get("M") or 0) <= (cfg.get("M") or 0)):
            return r
    return None


def matches(cfg, where):
    """Whether cfg has every FIELD=VALUE of ``where`` (values compared as text)."""
    return all(str(cfg.get(k)) == v for k, v in where.items())


def run_experiment(name, mod, quick, out, records, timeout, env, log, where=None):
    by_key = {common.record_key(r): i for i, r in enumerate(records)}
    configs = [c for c in mod.configs(quick) if matches(c, where or {})]
    if hasattr(mod, "child_env"):
        env = mod.child_env(dict(env))
    for cfg in configs:
        cfg = dict(cfg)
        if cfg.get("experiment") != name:
            raise ValueError(f"exp_{name}.configs() gave experiment {cfg.get('experiment')!r}")
        key = common.record_key(cfg)
        old = records[by_key[key]] if key in by_key else None
        t = float(cfg.get("timeout", timeout))
        if is_done(old, t):
            log(f"  kept    {common.key_text(cfg)}: {old['status']}")
            continue
        failed = previous_failure(records, cfg)
        if failed is not None:
            rec = dict(cfg, status="skipped",
                       reason=f"not run: timed out at n={failed.get('n')} M={failed.get('M')}")
        else:
            log_path = out / "logs" / (common.key_text(cfg).replace(" ", "_").replace("/", "-")
                                       + ".log")
            rec = common.run_child(cfg, log_path, t, env=env)
            rec["timeout_used"] = t
        rec["quick"] = quick
        rec["recorded_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if key in by_key:
            records[by_key[key]] = rec
        else:
            by_key[key] = len(records)
            records.append(rec)
        save_results(out / "results.json", records)
        extra = rec.get("reason", "")
        secs = rec.get("seconds")
        log(f"  {rec['status']:7s} {common.key_text(cfg)}: "
            + (f"{secs:.4g} s, " if isinstance(secs, (int, float)) else "")
            + f"peak RSS {rec.get('peak_rss_bytes', 0) / 1e6:.0f} MB"
            + (f", recall {rec['recall']:.4f}" if isinstance(rec.get("recall"), float) else "")
            + (f" ({extra[:160]})" if extra else ""))


def plot(name, records, out, log):
    """exp_<name>.plot into out/<name>.png, in a child process (the children's interpreter
    has matplotlib where the one running run.py may not); a failure is logged, not raised."""
    mine = out / f".{name}-records.json"
    with open(mine, "w") as f:
        json.dump([r for r in records if r.get("experiment") == name], f, default=float)
    png = out / f"{name}.png"
    p = subprocess.run([common.child_python(), str(common.HERE / "child.py"), "--plot", name,
                        str(mine), str(png)], capture_output=True, text=True)
    mine.unlink()
    if p.returncode == 0:
        log(f"{name}: plot {png}")
    else:
        log(f"{name}: plot failed: {p.stderr.strip()[-1500:]}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: all in < 10 minutes")
    ap.add_argument("--out", default=str(common.HERE / "out"), help="output folder")
    ap.add_argument("--only", default=",".join(EXPERIMENTS), help="comma-separated experiments")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per run (default 120 with --quick, 7200 without)")
    ap.add_argument("--no-plot", action="store_true", help="write results.json only")
    ap.add_argument("--where", default="",
                    help="only the configurations with these field values: FIELD=VALUE,...")
    a = ap.parse_args(argv)
    where = {}
    for item in filter(None, (w.strip() for w in a.where.split(","))):
        k, eq, v = item.partition("=")
        if not eq or not k:
            ap.error(f"--where: expected FIELD=VALUE, got {item!r}")
        where[k.strip()] = v.strip()
    timeout = a.timeout if a.timeout is not None else (120.0 if a.quick else 7200.0)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, flush=True)

    env = child_env(out)
    log(f"eXLA experiments -> {out}; children run {common.child_python()}, "
        f"SYMRED_LIB={env['SYMRED_LIB']}")
    records = load_results(out / "results.json")
    missing = []
    for name in [s.strip() for s in a.only.split(",") if s.strip()]:
        if name not in EXPERIMENTS:
            ap.error(f"unknown experiment {name!r}; expected some of {', '.join(EXPERIMENTS)}")
        if not (common.HERE / f"exp_{name}.py").exists():
            log(f"{name}: bench/exla/exp_{name}.py does not exist; not run")
            missing.append(name)
            continue
        mod = importlib.import_module(f"exp_{name}")
        t0 = time.perf_counter()
        log(f"{name}:")
        run_experiment(name, mod, a.quick, out, records, timeout, env, log, where)
        log(f"{name}: {time.perf_counter() - t0:.0f} s")
        if not a.no_plot:
            plot(name, records, out, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
