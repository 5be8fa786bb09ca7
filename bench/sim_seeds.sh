#!/bin/bash
# Shoal's policy against topology-aware EASY backfill on seeds 1..4, on the
# default 1,000-node cluster and on 64 nodes (docs/BENCHMARKS.md, "The
# simulator, like with like"). Deterministic: the same binary prints the
# same figures. Usage: [SEEDS="1 2 ..."] [SIM_FLAGS="..."] bench/sim_seeds.sh [path/to/shoal]
set -euo pipefail
shoal=${1:-build/shoal}
printf '%-6s %-4s %-14s %10s %7s %7s %10s %6s %8s\n' nodes seed policy makespan util goodput "wait p90" jain slowdown
for cluster in "--nodes 1000" "--nodes 64 --per-switch 16"; do
  for seed in ${SEEDS:-1 2 3 4}; do
    # shellcheck disable=SC2086
    timeout 300 "$shoal" simulate $cluster --seed "$seed" --policies backfill-topo shoal ${SIM_FLAGS:-} |
      awk -v n="${cluster#--nodes }" -v s="$seed" '
        /^goodput ceiling/ { printf "%-6s %-4s ceiling %s\n", n + 0, s, $3 }
        /^(backfill-topo|shoal) / {
          printf "%-6s %-4s %-14s %10s %7s %7s %10s %6s %8s\n", n + 0, s, $1, $5, $6, $7, $11, $14, $17
        }'
  done
done
