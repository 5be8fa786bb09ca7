#!/bin/bash
# Shoal's policy against topology-aware EASY backfill on seeds 1..4, on the
# default 1,000-node cluster and on 64 nodes (docs/BENCHMARKS.md, "The
# simulator, like with like"). Deterministic: the same binary prints the
# same figures. util(w) is the utilization while some job waits. Usage: [SEEDS="1 2 ..."] [SIM_FLAGS="..."] bench/sim_seeds.sh [path/to/shoal]
set -euo pipefail
shoal=${1:-build/shoal}
printf '%-6s %-4s %-14s %10s %7s %7s %9s %10s %6s %8s\n' nodes seed policy makespan util goodput \
  "util(w)" "wait p90" jain slowdown
for cluster in "--nodes 1000" "--nodes 64 --per-switch 16"; do
  for seed in ${SEEDS:-1 2 3 4}; do
    # shellcheck disable=SC2086
    timeout 300 "$shoal" simulate $cluster --seed "$seed" --policies backfill-topo shoal ${SIM_FLAGS:-} |
      awk -v n="${cluster#--nodes }" -v s="$seed" '
        /^goodput ceiling/ { printf "%-6s %-4s ceiling %s\n", n + 0, s, $3 }
        /^(backfill-topo|shoal) / {
          # util(w): utilization while some job waits ("99.5%/ 26.0%" or "99.5%/100.0%")
          split($8, w, "/"); off = (w[2] == "") ? 1 : 0
          printf "%-6s %-4s %-14s %10s %7s %7s %9s %10s %6s %8s\n", n + 0, s, $1, $5, $6, $7, w[1],
            $(10 + off), $(13 + off), $(16 + off)
        }'
  done
done
