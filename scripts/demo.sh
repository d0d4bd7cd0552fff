#!/usr/bin/env bash
# demo.sh — installs what is missing, builds symred (Release) in build/, and runs the two
# examples with timings: a Gaussian-process kernel mat-vec and k-nearest neighbours.
#
# Sizes can be changed through the environment, e.g. GP_SIZE="20000 20000" KNN_SIZE="2000 50000 32"
# (nq np D), FMNIST_SIZE="10000 100" (Fashion-MNIST points, queries); SYMRED_BUILD_DIR chooses
# another build folder.
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
    "$bdir/gp-matvec" --check ${GP_SIZE:-4000 4000}
    echo
    echo "---- the same on the reference interpreter (the test oracle), for comparison ----"
    "$bdir/gp-matvec" --check --quiet --device reference ${GP_SIZE:-4000 4000}
    echo
    echo "==== k-nearest neighbours (ArgKMin and KMin_ArgKMin of SqDist) ===="
    "$bdir/knn" --check ${KNN_SIZE:-1000 10000 16}
    # Real data, on request: the first compile of a D = 784 kernel is still slow.
    if [ -n "${FMNIST_SIZE:-}" ]; then
        echo
        echo "==== k-nearest neighbours on Fashion-MNIST (D = 784) ===="
        "$bdir/knn" --check --quiet --fashion-mnist $FMNIST_SIZE
    else
        echo "(FMNIST_SIZE=\"10000 100\" also runs kNN on Fashion-MNIST: points, queries;"
        echo " it needs the Debian package dataset-fashion-mnist)"
    fi
}
echo
echo "demo.sh: done"
