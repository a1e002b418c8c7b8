#!/usr/bin/env bash
# Tokenizer cost per Generate request (issue 17): runs the load generator
# with a text prompt against a running server and reads, from its /metrics,
# the tokenizer time (fusedserve_tokenizer_seconds: the prompt's encoding and
# the stream's incremental decoding + stop matching) beside the requests'
# own time (fusedserve_request_duration_seconds{rpc="Generate"}).
#
# usage: bench/tokenizer_cost.sh GRPC_HOST:PORT METRICS_HOST:PORT [loadgen flags...]
#   default: --max_new_tokens=128 --concurrency=64 --duration_s=15, a ~500-byte prompt
# env: LOADGEN (default build-cpu/bench/fusedserve_loadgen)
set -euo pipefail
target=$1 metrics=$2
shift 2
loadgen=${LOADGEN:-build-cpu/bench/fusedserve_loadgen}
prompt=$(python3 -c "print(('The quick brown fox jumps over the lazy dog. Grüße, 世界! ' * 8)[:480])")
scrape() {
  python3 - "$metrics" <<'PY'
import re, sys, urllib.request
body = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=10).read().decode()
def val(pat):
    m = re.search(pat + r" ([0-9.e+-]+)", body)
    return float(m.group(1)) if m else 0.0
print(val(r'fusedserve_tokenizer_seconds_sum\{op="encode"\}'), val(r'fusedserve_tokenizer_seconds_sum\{op="decode"\}'),
      val(r'fusedserve_tokenizer_seconds_count\{op="encode"\}'),
      val(r'fusedserve_request_duration_seconds_sum\{op="",rpc="Generate"\}'),
      val(r'fusedserve_request_duration_seconds_count\{op="",rpc="Generate"\}'),
      val(r'fusedserve_generated_tokens_total'))
PY
}
read -r e0 d0 n0 r0 c0 g0 < <(scrape)
start=$(date +%s.%N)
"$loadgen" --target="$target" --rpc=generate --prompt_text="$prompt" --max_new_tokens=128 --concurrency=64 \
  --duration_s=15 --warmup_s=2 "$@"
end=$(date +%s.%N)
read -r e1 d1 n1 r1 c1 g1 < <(scrape)
python3 - "$e0" "$d0" "$n0" "$r0" "$c0" "$g0" "$e1" "$d1" "$n1" "$r1" "$c1" "$g1" "$start" "$end" <<'PY'
import sys
e0, d0, n0, r0, c0, g0, e1, d1, n1, r1, c1, g1, t0, t1 = map(float, sys.argv[1:])
n, enc, dec, req = n1 - n0, e1 - e0, d1 - d0, r1 - r0
if n <= 0:
    sys.exit("no text Generate requests were recorded")
print(f"text requests: {n:.0f}; per request: encode {enc / n * 1e6:.1f} us, decode {dec / n * 1e6:.1f} us, "
      f"request {req / (c1 - c0) * 1e3:.1f} ms; decode per generated token {dec / max(g1 - g0, 1) * 1e6:.2f} us")
print(f"tokenizer share of request time: {(enc + dec) / req * 100:.4f} %")
# Decoding runs on the engine thread, serially with the forward steps.
print(f"engine-thread share (decode time / wall time): {dec / (t1 - t0) * 100:.4f} %")
PY
