"""Finding libsymred.so: $SYMRED_LIB first, and a clear ImportError naming what was tried."""

import ctypes.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import symred

PKG = Path(__file__).resolve().parent.parent / "symred"


def run_python(code, env, cwd):
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def test_loaded_library_reports_its_version():
    assert symred.version() == symred.__version__
    assert os.path.exists(symred.lib_path)


def test_bad_symred_lib_is_an_import_error(tmp_path):
    env = dict(os.environ, SYMRED_LIB=str(tmp_path / "nope.so"),
               PYTHONPATH=str(PKG.parent))
    r = run_python("import symred", env, tmp_path)
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "nope.so" in r.stderr, r.stderr


def test_symred_lib_may_name_a_directory(tmp_path):
    env = dict(os.environ, SYMRED_LIB=str(Path(symred.lib_path).parent),
               PYTHONPATH=str(PKG.parent))
    r = run_python("import symred; print(symred.lib_path)", env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("libsymred.so")


@pytest.mark.skipif(ctypes.util.find_library("symred") is not None,
                    reason="libsymred is installed system-wide")
def test_missing_library_lists_paths_tried(tmp_path):
    # A copy of the package outside any checkout: nothing to find.
    dest = tmp_path / "a" / "b" / "symred"
    shutil.copytree(PKG, dest, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("SYMRED_LIB", "LD_LIBRARY_PATH")}
    env["PYTHONPATH"] = str(dest.parent)
    r = run_python("import symred", env, tmp_path)
    assert r.returncode != 0
    assert "cannot find libsymred.so" in r.stderr and "Tried:" in r.stderr, r.stderr
    assert str(tmp_path / "build" / "libsymred.so") in r.stderr
    assert str(tmp_path / "build-ci" / "libsymred.so") in r.stderr


def test_build_tree_is_found_without_symred_lib(tmp_path):
    # A checkout-shaped tree: <root>/bindings/python/symred and <root>/build-ci/libsymred.so.
    root = tmp_path / "repo"
    shutil.copytree(PKG, root / "bindings" / "python" / "symred",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (root / "build-ci").mkdir()
    shutil.copy(symred.lib_path, root / "build-ci" / "libsymred.so")
    env = {k: v for k, v in os.environ.items() if k != "SYMRED_LIB"}
    env["PYTHONPATH"] = str(root / "bindings" / "python")
    r = run_python("import symred; print(symred.lib_path)", env, tmp_path)
    assert r.returncode == 0, r.stderr
    if ctypes.util.find_library("symred") is None:
        assert r.stdout.strip() == str(root / "build-ci" / "libsymred.so")


def test_offline_pip_install(tmp_path):
    """The README's install command works without a package index: pip builds the pure-Python
    package with the system's setuptools (--no-build-isolation) and finds NumPy installed; the
    installed copy imports and computes."""
    src = Path(__file__).resolve().parent.parent
    prefix = tmp_path / "prefix"
    env = {k: v for k, v in os.environ.items()}
    env["PIP_NO_INDEX"] = "1"  # a download attempt fails at once instead of retrying
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation",
                        "--no-warn-script-location", "--prefix", str(prefix), str(src)],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    sites = [p.parent for p in prefix.rglob("symred/__init__.py")]
    assert len(sites) == 1, sites
    env["PYTHONPATH"] = str(sites[0].parent)
    env["SYMRED_LIB"] = symred.lib_path
    code = ("import symred, numpy as np; assert symred.__file__.startswith(%r); "
            "g = symred.Genred('SqDist(x,y)', ['x=Vi(2)', 'y=Vj(2)'], reduction_op='Min', axis=1); "
            "print(g(np.zeros((2, 2)), np.ones((3, 2))).ravel().tolist())" % str(prefix))
    r = run_python(code, env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[2.0, 2.0]", r.stdout
