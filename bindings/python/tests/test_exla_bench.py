"""The machinery of bench/exla/run.py (the eXLA experiments) on a tiny mem grid.

symred and NumPy only (no PyPI peer needed): checks the records of results.json, that a child
exceeding its RLIMIT_AS is recorded as "oom" without stopping the suite, and that a second run
keeps finished records and runs "error" ones again.
"""

import importlib
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench" / "exla"


@pytest.fixture()
def run_py(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCH))
    # n = 20000 needs a 3.2 GB matrix in NumPy: more than the 1 GB limit + the 1.5 GiB allowance.
    monkeypatch.setenv("EXLA_MEM_SIZES", "300,20000")
    monkeypatch.setenv("EXLA_MEM_SYSTEMS", "symred,numpy")
    # The children use symred's CPU JIT (conftest selects the reference interpreter for the
    # binding tests); its kernel cache goes under the output folder.
    monkeypatch.setenv("SYMRED_DEVICE", "cpu")
    for name in ("run", "common", "exp_mem"):
        sys.modules.pop(name, None)
    return importlib.import_module("run")


def load(out):
    with open(out / "results.json") as f:
        return json.load(f)


def test_mem_records_oom_and_resume(run_py, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_py.main(["--quick", "--only", "mem", "--out", str(out), "--no-plot"]) == 0
    recs = {(r["system"], r["n"]): r for r in load(out)}
    assert set(recs) == {("symred", 300), ("numpy", 300), ("symred", 20000), ("numpy", 20000)}
    for key in (("symred", 300), ("numpy", 300), ("symred", 20000)):
        r = recs[key]
        assert r["status"] == "ok", r
        assert r["seconds"] > 0 and r["peak_rss_bytes"] > 0, r
        assert r["max_rel_err"] < 1e-10, r
        assert r["limit_bytes"] == 10**9 and r["experiment"] == "mem", r
    assert recs[("symred", 20000)]["budget_bytes"] == 10**8
    # symred never held the n x n matrix (3.2 GB); NumPy could not allocate it.
    assert recs[("symred", 20000)]["peak_rss_bytes"] < 500e6
    oom = recs[("numpy", 20000)]
    assert oom["status"] == "oom", oom
    assert "MemoryError" in oom["reason"], oom

    # Resume: every record is kept; one marked "error" is run again.
    first = load(out)
    bad = next(i for i, r in enumerate(first) if r["system"] == "numpy" and r["n"] == 300)
    first[bad]["status"] = "error"
    first[bad]["reason"] = "made up by the test"
    with open(out / "results.json", "w") as f:
        json.dump(first, f)
    capsys.readouterr()
    assert run_py.main(["--quick", "--only", "mem", "--out", str(out), "--no-plot"]) == 0
    log = capsys.readouterr().out
    assert log.count("kept") == 3, log
    second = load(out)
    assert len(second) == 4
    assert second[bad]["status"] == "ok"
    for i, r in enumerate(second):
        if i != bad:
            assert r == first[i]


def test_missing_module_is_reported(run_py, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    # run.py looks for exp_<name>.py beside common.py: an empty folder has none.
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setattr(run_py.common, "HERE", empty)
    assert run_py.main(["--only", "sgpr", "--out", str(out), "--no-plot"]) == 0
    assert "exp_sgpr.py does not exist" in capsys.readouterr().out


FAKE = """
import os, signal, time
def configs(quick):
    return []
def run(cfg):
    if cfg["mode"] == "alloc":
        return {"size": len(bytearray(cfg["bytes"]))}
    if cfg["mode"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
"""


@pytest.mark.parametrize("mode, rlimit, status", [
    ("alloc", True, "oom"),  # MemoryError under RLIMIT_AS
    ("alloc", False, "ok"),  # the same allocation without the limit
    ("kill", True, "oom"),  # killed (as by the kernel) under the limit
    ("kill", False, "error"),  # killed without a limit: not a memory failure
    ("sleep", False, "timeout"),
])
def test_child_outcomes(run_py, tmp_path, monkeypatch, mode, rlimit, status):
    common = sys.modules["common"]
    (tmp_path / "exp_fake.py").write_text(FAKE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    nbytes = 10**9 + common.RLIMIT_ALLOWANCE + (1 << 30)  # past the limit, but allocatable
    if not rlimit:
        nbytes = 1 << 20
    cfg = {"experiment": "fake", "system": "x", "limit_bytes": 10**9, "rlimit": rlimit,
           "mode": mode, "bytes": nbytes}
    rec = common.run_child(cfg, tmp_path / "fake.log", timeout=3)
    assert rec["status"] == status, rec
    if status != "ok":
        assert rec["reason"], rec


def test_resume_rules(run_py):
    """Which earlier records stand (is_done) and when a series stops after a timeout."""
    assert not run_py.is_done(None, 60)
    assert run_py.is_done({"status": "ok"}, 60)
    assert run_py.is_done({"status": "oom"}, 60)
    assert run_py.is_done({"status": "skipped", "reason": "cannot import a peer: jax"}, 60)
    assert not run_py.is_done({"status": "skipped", "reason": "not run: timed out at n=10"}, 60)
    assert not run_py.is_done({"status": "error", "reason": "x"}, 60)
    assert run_py.is_done({"status": "timeout", "timeout_used": 60}, 60)
    assert not run_py.is_done({"status": "timeout", "timeout_used": 60}, 120)
    base = {"experiment": "mem", "system": "pykeops", "d": 1, "limit_bytes": 10**9}
    timed_out = dict(base, n=1000, status="timeout")
    assert run_py.previous_failure([timed_out], dict(base, n=2000)) is timed_out
    assert run_py.previous_failure([timed_out], dict(base, n=500)) is None
    assert run_py.previous_failure([timed_out], dict(base, n=2000, system="symred")) is None


def test_where_runs_only_matching_configs(run_py, tmp_path):
    assert run_py.matches({"n": 300, "system": "numpy"}, {"n": "300"})
    assert not run_py.matches({"n": 300, "system": "numpy"}, {"n": "300", "system": "symred"})
    out = tmp_path / "out"
    assert run_py.main(["--quick", "--only", "mem", "--out", str(out), "--no-plot",
                        "--where", "n=300,system=numpy"]) == 0
    assert [(r["system"], r["n"], r["status"]) for r in load(out)] == [("numpy", 300, "ok")]
    with pytest.raises(SystemExit):
        run_py.main(["--only", "mem", "--out", str(out), "--where", "n300"])


def test_child_killed_under_a_limit_set_in_run_is_oom(run_py, tmp_path, monkeypatch):
    common = sys.modules["common"]
    (tmp_path / "exp_fake.py").write_text(FAKE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    cfg = {"experiment": "fake", "system": "x", "limit_bytes": 10**9, "mode": "kill"}
    rec = common.run_child(dict(cfg, rlimit_in_run=True), tmp_path / "a.log", 10)
    assert rec["status"] == "oom", rec
    assert common.run_child(cfg, tmp_path / "b.log", 10)["status"] == "error"
    assert common._classify(None, "OOM when allocating tensor with shape[200,200000]", False) == "oom"


@pytest.mark.parametrize("distance, d", [("L2", 3), ("L2", 12), ("L1", 5), ("cosine", 3),
                                         ("cosine", 12)])
def test_knn_truth_and_recall(run_py, tmp_path, monkeypatch, distance, d):
    """The exact run (torch, float64) writes the truth; NumPy and symred are scored against it
    at 1.0, and a wrong answer is not."""
    pytest.importorskip("torch")
    import numpy as np
    monkeypatch.setenv("EXLA_OUT", str(tmp_path))
    sys.modules.pop("exp_knn", None)
    exp_knn = importlib.import_module("exp_knn")
    cfg = {"experiment": "knn", "dataset": "random", "n": 997, "m": 31, "d": d, "k": 10,
           "distance": distance, "reps": 1, "max_seconds": 1.0}
    truth = exp_knn.run(dict(cfg, system="exact"))
    assert Path(truth["truth"]).is_file() and "recall" not in truth
    for system in ("numpy", "symred"):
        assert exp_knn.run(dict(cfg, system=system))["recall"] == 1.0, system
    x, q = exp_knn._data(cfg)
    t = np.load(truth["truth"])
    wrong = t["idx"].copy()
    wrong[:, -1] = (wrong[:, -1] + 1) % cfg["n"]  # one neighbour per query replaced
    assert exp_knn.recall(x, q, wrong, t["idx"], t["kth"], distance) < 1.0
    # The truth's k-th distance is the smallest possible, by brute force in NumPy.
    x64, q64 = x.astype(np.float64), q.astype(np.float64)
    if distance == "cosine":
        x64 /= np.linalg.norm(x64, axis=1, keepdims=True)
        q64 /= np.linalg.norm(q64, axis=1, keepdims=True)
    diff = q64[:, None, :] - x64[None, :, :]
    full = np.abs(diff).sum(-1) if distance == "L1" else (diff ** 2).sum(-1)
    kth = np.sort(full, axis=1)[:, cfg["k"] - 1]
    if distance == "cosine":
        kth = kth / 2  # |a - b|^2 = 2 - 2 cos for unit rows
    np.testing.assert_allclose(t["kth"], kth, rtol=1e-9, atol=1e-12)


def test_summary_targets_count_timeouts_and_recall_misses(run_py):
    """summary.py's kNN targets: a peer that timed out after longer than symred's whole run is
    beaten, one that won is named, and a recall below 1 is reported with its point."""
    sys.modules.pop("summary", None)
    summary = importlib.import_module("summary")
    pt = {"experiment": "knn", "dataset": "random", "n": 1000, "m": 10, "d": 3, "k": 10,
          "distance": "L2"}
    me = dict(pt, system="symred", status="ok", seconds=1.0, wall_seconds=5.0, recall=1.0)
    slow = dict(pt, system="pykeops", status="timeout", timeout_used=200.0)
    assert summary.beaten(slow, me)
    assert not summary.beaten(dict(slow, timeout_used=4.0), me)
    assert not summary.beaten(dict(pt, system="jax", status="ok", seconds=0.5), me)
    text = "\n".join(summary.knn_tables([me, slow]))
    assert "timeout (200 s)" in text and ": met" in text and "not met" not in text
    fast = dict(pt, system="jax", status="ok", seconds=0.5, recall=1.0)
    text = "\n".join(summary.knn_tables([dict(me, recall=0.99), slow, fast]))
    assert "not met: jax at random n=1,000 d=3 L2" in text
    assert "not met at random n=1,000 d=3 L2 (0.99)" in text
    assert "jax as fast or faster than symred at: random n=1,000 d=3 L2" in text


def test_child_peak_rss_is_its_own():
    """A child started by a process that once held 400 MB reports its own peak, not that."""
    import subprocess

    code = ("import subprocess, sys\n"
            "big = bytearray(400 * 2**20)\n"
            "big[::4096] = b'x' * len(big[::4096])\n"
            "del big\n"
            "print(subprocess.run([sys.executable, '-c', 'import child; "
            "print(child.self_peak_rss_bytes())'], capture_output=True, text=True, "
            "check=True).stdout)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(BENCH), "PATH": "/usr/bin:/bin"}, check=True)
    assert 0 < int(r.stdout.split()[-1]) < 200 * 2**20, r.stdout
