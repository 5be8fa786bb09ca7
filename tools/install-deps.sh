#!/usr/bin/env bash
# Installs Shoal's Debian build, test and benchmark dependencies. Idempotent:
# when every package is present it returns without touching apt.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build ccache git pkg-config
  libdnnl-dev libopenblas-dev libopenblas0
  libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev zlib1g-dev libsodium-dev libyaml-cpp-dev
  iproute2 nftables iperf3 curl
  gnuplot-nox clang-14 libclang-rt-14-dev libtsan2 libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libbenchmark-dev
  dataset-fashion-mnist
  slurm-wlm munge
  faketime
  python3-torch mpich
  libonnx-dev libprotobuf-dev libonnx-testdata python3-onnx python3-torchvision
  libzip-dev libstb-dev python3-numpy python3-pil
  python3-dev pybind11-dev python3-pytest python3-yaml
  fortunes
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
# Offline Kubernetes schema checks of `shoal submit --engine kubernetes`
# (npm kubernetes-models; its test says so and skips when this failed).
npm_dir="${SHOAL_NPM_DIR:-$HOME/.cache/shoal-npm}"
if command -v npm >/dev/null && [ ! -d "$npm_dir/node_modules/kubernetes-models" ]; then
  mkdir -p "$npm_dir"
  (cd "$npm_dir" && timeout 300 npm install --no-audit --no-fund --silent \
     kubernetes-models@5.1.0 js-yaml@4) || echo "install-deps: npm install kubernetes-models failed" >&2
fi
