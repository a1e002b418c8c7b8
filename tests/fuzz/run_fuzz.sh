#!/usr/bin/env bash
# Builds the FusedOp and tokenizer fuzz targets with clang (libFuzzer + AddressSanitizer +
# UBSan) and runs each for a bounded time. Used by ctest (label "fuzz", 60 s)
# and by hand for longer runs:
#   tests/fuzz/run_fuzz.sh [--seconds N] [--out DIR] [--jobs J] [target...]
#     --seconds N  total fuzzing time, split evenly over the targets (default 60)
#     --out DIR    build products, corpora and crash inputs (default build-fuzz)
#     --jobs J     parallel compiles (default 2)
#     targets      fuzz_fused_op (raw protobuf bytes), fuzz_fused_op_structured
#                  (mutated valid requests), fuzz_tokenizer (text and ids
#                  through the tokenizer); default all three
# The protobuf code is generated here with protoc, so no CMake build is
# needed. Corpora persist in DIR/corpus-<target> between runs. Exit status 1
# when a target crashed; the input is saved as DIR/crash-<target>-*.
# Needs clang++-14 and libclang-rt-14-dev (deploy/install-deps.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/../.."
src=$PWD

seconds=60
out=build-fuzz
jobs=2
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_fused_op fuzz_fused_op_structured fuzz_tokenizer)

cxx=""
for c in clang++-14 clang++; do
  if command -v "$c" >/dev/null; then cxx=$c; break; fi
done
if [ -z "$cxx" ]; then
  echo "run_fuzz: clang++ not found (deploy/install-deps.sh installs clang)" >&2
  exit 2
fi

mkdir -p "$out/gen" "$out/obj"
out=$(cd "$out" && pwd)

# Generated protobuf messages (no gRPC stubs needed).
pb=$out/gen/fusedserve/v1/fusedserve.pb.cc
if [ ! -f "$pb" ] || [ "$src/proto/fusedserve/v1/fusedserve.proto" -nt "$pb" ]; then
  protoc -I "$src/proto" --cpp_out "$out/gen" "$src/proto/fusedserve/v1/fusedserve.proto"
fi

libs=$(pkg-config --libs protobuf absl_status absl_statusor absl_strings absl_str_format absl_synchronization \
  absl_time absl_hash absl_raw_hash_set prometheus-cpp-core prometheus-cpp-pull libpcre2-8 icu-uc grpc++)
cflags="-std=c++17 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined \
  -fno-sanitize-recover=undefined -I$src -I$out/gen $(pkg-config --cflags protobuf absl_status)"

# Library sources: request validation, the op vocabulary, the CPU reference
# backend (run on every valid input), the FusedOp wire codec, the batcher's merge/split, and the tokenizer.
sources=("$pb" server/validation.cc server/fused_op_wire.cc server/batcher.cc server/direct_scheduler.cc telemetry/metrics.cc telemetry/log.cc
  kernels/dtype.cc kernels/tensor.cc kernels/op.cc kernels/ops/*.cc kernels/cpu/*.cc tokenizer/*.cc
  warmup/regular_file.cc)
objects=()
pids=()
for s in "${sources[@]}"; do
  o=$out/obj/$(echo "${s#"$src"/}" | tr '/' '_').o
  objects+=("$o")
  # Rebuild when the source or any header of the project changed.
  if [ ! -f "$o" ] || [ "$s" -nt "$o" ] || [ -n "$(find server kernels telemetry tokenizer warmup -name '*.h' -newer "$o" | head -1)" ]; then
    $cxx $cflags -w -c "$s" -o "$o" &
    pids+=($!)
    if [ ${#pids[@]} -ge "$jobs" ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
  fi
done
for p in "${pids[@]}"; do wait "$p"; done

status=0
per_target=$(( seconds / ${#targets[@]} ))
[ "$per_target" -ge 1 ] || per_target=1
for t in "${targets[@]}"; do
  bin=$out/$t
  if [ ! -f "$bin" ] || [ "tests/fuzz/$t.cc" -nt "$bin" ] || [ tests/fuzz/fuzz_common.h -nt "$bin" ] ||
     [ -n "$(find "$out/obj" -newer "$bin" | head -1)" ]; then
    $cxx $cflags -fsanitize=fuzzer "tests/fuzz/$t.cc" "${objects[@]}" $libs -o "$bin"
  fi
  corpus=$out/corpus-$t
  mkdir -p "$corpus"
  if [ "$t" = fuzz_fused_op ] && [ -z "$(ls -A "$corpus")" ]; then
    FUSEDSERVE_FUZZ_WRITE_SEEDS=$corpus "$bin" -runs=0 >/dev/null 2>&1 || true
  fi
  if [ "$t" = fuzz_tokenizer ] && [ -z "$(ls -A "$corpus")" ]; then
    # First byte: which tokenizer (and bit 2: add special tokens); then text.
    printf '\x00Hello world <|eot|> caf\xc3\xa9 \xf0\x9f\x98\x80' >"$corpus/seed0"
    printf "\x01It's   <|eot|>  123456\n\n\xe4\xb8\xad" >"$corpus/seed1"
    printf '\x02hi h\xc3\xa9 <s>x</s>' >"$corpus/seed2"
    printf '\x07  hi  \xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb' >"$corpus/seed3"
  fi
  log=$out/$t.log
  echo "run_fuzz: $t for ${per_target} s (corpus $corpus)"
  set +e
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
    "$bin" "$corpus" -max_total_time="$per_target" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$out/crash-$t-" >"$log" 2>&1
  rc=$?
  set -e
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  if [ $rc -eq 0 ]; then
    echo "run_fuzz: $t: $runs executions, ${cov:-cov: ?}, no crash"
  else
    echo "run_fuzz: $t: CRASH (exit $rc) after $runs executions; input saved as $out/crash-$t-*; log $log" >&2
    grep -E 'ERROR|fuzz property|SUMMARY|#[0-9] ' "$log" | head -30 >&2
    status=1
  fi
done
exit $status
