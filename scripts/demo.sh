#!/usr/bin/env bash
# demo.sh — installs what is missing, builds symred (Release) in build/, and runs the two
# examples with timings: a Gaussian-process kernel mat-vec and k-nearest neighbours.
#
# Sizes can be changed through the environment, e.g. GP_SIZE="20000 20000" KNN_SIZE="2000 50000 32"
# (nq np D), FMNIST_SIZE="10000 100" (Fashion-MNIST points, queries; FMNIST_SIZE=0 skips it);
# SYMRED_BUILD_DIR chooses another build folder.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
bdir=${SYMRED_BUILD_DIR:-build}
cmake -S . -B "$bdir" -DCMAKE_BUILD_TYPE=Release
cmake --build "$bdir" -j "$jobs"

# Word splitting of the size lists is intended.
# shellcheck disable=SC2086
{
    echo
    echo "==== Gaussian-process kernel mat-vec: out_i = sum_j exp(-g |x_i - y_j|^2) b_j ===="
    "$bdir/gp-matvec" --check ${GP_SIZE:-40000 40000}
    echo
    echo "---- the reference interpreter (the test oracle) on 4000 x 4000, for comparison ----"
    "$bdir/gp-matvec" --check --quiet --device reference 4000 4000
    echo
    echo "==== k-nearest neighbours (ArgKMin and KMin_ArgKMin of SqDist) ===="
    "$bdir/knn" --check ${KNN_SIZE:-1000 10000 16}
    # Real data (deps.sh installs dataset-fashion-mnist): D = 784 takes the BLIS path.
    if [ "${FMNIST_SIZE:-}" != 0 ]; then
        echo
        echo "==== k-nearest neighbours on Fashion-MNIST (D = 784, BLIS gemm-epilogue) ===="
        "$bdir/knn" --check --quiet --fashion-mnist ${FMNIST_SIZE:-60000 1000}
    fi
}
echo
echo "demo.sh: done"
