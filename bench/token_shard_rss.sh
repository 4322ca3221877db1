#!/usr/bin/env bash
# A 2 GB token shard trains without loading: the reader reads the windows it needs (pread), so the process's peak RSS stays within
# the plans' bytes + 64 MiB (the trainer's "process: peak RSS ... = baseline + planned + unplanned" line). The
# shard (RMTOKENS header, then 1 Gi random uint16 tokens below 256, vocabulary 256) is made in a temporary folder and
# deleted afterwards; nothing is committed. Not part of the test suite (it writes 2 GB).
#   bench/token_shard_rss.sh [build/remat]
set -euo pipefail
remat=$(realpath "${1:-build/remat}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tokens=$((1024 * 1024 * 1024))
shard="$work/big.tokens"
# The header (train/shards.h): magic, version 1, 2 bytes per token, vocabulary, tokens, documents, text bytes;
# then the tokens, little-endian: a random low byte, a zero high byte.
python3 - "$shard" "$tokens" <<'PY'
import os, struct, sys
tokens, chunk = int(sys.argv[2]), 1 << 26
with open(sys.argv[1], "wb") as f:
    f.write(b"RMTOKENS" + struct.pack("<IIQQQQ", 1, 2, 256, tokens, 1, tokens) + bytes(16))
    for _ in range(tokens // chunk):
        ids = bytearray(2 * chunk)
        ids[0::2] = os.urandom(chunk)
        f.write(ids)
PY
echo "shard: $(du -h --apparent-size "$shard" | cut -f1) at $shard"
out=$(cd "$work" && /usr/bin/time -f "wall %e s, max RSS %M KiB (time)" "$remat" train dataset_type=tokens \
  dataset_path="$shard" base_emb_dim=64 base_num_decoder_layers=2 base_mlp_dim=256 head_dim=16 \
  max_target_length=256 per_device_batch_size=8 steps=20 eval_interval=20 eval_steps=4 sample_length=4 \
  log_period=10 run_name=bench 2>&1)
grep -E "^data:|^step|^eval|^done|^process:|wall" <<<"$out"
# peak RSS against planned + 64 MiB, from the trainer's own line.
python3 - "$out" <<'PY'
import re, sys
units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
size = lambda s: float(s.split()[0]) * units[s.split()[1]]
m = re.search(r"process: peak RSS (\S+ \S+) = baseline (\S+ \S+) .*?\+ planned (\S+ \S+)", sys.argv[1])
peak, baseline, planned = (size(g) for g in m.groups())
limit = planned + 64 * 2**20
print(f"peak RSS {peak / 2**20:.1f} MiB, planned {planned / 2**20:.1f} MiB, baseline {baseline / 2**20:.1f} MiB; "
      f"limit planned + 64 MiB = {limit / 2**20:.1f} MiB: {'within' if peak <= limit else 'OVER'}")
sys.exit(0 if peak <= limit else 1)
PY
