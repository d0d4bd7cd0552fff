#!/usr/bin/python3
"""Draws the scaling plots of docs/benchmarks.md from the recorded runs in bench/records/.

- docs/scaling-knn.png: exact kNN time against N, from the newest `knn_faiss.py --scaling` run
  (symred, FAISS IndexFlatL2, torch's dense distances + topk);
- docs/scaling-matvec.png: Gaussian mat-vec time against N, from the newest matvec_scaling.py
  run (symred, NumPy in row blocks, torch dense, pykeops CPU).

Each plot's caption names the run: commit, date, CPU, threads and the load average before it
started (the machine may have been shared). bench/tables.py links the PNGs that exist.

    /usr/bin/python3 bench/plots.py      # needs matplotlib (Debian python3-matplotlib)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tables import ROOT, load_records  # noqa: E402  (bench/tables.py, beside this file)

# Each plot: the file under docs/, the record it draws (bench name, command prefix), the x
# column, the y columns with their legend, the title.
PLOTS = [
    {"file": "scaling-knn.png", "bench": "knn_faiss", "command": "knn_faiss.py --scaling",
     "x": "n", "series": [("symred_s", "symred"), ("faiss_s", "FAISS IndexFlatL2"),
                          ("torch_topk_s", "torch dense + topk")],
     "title": "Exact kNN, Fashion-MNIST (D = 784, k = 10), {m} queries, float32",
     "xlabel": "N (points)"},
    {"file": "scaling-matvec.png", "bench": "matvec_scaling", "command": "matvec_scaling.py",
     "x": "N", "series": [("symred_s", "symred"), ("pykeops_cpu_s", "pykeops (CPU)"),
                          ("torch_dense_s", "torch dense"), ("numpy_s", "NumPy (row blocks)")],
     "title": "Gaussian mat-vec, D = 3, float32, N = M",
     "xlabel": "N = M"},
]


def newest(runs, plot):
    """The newest recorded run of the plot's benchmark and command, or None."""
    found = [r for r in runs
             if r["bench"] == plot["bench"] and r["command"].startswith(plot["command"])]
    return max(found, key=lambda r: r["date"]) if found else None


def caption(run):
    load = ", ".join(f"{v:g}" for v in run["load"] if v >= 0)
    return (f"commit {run['commit']}, {run['date']}, {run['cpu']}, {run['threads']} threads; "
            f"load average {load} before the run")


def draw(plot, run, plt):
    rows = sorted(run["rows"], key=lambda r: r[plot["x"]])
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for col, label in plot["series"]:
        pts = [(r[plot["x"]], r[col]) for r in rows if r.get(col, -1) > 0]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(plot["xlabel"])
    ax.set_ylabel("time (s, best of the run's repetitions)")
    ax.set_title(plot["title"].format(**rows[0]), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.text(0.01, 0.01, caption(run), fontsize=7)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(os.path.join(ROOT, "docs", plot["file"]), dpi=100)
    plt.close(fig)


def main():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = load_records()
    for plot in PLOTS:
        run = newest(runs, plot)
        if run is None:
            print(f"plots: no recorded run of {plot['command']}: docs/{plot['file']} not drawn")
            continue
        draw(plot, run, plt)
        print(f"wrote docs/{plot['file']}")


if __name__ == "__main__":
    main()
