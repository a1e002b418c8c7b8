// FusedOp's wire codec (see fused_op_wire.h). Field numbers are those of
// proto/fusedserve/v1/fusedserve.proto: FusedOpRequest {op = 1, inputs = 2,
// attrs = 3}, FusedOpResponse {outputs = 1, backend = 2}, Tensor {dtype = 1,
// shape = 2, data = 3}, AttrValue {f = 1, i = 2, s = 3, b = 4}; a map entry
// is {key = 1, value = 2}.
#include "server/fused_op_wire.h"

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/slice.h"

namespace fusedserve {
namespace {

enum WireType { kVarint = 0, kFixed64 = 1, kLen = 2, kFixed32 = 5 };

// Reads the body across its slices. Every read fails (false) past `end_`.
class Reader {
 public:
  explicit Reader(const std::vector<grpc::Slice>& slices) : slices_(slices) {
    for (const grpc::Slice& s : slices) end_ += s.size();
    idx_ = static_cast<size_t>(-1);
    Advance();
  }
  size_t pos() const { return pos_; }
  size_t end() const { return end_; }

  bool Byte(uint8_t* b) {
    if (cur_ == lim_ && !Advance()) return false;
    *b = *cur_++;
    ++pos_;
    return true;
  }
  bool Varint(uint64_t* v) {
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b = 0;
      if (!Byte(&b)) return false;
      r |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) {
        *v = r;
        return true;
      }
    }
    return false;  // more than 10 bytes
  }
  bool Fixed64(uint64_t* v) {
    uint8_t b[8];
    for (uint8_t& x : b) {
      if (!Byte(&x)) return false;
    }
    std::memcpy(v, b, 8);  // little-endian on the wire and on the hosts we build for
    return true;
  }
  // A length prefix that must fit before `limit`; sets *field_end.
  // Protobuf reads a length as a varint32 of at most 5 bytes, at most INT_MAX.
  bool Length(size_t limit, size_t* n, size_t* field_end) {
    uint64_t v = 0;
    const size_t start = pos_;
    if (!Varint(&v) || pos_ - start > 5 || v > 0x7fffffffu || pos_ > limit || v > limit - pos_) return false;
    *n = static_cast<size_t>(v);
    *field_end = pos_ + *n;
    return true;
  }
  // Appends the next n bytes to `dst`: the one copy of a tensor's bytes.
  bool Append(size_t n, std::string* dst) {
    while (n > 0) {
      if (cur_ == lim_ && !Advance()) return false;
      const size_t k = std::min(n, static_cast<size_t>(lim_ - cur_));
      dst->append(reinterpret_cast<const char*>(cur_), k);
      cur_ += k;
      pos_ += k;
      n -= k;
    }
    return true;
  }
  // Copies the next n bytes to `dst` (a staging block).
  bool Copy(size_t n, char* dst) {
    while (n > 0) {
      if (cur_ == lim_ && !Advance()) return false;
      const size_t k = std::min(n, static_cast<size_t>(lim_ - cur_));
      std::memcpy(dst, cur_, k);
      dst += k;
      cur_ += k;
      pos_ += k;
      n -= k;
    }
    return true;
  }
  bool Skip(size_t n) {
    while (n > 0) {
      if (cur_ == lim_ && !Advance()) return false;
      const size_t k = std::min(n, static_cast<size_t>(lim_ - cur_));
      cur_ += k;
      pos_ += k;
      n -= k;
    }
    return true;
  }

 private:
  bool Advance() {
    while (++idx_ < slices_.size()) {
      cur_ = slices_[idx_].begin();
      lim_ = slices_[idx_].end();
      if (cur_ != lim_) return true;
    }
    cur_ = lim_ = nullptr;
    return false;
  }

  const std::vector<grpc::Slice>& slices_;
  size_t idx_ = 0;
  const uint8_t* cur_ = nullptr;
  const uint8_t* lim_ = nullptr;
  size_t pos_ = 0;
  size_t end_ = 0;
};

bool Ascii(const std::string& s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

// A string field (op, a map key, an attribute's s): replaced, as protobuf
// does when a field repeats. Non-ASCII goes to protobuf (UTF-8 checks).
bool ReadString(Reader& r, size_t limit, std::string* out) {
  size_t n = 0, field_end = 0;
  out->clear();
  return r.Length(limit, &n, &field_end) && r.Append(n, out) && Ascii(*out);
}

// Skips a field of an unknown number; groups and invalid wire types go to protobuf.
bool SkipField(Reader& r, size_t limit, uint32_t wire_type) {
  uint64_t v = 0;
  size_t n = 0, field_end = 0;
  switch (wire_type) {
    case kVarint:
      return r.Varint(&v) && r.pos() <= limit;
    case kFixed64:
      return r.Skip(8) && r.pos() <= limit;
    case kLen:
      return r.Length(limit, &n, &field_end) && r.Skip(n);
    case kFixed32:
      return r.Skip(4) && r.pos() <= limit;
    default:
      return false;
  }
}

bool Tag(Reader& r, uint32_t* field, uint32_t* wire_type) {
  // A tag is a varint32 of at most 5 bytes, as protobuf reads it: a longer
  // (over-long) encoding of a valid tag is refused there too.
  uint64_t tag = 0;
  const size_t start = r.pos();
  if (!r.Varint(&tag) || r.pos() - start > 5 || tag > 0xffffffffu) return false;
  *field = static_cast<uint32_t>(tag >> 3);
  *wire_type = static_cast<uint32_t>(tag & 7);
  return *field != 0;
}

// A Tensor message ending at `end`; its bytes into `staging` where they fit.
bool ParseTensor(Reader& r, size_t end, WireFusedOp::Input* in, const std::shared_ptr<StagingBlock>& staging) {
  HostTensor& t = in->tensor;
  while (r.pos() < end) {
    uint32_t field = 0, wt = 0;
    if (!Tag(r, &field, &wt)) return false;
    uint64_t v = 0;
    size_t n = 0, field_end = 0;
    if (field == 1 && wt == kVarint) {
      if (!r.Varint(&v)) return false;
      in->dtype = static_cast<int32_t>(v);  // an enum is an int32 on the wire
    } else if (field == 2 && wt == kLen) {  // packed (proto3's default)
      if (!r.Length(end, &n, &field_end)) return false;
      while (r.pos() < field_end) {
        if (!r.Varint(&v)) return false;
        t.shape.push_back(static_cast<int64_t>(v));
      }
      if (r.pos() != field_end) return false;
    } else if (field == 2 && wt == kVarint) {  // unpacked
      if (!r.Varint(&v)) return false;
      t.shape.push_back(static_cast<int64_t>(v));
    } else if (field == 3 && wt == kLen) {
      if (!r.Length(end, &n, &field_end)) return false;
      t.data.clear();
      t.ClearView();
      const size_t at = staging == nullptr ? 0 : StagingBlock::AlignUp(staging->used);
      if (n > 0 && staging != nullptr && at + n <= staging->size) {
        if (!r.Copy(n, staging->host + at)) return false;
        staging->used = at + n;
        t.SetView(staging, staging->host + at, n);
      } else {
        t.data.reserve(n);
        if (!r.Append(n, &t.data)) return false;
      }
    } else if (field <= 3) {
      return false;  // a known field with another wire type: protobuf decides
    } else if (!SkipField(r, end, wt)) {
      return false;
    }
    if (r.pos() > end) return false;
  }
  return r.pos() == end;
}

// A map<string, Tensor> entry ending at `end`.
bool ParseInputEntry(Reader& r, size_t end, WireFusedOp::Input* in, const std::shared_ptr<StagingBlock>& staging) {
  in->name.clear();
  in->dtype = 0;
  in->tensor.shape.clear();
  in->tensor.data.clear();
  in->tensor.ClearView();
  bool value_seen = false;
  while (r.pos() < end) {
    uint32_t field = 0, wt = 0;
    if (!Tag(r, &field, &wt)) return false;
    size_t n = 0, field_end = 0;
    if (field == 1 && wt == kLen) {
      if (!ReadString(r, end, &in->name)) return false;
    } else if (field == 2 && wt == kLen) {
      if (value_seen) return false;  // protobuf merges the two
      value_seen = true;
      if (!r.Length(end, &n, &field_end) || !ParseTensor(r, field_end, in, staging)) return false;
    } else if (field <= 2) {
      return false;
    } else if (!SkipField(r, end, wt)) {
      return false;
    }
  }
  return r.pos() == end;
}

// A map<string, AttrValue> entry ending at `end`.
bool ParseAttrEntry(Reader& r, size_t end, WireFusedOp::Attr* a) {
  a->name.clear();
  a->set = false;
  bool value_seen = false;
  while (r.pos() < end) {
    uint32_t field = 0, wt = 0;
    if (!Tag(r, &field, &wt)) return false;
    size_t n = 0, field_end = 0;
    if (field == 1 && wt == kLen) {
      if (!ReadString(r, end, &a->name)) return false;
    } else if (field == 2 && wt == kLen) {
      if (value_seen) return false;
      value_seen = true;
      if (!r.Length(end, &n, &field_end)) return false;
      // The oneof: the last field sent wins.
      while (r.pos() < field_end) {
        uint32_t f = 0, w = 0;
        if (!Tag(r, &f, &w)) return false;
        uint64_t v = 0;
        if (f == 1 && w == kFixed64) {
          if (!r.Fixed64(&v)) return false;
          double d = 0;
          std::memcpy(&d, &v, sizeof(d));
          a->value = d;
        } else if (f == 2 && w == kVarint) {
          if (!r.Varint(&v)) return false;
          a->value = static_cast<int64_t>(v);
        } else if (f == 3 && w == kLen) {
          std::string s;
          if (!ReadString(r, field_end, &s)) return false;
          a->value = std::move(s);
        } else if (f == 4 && w == kVarint) {
          if (!r.Varint(&v)) return false;
          a->value = v != 0;
        } else if (f <= 4) {
          return false;
        } else if (!SkipField(r, field_end, w)) {
          return false;
        } else {
          continue;
        }
        a->set = true;
        if (r.pos() > field_end) return false;
      }
      if (r.pos() != field_end) return false;
    } else if (field <= 2) {
      return false;
    } else if (!SkipField(r, end, wt)) {
      return false;
    }
  }
  return r.pos() == end;
}

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

uint8_t* PutVarint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

uint8_t* PutBytes(uint8_t* p, uint8_t tag, const char* data, size_t n) {
  *p++ = tag;
  p = PutVarint(p, n);
  std::memcpy(p, data, n);
  return p + n;
}

size_t ShapeBytes(const HostTensor& t) {
  size_t n = 0;
  for (int64_t d : t.shape) n += VarintSize(static_cast<uint64_t>(d));
  return n;
}

// The Tensor message's size (proto3: default fields are not written).
size_t TensorSize(const HostTensor& t) {
  const uint64_t dtype = static_cast<uint64_t>(ToProtoDType(t.dtype));
  size_t n = dtype != 0 ? 1 + VarintSize(dtype) : 0;
  if (!t.shape.empty()) n += 1 + VarintSize(ShapeBytes(t)) + ShapeBytes(t);
  if (t.nbytes() > 0) n += 1 + VarintSize(t.nbytes()) + t.nbytes();
  return n;
}

// Tensors of at least this many bytes are lent to gRPC rather than copied
// into the response (below it a copy costs less than the slice's upkeep).
constexpr size_t kLendBytes = 1024;

size_t EntrySize(const std::string& name, const HostTensor& t) {
  const size_t tensor = TensorSize(t);
  return 1 + VarintSize(name.size()) + name.size() + 1 + VarintSize(tensor) + tensor;
}

// A tensor in a staging block is copied into the response (it goes back to
// its pool once the call is answered); others of kLendBytes or more are lent.
bool Lends(const HostTensor& t) { return t.view == nullptr && t.data.size() >= kLendBytes; }

// Outputs whose bytes gRPC holds as slices; freed with the last slice.
struct LentOutputs {
  TensorMap outputs;
  std::atomic<int> slices;
};

}  // namespace

void WireFusedOp::DropStaging() {
  for (Input& in : inputs) in.tensor.ClearView();
}

bool ParseFusedOpWire(const grpc::ByteBuffer& body, WireFusedOp* out, const std::shared_ptr<StagingBlock>& staging) {
  // The slices, held (refs, not bytes) in a vector each thread reuses.
  static thread_local std::vector<grpc::Slice> slices;
  slices.clear();
  if (!body.Dump(&slices).ok()) return false;
  Reader r(slices);
  out->op.clear();
  out->n_inputs = out->n_attrs = 0;
  const size_t end = r.end();
  while (r.pos() < end) {
    uint32_t field = 0, wt = 0;
    if (!Tag(r, &field, &wt)) return false;
    size_t n = 0, field_end = 0;
    if (field == 1 && wt == kLen) {
      if (!ReadString(r, end, &out->op)) return false;
    } else if (field == 2 && wt == kLen) {
      if (out->n_inputs == out->inputs.size()) out->inputs.emplace_back();
      WireFusedOp::Input& in = out->inputs[out->n_inputs];
      if (!r.Length(end, &n, &field_end) || !ParseInputEntry(r, field_end, &in, staging)) return false;
      for (size_t i = 0; i < out->n_inputs; ++i) {
        if (out->inputs[i].name == in.name) return false;  // protobuf: the last one wins
      }
      ++out->n_inputs;
    } else if (field == 3 && wt == kLen) {
      if (out->n_attrs == out->attrs.size()) out->attrs.emplace_back();
      WireFusedOp::Attr& a = out->attrs[out->n_attrs];
      if (!r.Length(end, &n, &field_end) || !ParseAttrEntry(r, field_end, &a)) return false;
      for (size_t i = 0; i < out->n_attrs; ++i) {
        if (out->attrs[i].name == a.name) return false;
      }
      ++out->n_attrs;
    } else if (field <= 3) {
      return false;
    } else if (!SkipField(r, end, wt)) {
      return false;
    }
  }
  slices.clear();  // drop the refs now, not at the next call
  return r.pos() == end;
}

absl::StatusOr<OpRequest> ValidateWireFusedOp(WireFusedOp& p, const ValidationLimits& limits) {
  // TakeValidatedFusedOp's steps and messages (server/validation.cc Validate).
  OpRequest r;
  r.op = p.op;
  const OpSpec* spec = r.spec = FindOpSpec(r.op);
  if (spec == nullptr) {
    OpRequest probe;
    probe.op = r.op;
    return ValidateOpRequest(probe);  // unknown-op message
  }
  for (size_t i = 0; i < p.n_inputs; ++i) {
    if (absl::Status s = CheckInputName(*spec, p.inputs[i].name); !s.ok()) return s;
  }
  for (size_t i = 0; i < p.n_inputs; ++i) {
    WireFusedOp::Input& in = p.inputs[i];
    HostTensor& t = in.tensor;
    if (absl::Status s =
            CheckWireTensor(in.dtype, t.shape.data(), static_cast<int>(t.shape.size()), t.nbytes(), in.name, limits);
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(r.op, ": ", s.message()));
    }
    HostTensor& dst = r.inputs[in.name];
    dst.dtype = FromProtoDType(static_cast<v1::DType>(in.dtype));
    dst.shape = t.shape;    // the wire copy keeps its capacity for the next call
    dst.data.swap(t.data);  // the bytes move (or the staging block's view does)
    dst.SetView(std::move(t.block), t.view, t.view_size);
    t.ClearView();
  }
  for (size_t i = 0; i < p.n_attrs; ++i) {
    WireFusedOp::Attr& a = p.attrs[i];
    if (!a.set) {
      return absl::InvalidArgumentError(absl::StrCat(r.op, ": attribute '", ClientText(a.name), "' has no value set"));
    }
    r.attrs[a.name] = std::move(a.value);
  }
  if (auto s = ValidateOpRequest(r); !s.ok()) return s;
  if (auto s = CheckOpCost(r, limits); !s.ok()) return s;
  return r;
}

namespace {

// The response's bytes for `outs` into `out`. owner: tensors that Lends()
// are lent as slices that keep it alive (null: none is). early: every tensor's bytes are
// left out (the framing around them written, their place recorded) for
// EarlyFusedOpResponse::Complete to copy in.
void EncodeWire(const TensorMap& outs, const std::string& backend, size_t framing, LentOutputs* owner,
                absl::InlinedVector<std::pair<uint8_t*, size_t>, 4>* early, grpc::ByteBuffer* out) {
  grpc::Slice head(framing);
  uint8_t* const begin = const_cast<uint8_t*>(head.begin());
  uint8_t* p = begin;
  std::vector<grpc::Slice> slices;  // framing pieces and lent tensors, in order
  if (owner != nullptr) slices.reserve(2 * outs.size() + 1);
  uint8_t* piece = begin;  // start of the framing not yet in `slices`
  auto cut = [&] {         // the framing written since `piece`, as a sub-slice of `head`
    if (p > piece) slices.push_back(head.sub(static_cast<size_t>(piece - begin), static_cast<size_t>(p - begin)));
    piece = p;
  };
  for (const auto& [name, t] : outs) {
    *p++ = 0x0a;  // outputs (1, LEN): an entry
    p = PutVarint(p, EntrySize(name, t));
    p = PutBytes(p, 0x0a, name.data(), name.size());  // key
    *p++ = 0x12;                                      // value: Tensor
    p = PutVarint(p, TensorSize(t));
    const uint64_t dtype = static_cast<uint64_t>(ToProtoDType(t.dtype));
    if (dtype != 0) {
      *p++ = 0x08;
      p = PutVarint(p, dtype);
    }
    if (!t.shape.empty()) {
      *p++ = 0x12;
      p = PutVarint(p, ShapeBytes(t));
      for (int64_t d : t.shape) p = PutVarint(p, static_cast<uint64_t>(d));
    }
    if (early != nullptr) {
      if (t.nbytes() > 0) {
        *p++ = 0x1a;
        p = PutVarint(p, t.nbytes());
        early->emplace_back(p, t.nbytes());
        p += t.nbytes();
      }
    } else if (owner != nullptr && Lends(t)) {
      *p++ = 0x1a;
      p = PutVarint(p, t.data.size());
      cut();
      slices.emplace_back(grpc_slice_new_with_user_data(
                              const_cast<char*>(t.data.data()), t.data.size(),
                              [](void* o) {
                                auto* l = static_cast<LentOutputs*>(o);
                                if (l->slices.fetch_sub(1) == 1) delete l;
                              },
                              owner),
                          grpc::Slice::STEAL_REF);
    } else if (t.nbytes() > 0) {
      p = PutBytes(p, 0x1a, t.bytes().data(), t.nbytes());
    }
  }
  if (!backend.empty()) p = PutBytes(p, 0x12, backend.data(), backend.size());
  if (owner == nullptr) {
    grpc::ByteBuffer buffer(&head, 1);
    out->Swap(&buffer);
    return;
  }
  cut();
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  out->Swap(&buffer);
}

// The framing's bytes of `outs`: every tensor's bytes included, except,
// with `lent`, those of the tensors that Lends(), counted there.
size_t FramingBytes(const TensorMap& outs, const std::string& backend, int* lent) {
  size_t framing = 0;
  if (lent != nullptr) *lent = 0;
  for (const auto& [name, t] : outs) {
    const size_t entry = EntrySize(name, t);
    framing += 1 + VarintSize(entry) + entry;
    if (lent != nullptr && Lends(t)) {
      framing -= t.data.size();
      ++*lent;
    }
  }
  if (!backend.empty()) framing += 1 + VarintSize(backend.size()) + backend.size();
  return framing;
}

}  // namespace

void EncodeFusedOpWire(TensorMap outputs, const std::string& backend, grpc::ByteBuffer* out) {
  // Framing bytes (keys, shapes, lengths) go into one slice; the bytes of
  // each large tensor are not copied but lent to gRPC as a slice of their
  // own, backed by `outputs` until gRPC has written the last of them.
  int lent = 0;
  const size_t framing = FramingBytes(outputs, backend, &lent);
  LentOutputs* owner = nullptr;
  if (lent > 0) owner = new LentOutputs{std::move(outputs), {lent}};
  EncodeWire(owner != nullptr ? owner->outputs : outputs, backend, framing, owner, nullptr, out);
}

void EarlyFusedOpResponse::Encode(const TensorMap& pending) {
  places_.clear();
  EncodeWire(pending, *backend_, FramingBytes(pending, *backend_, nullptr), nullptr, &places_, out_);
  encoded_ = true;
}

bool EarlyFusedOpResponse::Complete(const TensorMap& outputs) {
  if (!encoded_) return false;
  encoded_ = false;
  if (outputs.size() != places_.size()) return false;
  size_t i = 0;
  for (const auto& [name, t] : outputs) {
    if (t.nbytes() != places_[i].second) return false;
    std::memcpy(places_[i++].first, t.bytes().data(), t.nbytes());
  }
  return true;
}

}  // namespace fusedserve
