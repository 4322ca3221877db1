#!/usr/bin/env bash
# The pipeline bubble measured from traces (enable_profiler) against the schedules' formulas: (p-1)/(m+p-1) for
# GPipe and 1F1B, (p-1)/(v·m+p-1) for interleaved 1F1B; for ZB-H1, whose bubble depends on the W part's share
# ((p-1)(T_F + T_B - T_W) idle per rank), against the simulated bubble of `remat plan` (costs from FLOPs), shown
# for 1F1B too. Two stages, so that each rank has a core of its own on a
# 2-core machine (more ranks than cores measure the contention, not the schedule); layers large next to the
# embedding and the head, so that the stages cost about the same.
#   bench/pipeline_bubble.sh [build/remat]
set -euo pipefail
remat=$(realpath "${1:-build/remat}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
model="base_emb_dim=512 base_num_decoder_layers=8 base_num_query_heads=8 base_num_kv_heads=8 head_dim=64 \
base_mlp_dim=2048 max_target_length=128 per_device_batch_size=4 steps=3 eval_interval=100 eval_steps=1 \
sample_length=1 enable_profiler=true skip_first_n_steps_for_profiler=2 ici_pipeline_parallelism=2"
run() {  # schedule, layers per stage, microbatches, expected bubble[, more keys]
  local out
  out=$(cd "$work" && mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 "${root[@]}" -np 2 "$remat" train \
    $model pipeline_schedule="$1" num_layers_per_pipeline_stage="$2" num_pipeline_microbatches="$3" ${5:-} run_name=b 2>&1)
  printf '%-17s m=%s %-21s expected %5.1f%%  measured per rank: %s, %s\n' "$1" "$3" "${5:-}" "$4" \
    "$(grep -o 'bubble): .*' <<<"$out" | cut -d' ' -f2-)" "$(grep -o '[0-9.]* ms/step' <<<"$out" | tail -1)"
}
run gpipe 4 4 20.0
run 1f1b 4 4 20.0
run 1f1b 4 8 11.1
run interleaved_1f1b 2 4 11.1
planned() {  # schedule, layers per stage, microbatches, more keys: rank 0's simulated bubble in the plan, in %
  "$remat" plan $model pipeline_schedule="$1" num_layers_per_pipeline_stage="$2" num_pipeline_microbatches="$3" $4 --json |
    python3 -c 'import json, sys; print(round(100 * json.load(sys.stdin)["pipeline"]["ranks"][0]["bubble"], 1))'
}
# Under `minimal` (under `full`, W recomputes the forward again: the extra work eats what the bubble saves here).
for m in 4 8; do
  run 1f1b 4 $m "$(planned 1f1b 4 $m remat_policy=minimal)" remat_policy=minimal
  run zb_h1 4 $m "$(planned zb_h1 4 $m remat_policy=minimal)" remat_policy=minimal
done
