// Shared by the op families' OpSpecs (kernels/ops/<family>.cc): the list of
// families that AllOpSpecs gathers, and the checks and shape helpers several
// families use (server validation shares the message helpers). Other code
// reads OpSpec fields.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/op.h"

namespace fusedserve::ops {

// Each family's ops, in the table's order (kernels/op.cc).
std::vector<OpSpec> NormOps();        // rms_norm, add_rms_norm, add_rms_norm_silu, layer_norm
std::vector<OpSpec> SoftmaxOps();     // softmax
std::vector<OpSpec> ActivationOps();  // silu_and_mul, gelu
std::vector<OpSpec> RopeOps();        // rope
std::vector<OpSpec> LinearOps();      // linear
std::vector<OpSpec> SwigluMlpOps();   // swiglu_mlp
std::vector<OpSpec> AttentionOps();   // attention, attention_decode

absl::Status Invalid(const std::string& msg);
std::string ShapeStr(const std::vector<int64_t>& shape);
// Input `name` has rank expect.size() and, where expect[i] >= 0, dim i == expect[i].
absl::Status CheckShape(const OpRequest& r, const std::string& name, const std::vector<int64_t>& expect);
absl::Status CheckRankAtLeast(const OpRequest& r, const std::string& name, int rank);
// Every value of index input `name` within [lo, hi].
absl::Status CheckIndexValues(const OpRequest& r, const std::string& name, int64_t lo, int64_t hi);
absl::Status NoAttrRules(const OpRequest& r);

// Row-wise ops (norms, softmax, activations) viewed as [rows, last dim].
std::vector<int64_t> RowsAndLast(const HostTensor& x);
// {1, min(H, 256)}: a row op's small key.
std::vector<int64_t> SmallRowKey(const std::vector<int64_t>& key);
// {1, min(N, 256), min(K, 256)}: linear's and swiglu_mlp's small key.
std::vector<int64_t> SmallGemmKey(const std::vector<int64_t>& key);
// {group, 1, D'} of rope's and attention's small keys: the GQA ratio (up to
// 4) with one KV head, the head dim even and at most 64.
std::vector<int64_t> SmallHeads(int64_t hq, int64_t hkv, int64_t d);
// "<op> key: Hq must be a multiple of Hkv" unless it is.
absl::Status CheckGqaKey(const std::string& op, int64_t hq, int64_t hkv);
// Batch layout of a row-wise op whose inputs `concat` hold the rows.
RowLayout FlatRows(std::vector<std::string> concat);
// Outputs shaped like input x: {{name, x.shape}} per name.
OutputShapeList LikeX(const OpRequest& r, std::initializer_list<const char*> names);
void ElementwiseCost(const OpRequest& r, OpCost* cost);

}  // namespace fusedserve::ops
