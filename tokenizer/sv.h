// Debian's Abseil (20220623, built as C++14) has its own absl::string_view,
// distinct from std::string_view: SV converts at the Abseil calls (StrCat,
// heterogeneous flat_hash_map lookups).
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace fusedserve::tokenizer {

inline absl::string_view SV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace fusedserve::tokenizer
