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


def test_pip_install_bundles_the_library(tmp_path):
    """The README's install, as a user does it, offline: pip builds libsymred with CMake and
    bundles it (system setuptools through --no-build-isolation, NumPy from the system through
    --system-site-packages). From another directory, with SYMRED_LIB unset, the installed
    package loads its own copy of the library and computes a kernel on the CPU JIT."""
    src = Path(__file__).resolve().parent.parent
    venv = tmp_path / "venv"
    r = subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items()
           if k not in ("SYMRED_LIB", "PYTHONPATH", "SYMRED_DEVICE", "LD_LIBRARY_PATH")}
    env["PIP_NO_INDEX"] = "1"  # a download attempt fails at once instead of retrying
    r = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", str(src)],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                          env=env, capture_output=True, text=True).stdout.strip()
    bundled = os.path.join(site, "symred", "libsymred.so")
    assert os.path.isfile(bundled)
    env["SYMRED_CACHE_DIR"] = str(tmp_path / "cache")
    # Compiled before the call returns: in the default async mode the first call runs on the
    # tile interpreter, and a process that exits before its background compile has finished
    # (a loaded machine) caches nothing.
    env["SYMRED_JIT"] = "sync"
    code = ("import symred, numpy as np; "
            "g = symred.Genred('SqDist(x,y)', ['x=Vi(2)', 'y=Vj(2)'], reduction_op='Min', "
            "axis=1); "
            "print(g(np.zeros((2, 2)), np.ones((3, 2)), backend='CPU').ravel().tolist()); "
            "print(symred.lib_path); symred.info()")
    r = subprocess.run([py, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "[2.0, 2.0]", r.stdout
    assert lines[1] == bundled, r.stdout
    assert f"library:          {bundled}" in r.stdout, r.stdout
    assert f"library version:  {symred.__version__}" in r.stdout, r.stdout
    assert f"cache directory:  {tmp_path / 'cache'} (SYMRED_CACHE_DIR)" in r.stdout, r.stdout
    assert any(f.suffix == ".so" for f in (tmp_path / "cache").rglob("*")), "no JIT kernel cached"
    for key in ("JIT compiler:", "cache directory:", "BLIS:", "CUDA:"):
        assert key in r.stdout, r.stdout
