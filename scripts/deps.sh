#!/usr/bin/env bash
# deps.sh — installs the Debian packages that building, testing and the demo need, when missing.
#
# Only packages that are not installed are asked for, and `apt-get update` runs only then, so on
# a machine that has everything this does nothing and needs no network. Works as root, or
# through sudo when it is available.
set -euo pipefail

PACKAGES=(
    build-essential   # gcc, g++, make, libc headers: the CPU JIT's and the CUDA emulator's compilers
    cmake
    pkg-config        # CMake finds Criterion with it; the install test uses it
    libcriterion-dev  # the C tests
    gzip              # knn --fashion-mnist reads the data set through it
    dataset-fashion-mnist # real data for the kNN demo and the Python kNN example's test
    libblis4-openmp   # BLIS, loaded at run time by the high-dimensional gemm-epilogue path
    python3
    python3-numpy     # the Python bindings
    python3-pytest    # their tests
    python3-pip       # the offline install of the bindings (tested)
    python3-setuptools
    python3-venv      # the venv the install test creates (pip install builds the library)
    python3-torch     # symred.torch and its tests (import symred never needs it)
    clang-format      # the style check of scripts/test.sh
    clang             # libFuzzer (fuzz/) and the ThreadSanitizer build of scripts/test.sh
    libomp-dev        # LLVM's OpenMP and Archer: OpenMP that ThreadSanitizer understands
    openmpi-bin       # mpirun: the MPI companion library's tests, examples and benchmark
    libopenmpi-dev    # MPI headers and libmpi: CMake builds symred_mpi when it finds them
    python3-mpi4py    # symred.mpi, the Python face of symred_mpi
    python3-faiss     # bench/knn_faiss.py and bench/exla: the FAISS peer
    python3-matplotlib # bench/exla: the plots of the eXLA experiments
)

missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$pkg")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "deps.sh: all ${#PACKAGES[@]} packages are installed"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    as_root=(env DEBIAN_FRONTEND=noninteractive)
elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo env DEBIAN_FRONTEND=noninteractive)
else
    echo "deps.sh: missing packages (${missing[*]}), and neither root nor sudo to install them" >&2
    exit 1
fi

echo "deps.sh: installing ${missing[*]}"
"${as_root[@]}" apt-get update -q
"${as_root[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "deps.sh: done"
