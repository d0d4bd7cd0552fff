"""symred.mpi under mpirun with 1, 2 and 3 ranks (mpi_check.py does the comparisons).

Skipped, with the reason, when mpi4py, mpirun or libsymred_mpi.so is missing.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import symred

HERE = Path(__file__).resolve().parent
MPIRUN = shutil.which("mpirun")
LIB_MPI = Path(os.path.realpath(symred.lib_path)).parent / "libsymred_mpi.so"

HAVE_MPI4PY = importlib.util.find_spec("mpi4py") is not None

pytestmark = [
    pytest.mark.skipif(not HAVE_MPI4PY, reason="mpi4py not installed (Debian: python3-mpi4py)"),
    pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (Debian: openmpi-bin)"),
    pytest.mark.skipif(not LIB_MPI.is_file(),
                       reason=f"{LIB_MPI} not built (symred configured without MPI)"),
]


@pytest.mark.parametrize("np_", [1, 2, 3])
def test_sharded_equals_single_process(np_):
    env = dict(os.environ, SYMRED_LIB=symred.lib_path, SYMRED_NUM_THREADS="1",
               PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               # CI runs as root; containers often forbid the ptrace that CMA needs.
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none")
    r = subprocess.run([MPIRUN, "--oversubscribe", "-np", str(np_), sys.executable,
                        str(HERE / "mpi_check.py")], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"mpi_check: ok ({np_} ranks)" in r.stdout, r.stdout + r.stderr
