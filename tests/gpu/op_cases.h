// The shapes every op is checked and timed at, one list for the generic GPU
// op test (tests/gpu/op_test.cc) and the benchmarks (bench/gpu_*_bench.cc):
//   - edge cases (bench = false): odd and large sizes, the scalar and
//     streaming paths, GQA ratios, GEMV and cuBLASLt rows;
//   - model shapes (bench = true; Llama-3-8B's dims): the benchmarks time
//     them at their own token counts (the key's token dim is a placeholder,
//     and decode's L too), the test checks them at a few small token counts.
// Header-only: test and benchmark binaries include it directly.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/op.h"

namespace fusedserve::testing {

struct OpCase {
  std::string op;
  std::vector<int64_t> key;  // TuningKey (kernels/op.h)
  Attrs attrs;               // over the op's defaults
  bool bench = false;        // a model shape: token dim (and decode's L) filled by the user
  std::string label;         // model shapes: "rms_norm H=4096"
};

inline std::vector<OpCase> OpCases() {
  std::vector<OpCase> c;
  auto add = [&](const std::string& op, std::vector<int64_t> key, Attrs attrs = {}) {
    c.push_back({op, std::move(key), std::move(attrs), false, ""});
  };
  auto model = [&](const std::string& label, const std::string& op, std::vector<int64_t> key, Attrs attrs = {}) {
    c.push_back({op, std::move(key), std::move(attrs), true, label});
  };
  const Attrs tanh = {{"approximate", std::string("tanh")}};
  const Attrs erf = {{"approximate", std::string("none")}};

  // ---- edge cases ----
  for (const char* op : {"rms_norm", "add_rms_norm", "add_rms_norm_silu", "layer_norm"}) {
    for (int64_t m : {1, 3, 17, 512}) {
      for (int64_t h : {1, 7, 769, 4096, 8192}) add(op, {m, h});
    }
    for (int64_t h : {7, 769, 4096}) add(op, {4099, h});
    add(op, {3, 40000});  // rows longer than the registers hold: the streaming path
  }
  add("rms_norm", {4099, 8192});
  for (int64_t m : {1, 3, 17}) {
    for (int64_t n : {1, 1000, 32000, 128256, 262144}) add("softmax", {m, n});
  }
  for (int64_t n : {1, 1000, 32000}) add("softmax", {512, n});
  for (int64_t n : {1, 1000}) add("softmax", {4099, n});
  add("softmax", {64, 128256});
  add("softmax", {2, 1 << 20});  // past every register-resident config: streaming
  add("softmax", {3, 32001});    // odd: scalar path
  for (int64_t m : {1, 3, 17, 512}) {
    for (int64_t i : {1, 7, 769, 4096, 14336}) add("silu_and_mul", {m, i});
  }
  for (int64_t i : {7, 769}) add("silu_and_mul", {4099, i});
  for (const Attrs& form : {erf, tanh}) {
    for (int64_t m : {1, 3, 17, 512}) {
      for (int64_t h : {1, 7, 769, 4096, 14336}) add("gelu", {m, h}, form);
    }
    for (int64_t h : {7, 769}) add("gelu", {4099, h}, form);
  }
  for (int64_t t : {1, 3, 17, 512, 4099}) {
    add("rope", {t, 32, 8, 128});
    add("rope", {t, 4, 2, 64});
    add("rope", {t, 3, 1, 6});  // D/2 = 3: scalar path
  }
  add("rope", {5, 2, 2, 128}, {{"theta", 10000.0}});
  // linear: GEMV rows (M <= 8), skinny rows (17; 40: the Hopper kernel),
  // cuBLASLt rows, odd N and K (K % 8 != 0: no GEMV).
  for (int64_t m : {1, 3, 17, 40, 1000}) {
    for (auto [n, k] : {std::pair<int64_t, int64_t>{256, 512}, {1001, 520}, {1000, 517}, {7, 33}})
      add("linear", {m, n, k});
  }
  for (int64_t m : {1, 3, 17, 48, 300}) {
    add("swiglu_mlp", {m, 256, 688});
    add("swiglu_mlp", {m, 264, 500});
  }
  add("swiglu_mlp", {5, 512, 1376});
  add("swiglu_mlp", {7, 128, 344});
  // attention: one sequence (varlen and tile edges: compute_test.cc).
  add("attention", {1, 4, 2, 64});
  add("attention", {63, 8, 2, 128});
  add("attention", {130, 8, 8, 128});
  add("attention", {700, 4, 1, 64});
  add("attention_decode", {1, 300, 8, 2, 64});
  add("attention_decode", {3, 129, 4, 4, 128});
  add("attention_decode", {16, 1024, 32, 8, 128});

  // ---- model shapes (Llama-3-8B); 0 marks a dim the user fills ----
  model("rms_norm H=4096", "rms_norm", {0, 4096});
  model("rms_norm H=8192", "rms_norm", {0, 8192});
  model("add_rms_norm H=4096", "add_rms_norm", {0, 4096});
  model("add_rms_norm_silu H=4096", "add_rms_norm_silu", {0, 4096});
  model("layer_norm H=4096", "layer_norm", {0, 4096});
  model("softmax N=32000", "softmax", {0, 32000});
  model("softmax N=128256", "softmax", {0, 128256});
  model("silu_and_mul I=14336", "silu_and_mul", {0, 14336});
  model("gelu_tanh H=14336", "gelu", {0, 14336}, tanh);
  model("gelu_erf H=14336", "gelu", {0, 14336}, erf);
  model("rope 32x8x128", "rope", {0, 32, 8, 128});
  model("linear N=14336 K=4096 gelu_tanh", "linear", {0, 14336, 4096}, {{"activation", std::string("gelu_tanh")}});
  model("swiglu_mlp 4096x14336", "swiglu_mlp", {0, 4096, 14336});
  model("attention 32x8x128", "attention", {0, 32, 8, 128});
  model("attention_decode 32x8x128", "attention_decode", {0, 0, 32, 8, 128});
  return c;
}

// The model shape of `op` (the first), if the list has one.
inline std::optional<OpCase> ModelCase(const std::string& op) {
  for (OpCase& c : OpCases()) {
    if (c.bench && c.op == op) return std::move(c);
  }
  return std::nullopt;
}

}  // namespace fusedserve::testing
