"""The examples run on small sizes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import symred

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FMNIST = "/usr/share/datasets/fashion-mnist"


def run(script, *args):
    env = dict(os.environ, SYMRED_LIB=symred.lib_path,
               PYTHONPATH=str(EXAMPLES.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if env.pop("SYMRED_PYTEST_DEVICE_SET", None):
        env.pop("SYMRED_DEVICE", None)  # the examples run on the default backend, as users do
    return subprocess.run([sys.executable, str(EXAMPLES / script), *args], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("dim", ["1", "3"])
def test_gp_regression(dim):
    r = run("gp_regression.py", "--n", "300", "--ntest", "50", "--dim", dim)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "test RMSE" in r.stdout and "CG:" in r.stdout, r.stdout


def test_gp_regression_float32():
    r = run("gp_regression.py", "--n", "200", "--ntest", "20", "--dtype", "float32",
            "--tol", "1e-4")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.skipif(not os.path.isdir(FMNIST), reason="dataset-fashion-mnist not installed")
def test_knn_fashion_mnist():
    r = run("knn_fashion_mnist.py", "--train", "300", "--test", "30", "--k", "5")
    assert r.returncode == 0, r.stdout + r.stderr
    acc = float(r.stdout.split("accuracy:")[1].split()[0])
    assert acc > 0.5, r.stdout  # 10 classes: far above chance even on 500 images
    assert "time:" in r.stdout


def test_knn_without_data_says_so(tmp_path):
    r = run("knn_fashion_mnist.py", "--data-dir", str(tmp_path))
    assert r.returncode == 2
    assert "Fashion-MNIST not found" in r.stderr and "dataset-fashion-mnist" in r.stderr
