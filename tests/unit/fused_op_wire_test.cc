// FusedOp's wire codec (server/fused_op_wire.h) against protobuf, the
// reference: every op's request decodes to the same OpRequest (whatever the
// slicing of the body), bad requests get the same status, what the codec
// leaves to protobuf is left, unknown fields are skipped, the response parses
// back to the same message, and the decode allocates less than protobuf's.
#include "server/fused_op_wire.h"

#include <atomic>
#include <cstdlib>
#include <new>

#include "fusedserve/v1/fusedserve.grpc.pb.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "gtest/gtest.h"
#include "server/validation.h"

// Heap allocations made by this thread while counting is on: operator new
// replaced for the whole binary (GCC then sees its own inlined new/delete
// pairs as malloc/free, a false -Wmismatched-new-delete).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
namespace {
thread_local bool g_counting = false;
thread_local int64_t g_allocations = 0;
}  // namespace

void* operator new(size_t n) {
  if (g_counting) ++g_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace fusedserve {
namespace {

// One key per op (TuningKey order).
std::vector<std::pair<std::string, std::vector<int64_t>>> Cases() {
  return {
      {"rms_norm", {3, 40}},       {"add_rms_norm", {2, 24}},    {"add_rms_norm_silu", {1, 24}},
      {"layer_norm", {3, 17}},     {"softmax", {2, 33}},         {"silu_and_mul", {2, 12}},
      {"gelu", {4, 10}},           {"rope", {3, 4, 2, 16}},      {"linear", {2, 9, 24}},
      {"swiglu_mlp", {1, 16, 20}}, {"attention", {5, 4, 2, 16}}, {"attention_decode", {2, 9, 4, 2, 16}},
  };
}

HostTensor Tensor(DType dtype, std::vector<int64_t> shape, std::string bytes) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data = std::move(bytes);
  return t;
}

// A staging block in ordinary memory (the CUDA backend's are pinned).
struct HeapBlock {
  std::vector<char> bytes;
  std::shared_ptr<StagingBlock> block = std::make_shared<StagingBlock>();
  explicit HeapBlock(size_t size) : bytes(size) {
    block->host = block->device = bytes.data();
    block->size = size;
  }
};

// The response's bytes, whatever its slicing.
std::string Flatten(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string s;
  for (const grpc::Slice& x : slices) s.append(reinterpret_cast<const char*>(x.begin()), x.size());
  return s;
}

std::string Serialize(const v1::FusedOpRequest& p) {
  std::string s;
  EXPECT_TRUE(p.SerializeToString(&s));
  return s;
}

// `bytes` as a ByteBuffer cut into slices of `piece` bytes (0: one slice).
grpc::ByteBuffer Body(const std::string& bytes, size_t piece = 0) {
  std::vector<grpc::Slice> slices;
  if (piece == 0) piece = std::max<size_t>(bytes.size(), 1);
  for (size_t i = 0; i < bytes.size(); i += piece) {
    slices.emplace_back(bytes.data() + i, std::min(piece, bytes.size() - i));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

absl::StatusOr<OpRequest> ByProtobuf(const std::string& bytes, const ValidationLimits& limits = {}) {
  v1::FusedOpRequest p;
  if (!p.ParseFromString(bytes)) return absl::InvalidArgumentError("protobuf: does not parse");
  return TakeValidatedFusedOp(p, limits);
}

// nullopt when the codec leaves the body to protobuf.
std::optional<absl::StatusOr<OpRequest>> ByWire(const std::string& bytes, size_t piece = 0,
                                                const ValidationLimits& limits = {}) {
  WireFusedOp wire;
  if (!ParseFusedOpWire(Body(bytes, piece), &wire)) return std::nullopt;
  return ValidateWireFusedOp(wire, limits);
}

void ExpectSame(const OpRequest& a, const OpRequest& b) {
  EXPECT_EQ(a.op, b.op);
  EXPECT_EQ(a.spec, b.spec);
  ASSERT_EQ(a.inputs.size(), b.inputs.size());
  for (const auto& [name, t] : a.inputs) {
    ASSERT_TRUE(b.has(name)) << name;
    EXPECT_EQ(t.dtype, b.in(name).dtype) << name;
    EXPECT_EQ(t.shape, b.in(name).shape) << name;
    EXPECT_TRUE(t.bytes() == b.in(name).bytes()) << name;
  }
  EXPECT_EQ(a.attrs, b.attrs);
}

TEST(FusedOpWire, EveryOpDecodesAsProtobufDoesWhateverTheSlicing) {
  for (const auto& [op, key] : Cases()) {
    for (DType dt : {DType::kBF16, DType::kF32}) {
      const OpRequest r = MakeRandomRequest(op, dt, key, 7);
      const std::string bytes = Serialize(OpRequestToProto(r));
      absl::StatusOr<OpRequest> want = ByProtobuf(bytes);
      ASSERT_TRUE(want.ok()) << op << ": " << want.status();
      for (size_t piece : {size_t{0}, size_t{1}, size_t{7}, size_t{64}, size_t{1000}}) {
        std::optional<absl::StatusOr<OpRequest>> got = ByWire(bytes, piece);
        ASSERT_TRUE(got.has_value()) << op << " piece " << piece;
        ASSERT_TRUE(got->ok()) << op << ": " << got->status();
        ExpectSame(**got, *want);
      }
    }
  }
}

// Decoded into a staging block: every tensor's bytes are a view into it,
// aligned and in order, and the request (not the parser) holds the block.
TEST(FusedOpWire, StagedDecodeIsTheSameRequestWithItsBytesInTheBlock) {
  for (const auto& [op, key] : Cases()) {
    const OpRequest r = MakeRandomRequest(op, DType::kBF16, key, 11);
    const std::string bytes = Serialize(OpRequestToProto(r));
    absl::StatusOr<OpRequest> want = ByProtobuf(bytes);
    ASSERT_TRUE(want.ok()) << op << ": " << want.status();
    for (size_t piece : {size_t{0}, size_t{7}, size_t{1000}}) {
      HeapBlock heap(2 * bytes.size() + 4096);
      WireFusedOp wire;
      ASSERT_TRUE(ParseFusedOpWire(Body(bytes, piece), &wire, heap.block)) << op;
      absl::StatusOr<OpRequest> got = ValidateWireFusedOp(wire, ValidationLimits());
      wire.DropStaging();
      ASSERT_TRUE(got.ok()) << op << ": " << got.status();
      ExpectSame(*got, *want);
      size_t end = 0;
      for (const auto& [name, t] : got->inputs) {
        ASSERT_NE(t.view, nullptr) << op << " " << name;
        EXPECT_TRUE(t.data.empty()) << op << " " << name;
        EXPECT_EQ(t.block, heap.block);
        const size_t at = static_cast<size_t>(t.view - heap.block->host);
        EXPECT_EQ(at % 256, 0u) << op << " " << name;
        end = std::max(end, at + t.view_size);
      }
      EXPECT_EQ(heap.block->used, end) << op;
      EXPECT_EQ(heap.block.use_count(), 1 + static_cast<long>(got->inputs.size())) << op;
      got->inputs.clear();
      EXPECT_EQ(heap.block.use_count(), 1) << op;  // back to its pool
    }
  }
}

// Tensors that do not fit in the block own their bytes, as without one.
TEST(FusedOpWire, StagedDecodeFallsBackToOwnedBytesPastTheBlock) {
  const OpRequest r = MakeRandomRequest("add_rms_norm", DType::kF32, {4, 256}, 3);  // x, residual 4 KiB; weight 1 KiB
  const std::string bytes = Serialize(OpRequestToProto(r));
  HeapBlock heap(4096 + 512);  // room for one of the 4 KiB tensors and the weight
  WireFusedOp wire;
  ASSERT_TRUE(ParseFusedOpWire(Body(bytes), &wire, heap.block));
  absl::StatusOr<OpRequest> got = ValidateWireFusedOp(wire, ValidationLimits());
  wire.DropStaging();
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSame(*got, r);
  int staged = 0, owned = 0;
  for (const auto& [name, t] : got->inputs) (t.view != nullptr ? staged : owned)++;
  EXPECT_EQ(staged, 1);
  EXPECT_EQ(owned, 2);
  EXPECT_LE(heap.block->used, heap.block->size);
}

// Outputs left in a staging block are copied into the response, which
// therefore does not hold the block, and reads as protobuf would write it.
TEST(FusedOpWire, StagedOutputsAreCopiedIntoTheResponse) {
  HeapBlock heap(1 << 16);
  const std::string y(4096, '\x33');
  std::memcpy(heap.block->host + 512, y.data(), y.size());
  grpc::ByteBuffer out;
  {
    TensorMap outputs;
    HostTensor t;
    t.dtype = DType::kF32;
    t.shape = {1024};
    t.SetView(heap.block, heap.block->host + 512, y.size());
    outputs["y"] = std::move(t);
    EncodeFusedOpWire(std::move(outputs), "cuda", &out);
  }
  EXPECT_EQ(heap.block.use_count(), 1);
  std::memset(heap.block->host, 0, heap.block->size);  // the pool may reuse it now
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(out.Dump(&slices).ok());
  EXPECT_EQ(slices.size(), 1u);
  v1::FusedOpResponse got;
  ASSERT_TRUE(got.ParseFromString(Flatten(out)));
  ASSERT_TRUE(got.outputs().count("y"));
  EXPECT_EQ(got.outputs().at("y").data(), y);
  EXPECT_EQ(got.outputs().at("y").shape_size(), 1);
  EXPECT_EQ(got.backend(), "cuda");
}

// A response encoded while the outputs are still being computed (the CUDA
// backend's WhileRunning): the framing first, over poisoned output bytes,
// then the bytes once written: the same bytes EncodeFusedOpWire writes, in
// one slice (the block goes back to its pool with the call). Outputs that
// are not what was encoded, or no Encode since Arm: not used.
TEST(FusedOpWire, EarlyResponseIsTheSameBytesOnceCompleted) {
  HeapBlock heap(1 << 16);
  std::memset(heap.block->host, 0x7f, heap.block->size);  // poison: the GPU has not written yet
  const std::string backend = "cuda";
  TensorMap outputs;
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"y", {2, 1024}}, {"residual_out", {2, 1024}}, {"scalar", {}}, {"small", {3}}};
  size_t at = 256;
  for (const auto& [name, shape] : shapes) {
    HostTensor& t = outputs[name];
    t.dtype = DType::kBF16;
    t.shape = shape;
    t.SetView(heap.block, heap.block->host + at, static_cast<size_t>(t.numel()) * 2);
    at += 4096 + 64;
  }
  grpc::ByteBuffer early_out;
  EarlyFusedOpResponse early;
  early.Arm(&early_out, &backend);
  EXPECT_FALSE(early.Complete(outputs));  // nothing encoded since Arm
  early.Arm(&early_out, &backend);
  early.Encode(outputs);
  // The kernels write their outputs.
  uint8_t v = 1;
  for (auto& [name, t] : outputs) {
    std::memset(heap.block->host + (t.view - heap.block->host), v++, t.nbytes());
  }
  ASSERT_TRUE(early.Complete(outputs));
  grpc::ByteBuffer want_out;
  EncodeFusedOpWire(outputs, backend, &want_out);
  EXPECT_EQ(Flatten(early_out), Flatten(want_out));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(early_out.Dump(&slices).ok());
  EXPECT_EQ(slices.size(), 1u);
  v1::FusedOpResponse got;
  ASSERT_TRUE(got.ParseFromString(Flatten(early_out)));
  EXPECT_EQ(got.outputs().at("y").data(), std::string(4096, '\4'));  // map order: residual_out, scalar, small, y
  EXPECT_EQ(got.backend(), "cuda");
  EXPECT_FALSE(early.Complete(outputs));  // used once

  // A fresh one (the callback and sync APIs make one per call) allocates
  // no more than a reused one (gRPC's own, for the response) for up to four
  // outputs: the places are inline.
  auto allocations = [&](EarlyFusedOpResponse& e) {
    g_allocations = 0;
    g_counting = true;
    e.Arm(&early_out, &backend);
    e.Encode(outputs);
    const bool completed = e.Complete(outputs);
    g_counting = false;
    EXPECT_TRUE(completed);
    return g_allocations;
  };
  const int64_t reused = allocations(early);
  EarlyFusedOpResponse fresh;
  EXPECT_EQ(allocations(fresh), reused);

  // Outputs that differ from what was encoded (another size): not used.
  early.Arm(&early_out, &backend);
  early.Encode(outputs);
  TensorMap other = outputs;
  other["small"].shape = {2};
  other["small"].view_size = 4;
  EXPECT_FALSE(early.Complete(other));
  early.Arm(&early_out, &backend);
  early.Encode(outputs);
  other = outputs;
  other.erase("scalar");
  EXPECT_FALSE(early.Complete(other));
}

// Bodies that parse but do not validate: the same status either way.
TEST(FusedOpWire, BadRequestsGetProtobufsStatus) {
  const v1::FusedOpRequest good = OpRequestToProto(MakeRandomRequest("rms_norm", DType::kBF16, {2, 8}, 1));
  std::vector<std::pair<std::string, v1::FusedOpRequest>> cases;
  auto add = [&](const std::string& what, auto edit) {
    v1::FusedOpRequest p = good;
    edit(p);
    cases.emplace_back(what, p);
  };
  add("unknown op", [](v1::FusedOpRequest& p) { p.set_op("no_such_op"); });
  add("empty op", [](v1::FusedOpRequest& p) { p.clear_op(); });
  add("unknown input", [](v1::FusedOpRequest& p) { (*p.mutable_inputs())["bogus"] = p.inputs().at("x"); });
  add("missing input", [](v1::FusedOpRequest& p) { p.mutable_inputs()->erase("weight"); });
  add("bad dtype", [](v1::FusedOpRequest& p) { (*p.mutable_inputs())["x"].set_dtype(static_cast<v1::DType>(42)); });
  add("unset dtype", [](v1::FusedOpRequest& p) { (*p.mutable_inputs())["x"].clear_dtype(); });
  add("short data", [](v1::FusedOpRequest& p) { (*p.mutable_inputs())["x"].mutable_data()->pop_back(); });
  add("negative dim", [](v1::FusedOpRequest& p) { (*p.mutable_inputs())["x"].set_shape(0, -2); });
  add("zero dim", [](v1::FusedOpRequest& p) { (*p.mutable_inputs())["x"].set_shape(0, 0); });
  add("rank 9", [](v1::FusedOpRequest& p) {
    for (int i = 0; i < 7; ++i) (*p.mutable_inputs())["x"].add_shape(1);
  });
  add("huge dims", [](v1::FusedOpRequest& p) {
    (*p.mutable_inputs())["x"].set_shape(0, int64_t{1} << 40);
    (*p.mutable_inputs())["x"].add_shape(int64_t{1} << 40);
  });
  add("shape mismatch", [](v1::FusedOpRequest& p) { (*p.mutable_inputs())["weight"].set_shape(0, 7); });
  add("attr without value", [](v1::FusedOpRequest& p) { (*p.mutable_attrs())["eps"].Clear(); });
  add("attr of the wrong kind", [](v1::FusedOpRequest& p) { (*p.mutable_attrs())["eps"].set_s("x"); });
  add("attr out of range", [](v1::FusedOpRequest& p) { (*p.mutable_attrs())["eps"].set_f(-1); });
  add("int attr for a float", [](v1::FusedOpRequest& p) { (*p.mutable_attrs())["eps"].set_i(1); });
  add("unknown attr", [](v1::FusedOpRequest& p) { (*p.mutable_attrs())["nope"].set_b(true); });
  add("empty input name", [](v1::FusedOpRequest& p) { (*p.mutable_inputs())[""] = p.inputs().at("x"); });
  for (const auto& [what, p] : cases) {
    const std::string bytes = Serialize(p);
    absl::StatusOr<OpRequest> want = ByProtobuf(bytes);
    std::optional<absl::StatusOr<OpRequest>> got = ByWire(bytes);
    ASSERT_TRUE(got.has_value()) << what;
    EXPECT_EQ(got->status(), want.status()) << what;
  }
  // Cost bounds too.
  ValidationLimits tight;
  tight.max_output_bytes = 16;
  const std::string bytes = Serialize(good);
  EXPECT_EQ(ByWire(bytes, 0, tight)->status(), ByProtobuf(bytes, tight).status());
  EXPECT_TRUE(absl::IsResourceExhausted(ByProtobuf(bytes, tight).status()));
}

// Raw protobuf wire pieces.
std::string Varint(uint64_t v) {
  std::string s;
  while (v >= 0x80) {
    s.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  s.push_back(static_cast<char>(v));
  return s;
}
std::string Field(int number, int wire_type) { return Varint(static_cast<uint64_t>(number) << 3 | wire_type); }
std::string Len(int number, const std::string& body) { return Field(number, 2) + Varint(body.size()) + body; }

TEST(FusedOpWire, UnknownFieldsAreSkippedAndUnpackedShapesRead) {
  const OpRequest r = MakeRandomRequest("rms_norm", DType::kF32, {2, 8}, 3);
  const v1::FusedOpRequest p = OpRequestToProto(r);
  // x written by hand: unpacked shape, an unknown varint and an unknown
  // length-delimited field inside the Tensor and the entry.
  const v1::Tensor& x = p.inputs().at("x");
  std::string tensor = Field(1, 0) + Varint(x.dtype());
  for (int64_t d : x.shape()) tensor += Field(2, 0) + Varint(static_cast<uint64_t>(d));
  tensor += Field(9, 0) + Varint(5) + Len(10, "zz") + Len(3, x.data());
  std::string bytes = Len(2, Len(1, "x") + Field(7, 5) + std::string(4, '\0') + Len(2, tensor));
  v1::FusedOpRequest rest = p;
  rest.mutable_inputs()->erase("x");
  bytes += Serialize(rest) + Field(15, 1) + std::string(8, '\1');
  absl::StatusOr<OpRequest> want = ByProtobuf(bytes);
  ASSERT_TRUE(want.ok()) << want.status();
  for (size_t piece : {size_t{0}, size_t{3}}) {
    std::optional<absl::StatusOr<OpRequest>> got = ByWire(bytes, piece);
    ASSERT_TRUE(got.has_value() && got->ok());
    ExpectSame(**got, *want);
    ExpectSame(**got, r);
  }
}

TEST(FusedOpWire, LeavesToProtobufWhatItDoesNotTake) {
  const v1::FusedOpRequest p = OpRequestToProto(MakeRandomRequest("rms_norm", DType::kBF16, {1, 8}, 5));
  const std::string bytes = Serialize(p);
  const std::string x_entry = Len(2, Len(1, "x") + Len(2, ""));  // x again, an empty Tensor
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"non-ASCII op (UTF-8)", Len(1, "r\xc3\xa9") + bytes},
      {"invalid UTF-8 op", Len(1, "\xff") + bytes},
      {"repeated map key", bytes + x_entry},
      {"truncated", bytes.substr(0, bytes.size() - 3)},
      {"group", bytes + Field(20, 3) + Field(20, 4)},
      {"known field, other wire type", bytes + Field(1, 0) + Varint(3)},
      {"overlong varint", bytes + Field(16, 0) + std::string(11, '\x80')},
      {"length past the end", bytes + Field(16, 2) + Varint(1000)},
      // Found by fuzz_fused_op: protobuf reads tags and lengths as varint32s
      // of at most 5 bytes, so over-long encodings of valid values fail there.
      {"6-byte tag", bytes + std::string("\xaa\xbe\xd9\xbd\x87\x00\x00", 7)},
      {"10-byte length", std::string("\x0a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x22", 11) + bytes},
  };
  for (const auto& [what, b] : cases) {
    EXPECT_FALSE(ByWire(b).has_value()) << what;
    EXPECT_FALSE(ByWire(b, 5).has_value()) << what;
  }
  EXPECT_TRUE(ByWire(bytes).has_value());
}

TEST(FusedOpWire, ResponseParsesBackToTheMessageProtobufWouldWrite) {
  const OpRequest r = MakeRandomRequest("add_rms_norm", DType::kBF16, {3, 300}, 9);
  // Large tensors (y, residual_out: 1800 bytes each) are lent to gRPC as
  // slices of their own, small ones (scalar, small) copied into the framing.
  for (const bool large : {true, false}) {
    TensorMap outputs;
    if (large) {
      outputs["y"] = r.in("x");
      outputs["residual_out"] = r.in("residual");
    }
    outputs["scalar"] = Tensor(DType::kF32, {}, std::string(4, '\2'));
    outputs["small"] = Tensor(DType::kBF16, {3, 5}, std::string(30, '\7'));
    grpc::ByteBuffer out;
    EncodeFusedOpWire(outputs, "cpu", &out);
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(out.Dump(&slices).ok());
    // Framing, y's bytes, framing, residual_out's bytes, framing (map order).
    EXPECT_EQ(slices.size(), large ? 5u : 1u);
    const std::string bytes = Flatten(out);
    v1::FusedOpResponse got;
    ASSERT_TRUE(got.ParseFromString(bytes));
    v1::FusedOpResponse want;
    for (const auto& [name, t] : outputs) TensorToProto(t, &(*want.mutable_outputs())[name]);
    want.set_backend("cpu");
    EXPECT_EQ(got.ByteSizeLong(), want.ByteSizeLong());
    EXPECT_EQ(bytes.size(), want.ByteSizeLong());
    // Map order aside, the same message.
    ASSERT_EQ(got.outputs_size(), want.outputs_size());
    for (const auto& [name, t] : want.outputs()) {
      ASSERT_TRUE(got.outputs().count(name)) << name;
      EXPECT_EQ(got.outputs().at(name).SerializeAsString(), t.SerializeAsString()) << name;
    }
    EXPECT_EQ(got.backend(), "cpu");
  }
}

TEST(FusedOpWire, LentOutputsOutliveTheirMapUntilTheResponseIsGone) {
  grpc::ByteBuffer out;
  std::string expect;
  {
    TensorMap outputs;
    outputs["y"] = Tensor(DType::kF32, {1024}, std::string(4096, '\x5a'));
    expect = outputs["y"].data;
    EncodeFusedOpWire(std::move(outputs), "cuda", &out);
  }
  // A copy shares the slices; the first buffer goes, the copy still reads them.
  grpc::ByteBuffer copy(out);
  out.Clear();
  v1::FusedOpResponse got;
  ASSERT_TRUE(got.ParseFromString(Flatten(copy)));
  EXPECT_EQ(got.outputs().at("y").data(), expect);
}

// The decode's heap allocations for rms_norm bf16 [1,4096] (the benchmark's
// message): fewer than protobuf's, and the tensor bytes are copied once.
TEST(FusedOpWire, DecodeAllocatesLessThanProtobuf) {
  const std::string bytes = Serialize(OpRequestToProto(MakeRandomRequest("rms_norm", DType::kBF16, {1, 4096}, 2)));
  const grpc::ByteBuffer body = Body(bytes, 1500);  // TCP-sized slices
  WireFusedOp wire;
  int64_t wire_allocs = 0, proto_allocs = 0;
  for (int round = 0; round < 3; ++round) {  // the last round: buffers warm
    g_allocations = 0;
    g_counting = true;
    const bool parsed = ParseFusedOpWire(body, &wire);
    absl::StatusOr<OpRequest> a = ValidateWireFusedOp(wire, ValidationLimits());
    g_counting = false;
    ASSERT_TRUE(parsed && a.ok());
    wire_allocs = g_allocations;

    g_allocations = 0;
    g_counting = true;
    grpc::ByteBuffer copy(body);
    v1::FusedOpRequest p;
    const bool ok = grpc::SerializationTraits<v1::FusedOpRequest>::Deserialize(&copy, &p).ok();
    absl::StatusOr<OpRequest> b = TakeValidatedFusedOp(p, ValidationLimits());
    g_counting = false;
    ASSERT_TRUE(ok && b.ok());
    proto_allocs = g_allocations;
  }
  // Into a staging block: the tensors' own buffers are not allocated.
  HeapBlock heap(2 * bytes.size() + 4096);
  int64_t staged_allocs = 0;
  for (int round = 0; round < 3; ++round) {
    heap.block->used = 0;  // as the pool hands it out
    g_allocations = 0;
    g_counting = true;
    const bool parsed = ParseFusedOpWire(body, &wire, heap.block);
    absl::StatusOr<OpRequest> a = ValidateWireFusedOp(wire, ValidationLimits());
    g_counting = false;
    wire.DropStaging();
    ASSERT_TRUE(parsed && a.ok());
    staged_allocs = g_allocations;
  }
  std::printf("heap allocations per decode: wire codec %lld (into a staging block %lld), protobuf %lld\n",
              static_cast<long long>(wire_allocs), static_cast<long long>(staged_allocs),
              static_cast<long long>(proto_allocs));
  EXPECT_LT(wire_allocs, proto_allocs);
  EXPECT_LE(staged_allocs, wire_allocs - 2);  // x's and weight's buffers
}

}  // namespace
}  // namespace fusedserve
