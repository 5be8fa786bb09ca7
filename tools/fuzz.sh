#!/usr/bin/env bash
# Builds tests/fuzz/wire_fuzz.cc and tests/fuzz/cluster_fuzz.cc with clang's
# libFuzzer + ASan + UBSan and runs each for FUZZ_SECONDS (default 60) from a
# small seed corpus of valid inputs. Exits non-zero on any crash or sanitizer report.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${FUZZ_SECONDS:-60}"
out=build-fuzz
mkdir -p "$out/corpus"
CXX="${CXX_FUZZ:-clang++-14}"
"$CXX" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -DSPDLOG_FMT_EXTERNAL -Iinclude -Isrc \
  tests/fuzz/wire_fuzz.cc src/net/socket.cc src/net/auth.cc src/net/http_head.cc src/comm/handshake.cc src/core/status.cc src/core/env.cc \
  src/ps/wire.cc src/ps/codec.cc src/tensor/tensor.cc src/tensor/dtype.cc \
  -lfmt -lsodium -o "$out/wire_fuzz"
# Seeds: a valid data frame, a store request, a hello and a store challenge.
printf 'SHOL\x02\x00\x04\x00\x04\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x01\x01\x00\x00\x00\x00\x00\x00abcd' > "$out/corpus/frame"
printf 'S\x01\x00\x00\x00k\x01\x00\x00\x00v\x00\x00\x00\x00' > "$out/corpus/store"
printf '\x01\x00\x00\x00\x02\x00\x00\x000123456789abcdef' > "$out/corpus/hello"
printf '0123456789abcdef0123456789abcdef0123456789abcdef' > "$out/corpus/store-challenge"
printf 'P\x01\x00\x00\x00\x01\x00\x00\x00k\x02\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x01\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\x40' > "$out/corpus/ps-push"
printf 'X\x01\x00\x00\x00\x01\x00\x00\x00k\x02\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xd0\x3f\x00\x01\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\x40' > "$out/corpus/ps-pushpull"
printf 'P\x01\x00\x00\x00\x01\x00\x00\x00k\x02\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x01\x05\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x3f\x19\x02' > "$out/corpus/ps-push-2bit"
printf 'S\x01\x00\x00\x00\x01\x00\x00\x00k\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x01\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\x40' > "$out/corpus/ps-pushrows"
printf 'R\x01\x00\x00\x00\x01\x00\x00\x00k\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x01\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\x40' > "$out/corpus/ps-pushrowspull"
printf 'W\x01\x00\x00\x00k\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00' > "$out/corpus/ps-pullrows"
printf 'C\x0b\x00\x00\x00mode=sync lr' > "$out/corpus/ps-config"
printf 'H\x02\x00\x00\x00' > "$out/corpus/ps-heartbeat"
printf 'Y\x01\x00\x00\x00\x01\x00\x00\x00k\x02\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xd0\x3fd\x00\x00\x00\x01\x02\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00\x40\x00\x00\x00\x00\x00\x00\x00' > "$out/corpus/ps-shmpushpull"
printf 'POST /shoal/filter HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\n{}' > "$out/corpus/http"
printf 'M\x01\x00\x00\x00d\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00\x08\x00\x00\x00\x00\x00\x00\x00' > "$out/corpus/ps-mapcheck"
"$out/wire_fuzz" -max_total_time="$secs" -max_len=4096 -print_final_stats=1 "$out/corpus" 2>&1 | tail -15

# The cluster module's text parsers (job specs, cluster models, Slurm's files).
"$CXX" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -DSPDLOG_FMT_EXTERNAL -Iinclude -Isrc \
  tests/fuzz/cluster_fuzz.cc src/cluster/spec.cc src/cluster/topology.cc src/cluster/hostlist.cc \
  src/cluster/slurm_topology.cc src/cluster/yaml_fields.cc src/cluster/placer.cc \
  src/cluster/state.cc src/cluster/cost.cc src/core/status.cc src/core/file.cc \
  src/train/checkpoint_index.cc src/core/env.cc src/cluster/extender.cc \
  -lfmt -lyaml-cpp -o "$out/cluster_fuzz"
mkdir -p "$out/cluster-corpus"
printf '\x00name: a\nranks: 4\naccels_per_rank: 1\nlinks: ring\n\x00generate: {nodes: 4, per_switch: 2, accels: 4, links: ring}\n' > "$out/cluster-corpus/place"
printf '\x01switches: [{name: s}]\nnodes: [{name: "n[1-2]", accels: 4, links: mesh 2x2, switch: s}]\n' > "$out/cluster-corpus/topology"
printf '\x02SwitchName=s1 Nodes=n[1-2]\nSwitchName=t Switches=s1\n\x00NodeName=n1 CPUTot=2 RealMemory=4000 Gres=gpu:4\nNodeName=n2 CPUTot=2 RealMemory=4000\n' > "$out/cluster-corpus/slurm"
printf '\x03{"metadata": {"format": "shoal-checkpoint-1", "shards": "2", "step": "4"}, "weight_map": {"param/a": "model-00001-of-00002.safetensors", "opt/a/m": "model-00002-of-00002.safetensors"}}' > "$out/cluster-corpus/checkpoint-index"
printf '\x04{"Pod": {"metadata": {"name": "r-0", "labels": {"shoal.dev/job": "r", "shoal.dev/ranks": "2", "shoal.dev/links": "ring", "batch.kubernetes.io/job-completion-index": "1"}}, "spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "2", "memory": "4Gi"}}}]}}, "NodeNames": ["n1", "n2"]}' > "$out/cluster-corpus/extender"
# Inputs that once crashed a parser stay in the corpus, so they are run first every time.
cp tests/fuzz/regressions/cluster-* "$out/cluster-corpus/"
"$out/cluster_fuzz" -max_total_time="$secs" -max_len=4096 -print_final_stats=1 "$out/cluster-corpus" 2>&1 | tail -15
