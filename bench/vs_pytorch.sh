#!/usr/bin/env bash
# The speed bars of a remat step, in one run (docs/performance.md, "Profile, and remat against PyTorch").
# The medium config (d 768, 12 layers, 12 heads of 64, MLP 3072, 4 x 512 tokens, vocab 32000; 162M parameters),
# f32 and bf16:
#  - remat full, minimal and none, attention dot_product and flash: the step (the median of the steps after the
#    first), peak RSS, its matmul floor (exec::matmul_floor: its matmuls' and
#    attention's FLOPs at the rate oneDNN reaches on the same shapes run alone, in the same process) and the median
#    step of that process as a multiple of it, and the step over PyTorch's without checkpointing;
#  - PyTorch (bench/torch_peer.py: the same architecture, 2 threads) with a checkpoint per layer and without;
#  - remat_policy=auto with hbm_limit at PyTorch's checkpointed peak RSS, over PyTorch's checkpointed step. On a
#    CPU the host arena is the same RAM as the "device": host_limit=1B keeps auto from offloading, so that the
#    whole step (peak RSS) is within the budget.
# With --long, the same width at 4096 and 8192 tokens (batch 1; or the lengths given after --long): PyTorch
# checkpointed and not (under a 24 GiB address-space limit: where it runs out of memory), remat with auto under
# PyTorch's checkpointed peak (flash and dot_product attention) and under half of it (flash, the logits in tiles); in bf16, or in f32 where the CPU has no
# AVX512_BF16: there the bf16 PyTorch peer is not run (it takes minutes a step), neither at 512 tokens.
# PyTorch's CPU allocator hands large blocks back to the OS every step, and page faults are slow on these
# machines: with Debian's libjemalloc2 installed the peer runs under jemalloc (retaining its pages, as production
# PyTorch CPU jobs do), with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset; it prints the OpenBLAS core it runs.
#   bench/vs_pytorch.sh [build/remat] [steps] [--long|--long-only [LENGTH...]]   (--long-only: no 512-token rows;
#   REMAT_BENCH_DTYPES=bfloat16: those rows in bf16 alone)
set -euo pipefail
remat=$(realpath "${1:-build/remat}")
steps=${2:-4}
long=${3:-}
shift $(($# < 3 ? $# : 3))
long_lengths=${*:-4096 8192}
here=$(dirname "$(realpath "$0")")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
width="base_emb_dim=768 base_num_decoder_layers=12 base_num_query_heads=12 base_num_kv_heads=12 head_dim=64 \
base_mlp_dim=3072 vocab_size=32000"
# A run ends with a validation loss, not part of a step: one batch of it (eval_steps=8 took ~3.5 min at 8192 tokens).
run_keys="eval_interval=100000 eval_steps=1 sample_length=0 log_period=1"
jemalloc=""
[ -e /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 ] && jemalloc=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
have_torch=0
/usr/bin/python3 -c 'import torch' 2>/dev/null && have_torch=1
torch_bf16=1 no_torch_bf16="not run (this CPU has no AVX512_BF16: PyTorch's bf16 CPU matmuls take minutes a step)"
grep -q avx512_bf16 /proc/cpuinfo || torch_bf16=0

# The median of the steps after the first.
ms_of() { grep -o '[0-9.]* ms/step' <<<"$1" | sed '1d' | awk '{print $1}' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
gib_of() { grep -o 'peak RSS [0-9.]* [GMK]iB' <<<"$1" | head -1 | awk '{v=$3; if ($4=="MiB") v/=1024; if ($4=="KiB") v/=1048576; print v}'; }

# torch DTYPE SEQ BATCH [--checkpoint] [LIMIT_KIB]: the peer's line (ms/step, peak RSS), or why it failed.
torch() {
  local dtype=$1 seq=$2 batch=$3 ckpt=${4:-} limit=${5:-unlimited} line
  line=$( (ulimit -v "$limit"; env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE LD_PRELOAD="$jemalloc" \
    MALLOC_CONF="retain:true,dirty_decay_ms:-1,muzzy_decay_ms:-1" /usr/bin/python3 "$here/torch_peer.py" \
    --dtype "$dtype" --steps 3 --seq "$seq" --batch "$batch" $ckpt) 2>&1 | tail -1) || true
  echo "$line"
}
torch_ms() { grep -o '[0-9]* ms/step' <<<"$1" | awk '{print $1}'; }
torch_gib() { grep -o 'peak RSS [0-9.]* GiB' <<<"$1" | awk '{print $3}'; }

# remat LABEL KEYS...: one row. The step and peak RSS come from a run of `steps` steps; the floor from a second
# run of 5 steps that profiles its third and times the floor's shapes right after it (they would add to the first
# run's peak RSS). The row's step / floor is that second run's: the median of its steps 2 to 5 (the traced one
# as the trace timed it: its log line also holds the floor's timing) over the floor timed amid them, all in one
# process, so that a slow or fast minute of a noisy machine moves both alike (across runs minutes apart, the same
# binary's step moved by 12%), and one step in a slow burst does not decide the row (a single traced step moved
# its row's ratio from 1.18x to 1.35x between runs). A profiled run that fails (at 8192 tokens the floor's own
# operands can exhaust the RAM) leaves the row without its floor rather than ending the bench.
remat_row() {
  local label=$1 out profiled floor traced ratio=""
  shift
  out=$(cd "$work" && "$remat" train $width $run_keys steps="$steps" "$@" 2>&1) ||
    { echo "| $label | failed: $(tail -1 <<<"$out") |"; return; }
  ms=$(ms_of "$out")
  gib=$(gib_of "$out")
  [ -n "$base_ms" ] && ratio=$(awk -v a="$ms" -v b="$base_ms" 'BEGIN {printf "%.2fx", a / b}')
  profiled=$(cd "$work" && "$remat" train $width $run_keys steps=5 enable_profiler=true \
    skip_first_n_steps_for_profiler=2 "$@" 2>&1) || true
  floor=$(grep -o 'matmul floor of step [0-9]*: [0-9.]* ms' <<<"$profiled" | awk '{print $6}') || true
  traced=$(grep -o 'the step took [0-9.]* ms' <<<"$profiled" | awk '{print $4}') || true
  around=$(grep -o '[0-9.]* ms/step' <<<"$profiled" | awk 'NR == 2 || NR >= 4 {print $1}') || true
  if [ -z "$floor" ] || [ -z "$traced" ] || [ "$(wc -w <<<"$around")" != 3 ]; then
    awk -v l="$label" -v ms="$ms" -v g="$gib" -v r="$ratio" -v why="$(tail -1 <<<"$profiled")" \
      'BEGIN {printf "| %s | %.2f s | %.2f GiB | profiled run failed: %s | | %s |\n", l, ms / 1e3, g, why, r}'
    return
  fi
  median=$(printf '%s\n' $around "$traced" | sort -n | awk '{a[NR] = $1} END {print (a[2] + a[3]) / 2}')
  awk -v l="$label" -v ms="$ms" -v g="$gib" -v f="$floor" -v t="$traced" -v m="$median" -v r="$ratio" \
    'BEGIN {printf "| %s | %.2f s | %.2f GiB | %.2f s (traced %.2f s) : %.2f s | %.2fx | %s |\n", l, ms / 1e3, g, m / 1e3,
            t / 1e3, f / 1e3, m / f, r}'
}

if [ $have_torch = 1 ]; then
  /usr/bin/python3 -c 'import ctypes, torch
try:
    lib = ctypes.CDLL("libopenblas.so.0")
    lib.openblas_get_corename.restype = ctypes.c_char_p
    core = lib.openblas_get_corename().decode()
except OSError:
    core = "none found"
print(f"PyTorch {torch.__version__}, OpenBLAS core {core}", end="")'
  echo ", jemalloc: ${jemalloc:-no}"
fi
echo "remat: $("$remat" --version 2>/dev/null || echo "$remat"), $(nproc) cores, $steps steps per row"
for dtype in ${REMAT_BENCH_DTYPES:-float32 bfloat16}; do
  [ "$long" = "--long-only" ] && break
  echo
  base_ms="" ckpt_ms="" ckpt_gib=""
  if [ $have_torch = 1 ] && [ $dtype = bfloat16 ] && [ $torch_bf16 = 0 ]; then
    echo "PyTorch bfloat16: $no_torch_bf16"
  elif [ $have_torch = 1 ]; then
    none=$(torch "$dtype" 512 4) ckpt=$(torch "$dtype" 512 4 --checkpoint)
    echo "$none"
    echo "$ckpt"
    base_ms=$(torch_ms "$none") ckpt_ms=$(torch_ms "$ckpt") ckpt_gib=$(torch_gib "$ckpt")
  fi
  echo "| $dtype, 4 x 512 | step | peak RSS | profiled run's steps 2-5, median : matmul floor | step / floor | step / PyTorch without checkpointing |"
  echo "|---|---|---|---|---|---|"
  for policy in full minimal none; do
    for attention in dot_product flash; do
      remat_row "remat $policy, $attention" max_target_length=512 per_device_batch_size=4 dtype="$dtype" \
        remat_policy="$policy" attention="$attention"
    done
  done
  if [ -n "$ckpt_gib" ]; then
    base_ms=$ckpt_ms
    echo "| auto under PyTorch's checkpointed peak ($ckpt_gib GiB) | | | | | step / PyTorch checkpointed |"
    for attention in dot_product flash; do
      remat_row "remat auto, $attention" max_target_length=512 per_device_batch_size=4 dtype="$dtype" \
        remat_policy=auto hbm_limit="${ckpt_gib}GiB" host_limit=1B attention="$attention"
    done
  fi
done
[ "$long" = "--long" ] || [ "$long" = "--long-only" ] || exit 0
long_dtype=bfloat16 short=bf16
if [ $have_torch = 1 ] && [ $torch_bf16 = 0 ]; then
  long_dtype=float32 short=f32
  echo
  echo "Long sequences in float32: PyTorch bfloat16 $no_torch_bf16"
fi
for seq in $long_lengths; do
  echo
  base_ms="" ckpt_gib=""
  if [ $have_torch = 1 ]; then
    ckpt=$(torch "$long_dtype" "$seq" 1 --checkpoint)
    echo "$ckpt"
    echo "no checkpoint, under 24 GiB: $(torch "$long_dtype" "$seq" 1 "" $((24 << 20)))"
    base_ms=$(torch_ms "$ckpt") ckpt_gib=$(torch_gib "$ckpt")
  fi
  echo "| $short, 1 x $seq | step | peak RSS | profiled run's steps 2-5, median : matmul floor | step / floor | step / PyTorch checkpointed |"
  echo "|---|---|---|---|---|---|"
  if [ -n "$ckpt_gib" ]; then
    for attention in flash dot_product; do
      remat_row "remat $attention, auto under $ckpt_gib GiB" max_target_length="$seq" per_device_batch_size=1 \
        dtype="$long_dtype" attention="$attention" remat_policy=auto hbm_limit="${ckpt_gib}GiB" host_limit=1B
    done
    # Half of PyTorch's peak for the whole process: the arenas under it less 0.05 GiB (the binary, libraries and
    # unplanned allocations took 20-30 MiB: 28 MiB at 4096 tokens), the logits in 8 tiles (MaxText's num_vocab_tiling: one tile's
    # [S/8, vocab] logits at a time, recomputed in the backward) instead of [S, vocab] f32 log-probabilities.
    half=$(awk -v g="$ckpt_gib" 'BEGIN {printf "%.2f", g / 2}') arenas=$(awk -v g="$ckpt_gib" 'BEGIN {printf "%.2f", g / 2 - 0.05}')
    remat_row "remat flash, auto under $arenas GiB (half: $half), num_vocab_tiling=8" max_target_length="$seq" \
      per_device_batch_size=1 dtype="$long_dtype" attention=flash remat_policy=auto hbm_limit="${arenas}GiB" \
      host_limit=1B num_vocab_tiling=8
  else
    remat_row "remat flash, remat_policy=full" max_target_length="$seq" per_device_batch_size=1 dtype="$long_dtype" \
      attention=flash remat_policy=full
  fi
done
