#!/usr/bin/env bash
# The fuzz smoke run of `make test`: each libFuzzer harness of fuzz/ for a few seconds, starting from the
# checked-in seeds (fuzz/corpus/<name>, regression inputs included) and writing new inputs to a scratch
# corpus, so the checked-in one never changes. Any crash, hang, leak or sanitizer report fails it; the input
# is kept under <build>/artifacts/. Each run starts from a fixed -seed, so a CI run's mutations repeat (how many
# inputs fit in the time still varies with the machine).
#   bash scripts/fuzz_smoke.sh [BUILD_DIR] [SECONDS_EACH]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-fuzz}
seconds=${2:-15}
seed=1  # libFuzzer's -seed: the same mutations every run
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$build/artifacts"
for name in config policy ir_text safetensors; do
  mkdir -p "$scratch/$name"
  if ! "$build/${name}_fuzz" "$scratch/$name" "fuzz/corpus/$name" -seed="$seed" -max_total_time="$seconds" -timeout=10 \
       -print_final_stats=1 -artifact_prefix="$build/artifacts/$name-" > "$scratch/$name.log" 2>&1; then
    tail -n 60 "$scratch/$name.log"
    echo "fuzz smoke: ${name}_fuzz failed; the input is in $build/artifacts/" >&2
    exit 1
  fi
  echo "fuzz smoke: ${name}_fuzz -seed=$seed: $(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$scratch/$name.log")"
done
