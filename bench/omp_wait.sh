#!/bin/bash
# OpenMP wait policies, idle and beside 2 busy processes (`yes`): CNN img/s
# and GPT tok/s at --threads 1 and 2 under libgomp's default (spin 300,000
# times, then sleep), passive waiting, and a short spin (GOMP_SPINCOUNT=10000). Each value is one run of
# 80 (CNN) or 60 (GPT) steps. usage: bash bench/omp_wait.sh [build/shoal]
B=${1:-build/shoal}
cnn() {
  local t=$1; shift; rm -rf /tmp/omp_wait_run
  env "$@" $B train --model cnn --threads $t --max-steps 80 --limit-train 8192 --limit-test 64 \
    --no-plot --quiet --no-checkpoints --out /tmp/omp_wait_run 2>&1 | sed -n 's/.*, \([0-9]*\) img\/s.*/\1/p'
}
gpt() {
  local t=$1; shift; rm -rf /tmp/omp_wait_run
  env "$@" $B train --model gpt --data text:/usr/share/games/fortunes/cookie --layers 2 --heads 4 \
    --dim 64 --context 64 --batch 32 --optimizer adam --lr 0.003 --threads $t --max-steps 60 \
    --limit-test 64 --no-plot --quiet --no-checkpoints --out /tmp/omp_wait_run 2>&1 |
    sed -n 's/.*, \([0-9]*\) tok\/s.*/\1/p'
}
echo "| model | host | threads 1 | threads 2, libgomp default | threads 2, passive | threads 2, spin 10k |"
echo "|---|---|---|---|---|---|"
for load in idle loaded; do
  if [ $load = loaded ]; then (yes > /dev/null & yes > /dev/null & wait) & LP=$!; sleep 1; fi
  for m in cnn gpt; do
    for rep in 1 2; do
      echo "| $m | $load | $($m 1 GOMP_SPINCOUNT=300000) | $($m 2 GOMP_SPINCOUNT=300000) |" \
           "$($m 2 OMP_WAIT_POLICY=passive) | $($m 2 GOMP_SPINCOUNT=10000) |"
    done
  done
  if [ $load = loaded ]; then pkill -x yes; wait $LP 2>/dev/null; fi
done
