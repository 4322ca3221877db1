#!/usr/bin/env bash
# Installs the Debian 12 packages remat needs to build, test and benchmark.
# Idempotent: packages already installed are skipped, and apt is not touched when none is missing.
set -euo pipefail

packages=(
  cmake ninja-build g++ make pkg-config
  libdnnl-dev ocl-icd-opencl-dev
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libfmt-dev libsentencepiece-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libxbyak-dev  # the fusion kernel's code generator (header only)
  clang-14 libclang-rt-14-dev
  libopenmpi-dev openmpi-bin
  python3
  fortunes-min  # real text for the end-to-end tokenizer and data test
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
