#!/usr/bin/env bash
# Runs the issue's load-generator matrix against a fresh local server: FusedOp
# rms_norm [M=1, H=4096] at concurrency 1 and 64, with batching on and off,
# and prints one summary table (JSON per run under --out).
#   bench/loadgen_matrix.sh [--build DIR] [--device auto|cuda|cpu] [--duration S]
#                           [--dtype bf16] [--shape 1,4096] [--op rms_norm] [--out DIR]
#                           [-- extra server flags...]
# The tuning cache is $TUNING_CACHE (default /tmp/fusedserve-loadgen-tuning.json),
# so only the first server start of a CUDA build tunes; the load generator
# waits for warm-up to end.
set -euo pipefail
cd "$(dirname "$0")/.."

build=build
device=auto
duration=10
dtype=bf16
shape=1,4096
op=rms_norm
out=loadgen-results
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    --shape) shape=$2; shift 2 ;;
    --op) op=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
server=$build/fusedserve
loadgen=$build/bench/fusedserve_loadgen
[ -x "$server" ] && [ -x "$loadgen" ] || { echo "build $server and $loadgen first" >&2; exit 2; }
mkdir -p "$out"
port=$((20000 + RANDOM % 20000))
mport=$((port + 1))

for batching in true false; do
  "$server" serve --device="$device" --listen=127.0.0.1:$port --metrics_listen=127.0.0.1:$mport \
    --tuning_cache="${TUNING_CACHE:-/tmp/fusedserve-loadgen-tuning.json}" --batching=$batching "${extra[@]}" >"$out/server-batching-$batching.log" 2>&1 &
  pid=$!
  for c in 1 64; do
    "$loadgen" --target=127.0.0.1:$port --metrics=127.0.0.1:$mport --op="$op" --dtype="$dtype" --shape="$shape" \
      --concurrency=$c --duration_s="$duration" --warmup_s=2 --wait_ready_s=1800 --label="batching=$batching" \
      --json_out="$out/c$c-batching-$batching.json"
  done
  kill -TERM $pid
  wait $pid || true
done

python3 - "$out" <<'EOF'
import json, sys, glob, os
rows = []
for f in sorted(glob.glob(os.path.join(sys.argv[1], "c*-batching-*.json"))):
    r = json.load(open(f))
    l = r["latency_us"]
    rows.append((r["label"], r["concurrency"], r["throughput_rps"], l["p50"], l["p99"], l["max"],
                 r.get("server_mean_batch_size", 0), r["errors"], r.get("device_name", "?")))
print(f"{'':16} {'conc':>4} {'req/s':>10} {'p50_us':>8} {'p99_us':>8} {'max_us':>9} {'batch':>6} {'errors':>6}  device")
for row in rows:
    print(f"{row[0]:16} {row[1]:4d} {row[2]:10.0f} {row[3]:8.1f} {row[4]:8.1f} {row[5]:9.1f} {row[6]:6.2f} {row[7]:6d}  {row[8]}")
by = {(r[0], r[1]): r[2] for r in rows}
if ("batching=true", 64) in by and ("batching=false", 64) in by and by[("batching=false", 64)] > 0:
    print(f"concurrency 64: batching gives {by[('batching=true', 64)] / by[('batching=false', 64)]:.2f}x the throughput")
EOF
