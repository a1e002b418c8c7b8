// Checks and shape helpers shared by the op families (kernels/ops/ops.h).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/ops/ops.h"

namespace fusedserve::ops {

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

std::string ShapeStr(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ","), "]"); }

absl::Status CheckShape(const OpRequest& r, const std::string& name, const std::vector<int64_t>& expect) {
  const HostTensor& t = r.in(name);
  bool ok = t.rank() == static_cast<int>(expect.size());
  for (size_t i = 0; ok && i < expect.size(); ++i) ok = expect[i] < 0 || expect[i] == t.shape[i];
  if (ok) return absl::OkStatus();
  std::vector<std::string> parts;
  for (int64_t e : expect) parts.push_back(e < 0 ? "*" : absl::StrCat(e));
  return Invalid(absl::StrCat(r.op, ": input '", name, "' has shape ", ShapeStr(t.shape), ", expected [",
                              absl::StrJoin(parts, ","), "]"));
}

absl::Status CheckRankAtLeast(const OpRequest& r, const std::string& name, int rank) {
  const HostTensor& t = r.in(name);
  if (t.rank() >= rank) return absl::OkStatus();
  return Invalid(absl::StrCat(r.op, ": input '", name, "' has rank ", t.rank(), ", expected at least ", rank));
}

absl::Status CheckIndexValues(const OpRequest& r, const std::string& name, int64_t lo, int64_t hi) {
  for (int64_t v : r.in(name).ToInt64()) {
    if (v < lo || v > hi) {
      return Invalid(
          absl::StrCat(r.op, ": input '", name, "' has value ", v, ", expected within [", lo, ", ", hi, "]"));
    }
  }
  return absl::OkStatus();
}

absl::Status NoAttrRules(const OpRequest&) { return absl::OkStatus(); }

std::vector<int64_t> RowsAndLast(const HostTensor& x) {
  const int64_t last = x.rank() == 0 ? 1 : x.dim(-1);
  return {last == 0 ? 0 : x.numel() / last, last};
}

std::vector<int64_t> SmallRowKey(const std::vector<int64_t>& key) { return {1, std::min<int64_t>(key[1], 256)}; }

std::vector<int64_t> SmallGemmKey(const std::vector<int64_t>& key) {
  return {1, std::min<int64_t>(key[1], 256), std::min<int64_t>(key[2], 256)};
}

std::vector<int64_t> SmallHeads(int64_t hq, int64_t hkv, int64_t d) {
  const int64_t group = std::min<int64_t>(hkv > 0 ? hq / hkv : 1, 4);
  return {group, 1, std::max<int64_t>(2, std::min<int64_t>(d, 64) / 2 * 2)};
}

absl::Status CheckGqaKey(const std::string& op, int64_t hq, int64_t hkv) {
  if (hq % hkv != 0) return Invalid(op + " key: Hq must be a multiple of Hkv");
  return absl::OkStatus();
}

RowLayout FlatRows(std::vector<std::string> concat) {
  RowLayout l;
  l.flatten = true;
  l.primary = concat.front();
  l.concat = std::move(concat);
  return l;
}

OutputShapeList LikeX(const OpRequest& r, std::initializer_list<const char*> names) {
  // Called a few times per request (cost, launch): no vector of names built.
  OutputShapeList out;
  out.reserve(names.size());
  const std::vector<int64_t>& shape = r.in("x").shape;
  for (const char* n : names) out.emplace_back(n, shape);
  return out;
}

void ElementwiseCost(const OpRequest&, OpCost* cost) { cost->flops = 8 * cost->elements; }

}  // namespace fusedserve::ops
