#!/usr/bin/env bash
# A user's project against the installed package: installs BUILD_DIR into a fresh prefix, configures
# examples/cpp there with find_package(meshfuse) (every installed header also compiled alone), builds
# it, and runs its tensor-parallel MLP under mpirun with 1 and 2 ranks (each checks itself against
# float64 and exits non-zero when off).
#   tests/install_consumer.sh BUILD_DIR MPIEXEC
set -euo pipefail
build=$1
mpiexec=$2
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" || { cat "$work/install.log"; exit 1; }
cmake -S "$root/examples/cpp" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DMESHFUSE_CHECK_HEADERS=ON \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" -j2 >"$work/build.log" 2>&1 || { grep -E "error|Error" -A3 "$work/build.log" | head -60; exit 1; }
echo "built examples/cpp against $work/prefix ($(grep -c 'Building CXX' "$work/build.log") files, every installed header alone among them)"
for np in 1 2; do
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MESHFUSE_TIMEOUT=60 \
    "$mpiexec" --oversubscribe --allow-run-as-root -np $np "$work/build/tp_mlp" | grep "max relative error"
done
