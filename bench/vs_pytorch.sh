#!/usr/bin/env bash
# The medium config (d 768, 12 layers, 12 heads of 64, MLP 3072, 4 x 512 tokens, vocab 32000; 162M parameters)
# trained a few steps by remat (remat_policy full and none, attention dot_product and flash) and, when PyTorch is
# installed (python3-torch with libopenblas0-openmp, 2 threads), by bench/torch_peer.py (checkpoint per layer or
# none), in the same run, f32 and bf16: step time (the median of the steps after the first), peak RSS, and each
# remat row's time over PyTorch's without checkpointing. PyTorch's CPU allocator hands large blocks back to the
# OS every step, and page faults are slow on these machines: with Debian's libjemalloc2 installed the peer runs
# under jemalloc (retaining its pages, as production PyTorch CPU jobs do), which makes it faster and fairer.
#   bench/vs_pytorch.sh [build/remat] [steps]
set -euo pipefail
remat=$(realpath "${1:-build/remat}")
steps=${2:-3}
here=$(dirname "$(realpath "$0")")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model="base_emb_dim=768 base_num_decoder_layers=12 base_num_query_heads=12 base_num_kv_heads=12 head_dim=64 \
base_mlp_dim=3072 max_target_length=512 per_device_batch_size=4 vocab_size=32000 steps=$steps eval_interval=1000 \
sample_length=0 log_period=1"
ms_of() { grep -o '[0-9.]* ms/step' <<<"$1" | tail -n +2 | awk '{print $1}' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
jemalloc=""
[ -e /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 ] && jemalloc=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
for dtype in float32 bfloat16; do
  torch_ms=""
  if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    for ckpt in "" "--checkpoint"; do
      line=$(LD_PRELOAD="$jemalloc" MALLOC_CONF="retain:true,dirty_decay_ms:-1,muzzy_decay_ms:-1" \
        /usr/bin/python3 "$here/torch_peer.py" --dtype "$dtype" --steps "$steps" $ckpt)
      [ -n "$jemalloc" ] && line="$line (jemalloc)"
      echo "$line"
      [ -z "$ckpt" ] && torch_ms=$(grep -o '[0-9]* ms/step' <<<"$line" | awk '{print $1}')
    done
  fi
  for policy in full none; do
    for attention in dot_product flash; do
      out=$(cd "$work" && "$remat" train $model dtype="$dtype" remat_policy="$policy" attention="$attention" 2>&1)
      ms=$(ms_of "$out")
      rss=$(grep -o 'peak RSS [0-9.]* [GMK]iB' <<<"$out" | head -1)
      ratio=""
      [ -n "$torch_ms" ] && ratio=$(awk -v a="$ms" -v b="$torch_ms" 'BEGIN {printf ", %.2fx PyTorch without checkpointing", a / b}')
      echo "remat $dtype remat_policy=$policy attention=$attention: $ms ms/step, $rss$ratio"
    done
  done
done
