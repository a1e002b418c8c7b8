// fusedserve_tokenize: the tokenizer from the command line, for the Python
// equivalence tests and the throughput benchmark.
//
//   fusedserve_tokenize --tokenizer DIR [options] MODE
//   encode         stdin text -> JSON ids ([1, 2, ...])
//   decode         stdin JSON ids -> text (raw bytes, no newline)
//   stream-decode  stdin JSON ids -> JSON array of the IncrementalDecoder's pieces
//   info           JSON: name, vocab_size, bos, eos, special-token flags
//   bench --file F [--repeat N] [--by_line]   encode F N times on this thread, prints MB/s
// options: --no_special (encode without the post-processor's BOS),
//          --skip_special (decode without special tokens),
//          --batch (encode/decode/stream-decode: stdin is a JSON array of
//          inputs, stdout a JSON array of results; an encode error is the
//          string "error: ..." in its place)
// Exit status: 0 ok, 1 usage, 2 the tokenizer refused (message on stderr).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tokenizer/incremental_decoder.h"
#include "tokenizer/tokenizer.h"
#include "warmup/regular_file.h"

namespace {

using fusedserve::tokenizer::Tokenizer;

int Usage() {
  std::cerr << "usage: fusedserve_tokenize --tokenizer DIR [--no_special] [--skip_special] "
               "(encode | decode | stream-decode | info | bench --file F [--repeat N] [--by_line])\n";
  return 1;
}

std::string ReadStdin() {
  std::ostringstream ss;
  ss << std::cin.rdbuf();
  return ss.str();
}

bool ReadIds(std::vector<int32_t>* ids) {
  nlohmann::json j = nlohmann::json::parse(ReadStdin(), nullptr, false);
  if (!j.is_array()) return false;
  for (const auto& x : j) {
    if (!x.is_number_integer()) return false;
    ids->push_back(x.get<int32_t>());
  }
  return true;
}

int Bench(const Tokenizer& tok, const std::string& file, int repeat, bool by_line, bool special) {
  auto text = fusedserve::ReadRegularFile(file, int64_t{1} << 31);
  if (!text.ok()) {
    std::cerr << text.status().ToString() << "\n";
    return 2;
  }
  std::vector<std::string> lines;
  if (by_line) {
    std::istringstream in(*text);
    for (std::string l; std::getline(in, l);) lines.push_back(l + "\n");
  } else {
    lines.push_back(*text);
  }
  size_t tokens = 0;
  double best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    size_t n = 0;
    for (const std::string& l : lines) {
      auto ids = tok.Encode(l, special);
      if (!ids.ok()) {
        std::cerr << ids.status().ToString() << "\n";
        return 2;
      }
      n += ids->size();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
    tokens = n;
  }
  const double mb = static_cast<double>(text->size()) / 1e6;
  std::printf("{\"bytes\": %zu, \"tokens\": %zu, \"best_s\": %.6f, \"mb_per_s\": %.3f}\n", text->size(), tokens, best,
              mb / best);
  return 0;
}

void StreamDecode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip, nlohmann::json* pieces) {
  fusedserve::tokenizer::IncrementalDecoder decoder(tok, skip);
  for (int32_t id : ids) pieces->push_back(decoder.Push(id));
  pieces->push_back(decoder.Flush());
}

int Batch(const Tokenizer& tok, const std::string& mode, bool special, bool skip) {
  nlohmann::json in = nlohmann::json::parse(ReadStdin(), nullptr, false);
  if (!in.is_array()) {
    std::cerr << "stdin: expected a JSON array\n";
    return 2;
  }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& item : in) {
    if (mode == "encode" && item.is_string()) {
      auto ids = tok.Encode(item.get<std::string>(), special);
      out.push_back(ids.ok() ? nlohmann::json(*ids) : nlohmann::json("error: " + ids.status().ToString()));
    } else if ((mode == "decode" || mode == "stream-decode") && item.is_array()) {
      std::vector<int32_t> ids;
      for (const auto& x : item) ids.push_back(x.get<int32_t>());
      if (mode == "decode") {
        out.push_back(tok.Decode(ids, skip));
      } else {
        nlohmann::json pieces = nlohmann::json::array();
        StreamDecode(tok, ids, skip, &pieces);
        out.push_back(pieces);
      }
    } else {
      std::cerr << "stdin: unexpected item for --batch " << mode << "\n";
      return 2;
    }
  }
  std::cout << out.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, mode, file;
  int repeat = 5;
  bool special = true, skip = false, by_line = false, batch = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc) {
      dir = argv[++i];
    } else if (a == "--file" && i + 1 < argc) {
      file = argv[++i];
    } else if (a == "--repeat" && i + 1 < argc) {
      repeat = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--no_special") {
      special = false;
    } else if (a == "--skip_special") {
      skip = true;
    } else if (a == "--batch") {
      batch = true;
    } else if (a == "--by_line") {
      by_line = true;
    } else if (mode.empty() && a[0] != '-') {
      mode = a;
    } else {
      return Usage();
    }
  }
  if (dir.empty() || mode.empty()) return Usage();
  auto loaded = fusedserve::tokenizer::LoadTokenizer(dir);
  if (!loaded.ok()) {
    std::cerr << loaded.status().ToString() << "\n";
    return 2;
  }
  const Tokenizer& tok = **loaded;
  if (batch) return Batch(tok, mode, special, skip);
  if (mode == "encode") {
    auto ids = tok.Encode(ReadStdin(), special);
    if (!ids.ok()) {
      std::cerr << ids.status().ToString() << "\n";
      return 2;
    }
    std::cout << nlohmann::json(*ids).dump() << "\n";
    return 0;
  }
  if (mode == "decode" || mode == "stream-decode") {
    std::vector<int32_t> ids;
    if (!ReadIds(&ids)) {
      std::cerr << "stdin: expected a JSON array of token ids\n";
      return 2;
    }
    if (mode == "decode") {
      std::cout << tok.Decode(ids, skip);
      return 0;
    }
    nlohmann::json pieces = nlohmann::json::array();
    StreamDecode(tok, ids, skip, &pieces);
    std::cout << pieces.dump() << "\n";
    return 0;
  }
  if (mode == "info") {
    nlohmann::json j = {{"name", tok.name()},
                        {"vocab_size", tok.vocab_size()},
                        {"eos", tok.eos_ids()},
                        {"strips_leading_space", tok.strips_leading_space()},
                        {"chat_template", tok.chat_template()}};
    j["bos"] = tok.bos_id() ? nlohmann::json(*tok.bos_id()) : nlohmann::json();
    std::cout << j.dump() << "\n";
    return 0;
  }
  if (mode == "bench") {
    if (file.empty()) return Usage();
    return Bench(tok, file, repeat, by_line, special);
  }
  return Usage();
}
