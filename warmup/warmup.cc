// TuningService: the cache, the envelope and the start-up sequence. Warmup()
// (1) reloads the cache for the device actually in use, (2) tunes the envelope
// entries missing from it, within the time budget, persisting every
// flush_interval and at the end, (3) launches every envelope entry's kernel
// once with its cached config, falling back to the default config (and
// forgetting the entry) if a cached config no longer runs, and (4) runs each
// envelope op once through the serving backend at a small shape. Requests
// never tune: lookup() only reads the in-memory cache.
#include "warmup/warmup.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "kernels/op.h"
#include "warmup/autotuner.h"
#include "warmup/envelope.h"
#include "warmup/tuning_cache.h"

namespace fusedserve {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string Us(double us) {
  char buf[32];
  std::snprintf(buf, sizeof buf, us < 10 ? "%.2f" : "%.1f", us);
  return buf;
}

void AddCount(std::vector<std::pair<std::string, int64_t>>* counts, const std::string& reason, int64_t n) {
  for (auto& [r, c] : *counts) {
    if (r == reason) {
      c += n;
      return;
    }
  }
  counts->emplace_back(reason, n);
}

class TuningServiceImpl : public TuningService {
 public:
  TuningServiceImpl(WarmupOptions options, std::vector<EnvelopeEntry> envelope, std::shared_ptr<TuningCache> cache,
                    std::unique_ptr<Tuner> tuner, TuningServiceInternals internals)
      : options_(std::move(options)),
        envelope_(std::move(envelope)),
        cache_(std::move(cache)),
        tuner_(std::move(tuner)),
        internals_(internals) {
    report_.cache_state = cache_->state();
    report_.entries = cache_->size();
    report_.rejected = cache_->rejected();
  }

  ConfigLookup lookup() override {
    std::shared_ptr<TuningCache> cache = cache_;
    return [cache](const std::string& op, DType dtype, const std::vector<int64_t>& key) {
      return cache->LookupConfig(op, dtype, key);
    };
  }

  ConfigLookup counted_lookup() override {
    std::shared_ptr<TuningCache> cache = cache_;
    std::shared_ptr<Counter> counter = counter_;
    return [cache, counter](const std::string& op, DType dtype, const std::vector<int64_t>& key) {
      const std::vector<int64_t> bucket = BucketKey(op, key);
      std::optional<TuningEntry> e = cache->Find(op, dtype, bucket);
      counter->Count(EntryId(op, dtype, bucket), e.has_value());
      return e ? e->config : std::string();
    };
  }

  LookupCounts counts() const override { return counter_->Get(); }

  absl::Status Warmup(Backend* backend, const std::function<void(const std::string&)>& log_fn) override;

  WarmupReport report() const override {
    absl::MutexLock l(&mu_);
    return report_;
  }

  const std::vector<EnvelopeEntry>& envelope() const override { return envelope_; }

 private:
  // Tunes the missing entries; returns an error only when the device failed.
  absl::Status TuneMissing(const std::vector<const EnvelopeEntry*>& missing, Clock::time_point start, WarmupReport* r,
                           const std::function<void(const std::string&)>& log);
  absl::Status RunEnvelopeOnce(WarmupReport* r, const std::function<void(const std::string&)>& log);
  absl::Status SmokeBackend(Backend* backend, const std::function<void(const std::string&)>& log);

  const WarmupOptions options_;
  const std::vector<EnvelopeEntry> envelope_;
  const std::shared_ptr<TuningCache> cache_;
  const std::unique_ptr<Tuner> tuner_;
  const TuningServiceInternals internals_;
  // Distinct keys asked through counted_lookup().
  class Counter {
   public:
    void Count(const std::string& id, bool hit) {
      absl::MutexLock l(&mu_);
      if (!seen_.insert(id).second) return;
      ++counts_.keys;
      if (hit) {
        ++counts_.hits;
      } else {
        counts_.missed.push_back(id);
      }
    }
    LookupCounts Get() const {
      absl::MutexLock l(&mu_);
      return counts_;
    }

   private:
    mutable absl::Mutex mu_;
    std::set<std::string> seen_ ABSL_GUARDED_BY(mu_);
    LookupCounts counts_ ABSL_GUARDED_BY(mu_);
  };
  const std::shared_ptr<Counter> counter_ = std::make_shared<Counter>();
  absl::Mutex warmup_mu_;  // one Warmup at a time
  mutable absl::Mutex mu_;
  WarmupReport report_ ABSL_GUARDED_BY(mu_);
};

absl::Status TuningServiceImpl::Warmup(Backend* backend, const std::function<void(const std::string&)>& log_fn) {
  absl::MutexLock warmup_lock(&warmup_mu_);
  const Clock::time_point start = Clock::now();
  auto log = [&](const std::string& line) {
    if (log_fn) log_fn(line);
  };
  auto notices = [&] {
    for (const std::string& n : cache_->TakeNotices()) log(n);
  };
  notices();

  WarmupReport r;
  const bool on_device = tuner_ != nullptr && tuner_->Serves(backend);
  if (on_device) {
    // Create() stamped the cache with the current device; the backend may
    // have selected another one since.
    const CacheStamp stamp = tuner_->Stamp();
    if (stamp != cache_->stamp()) {
      log("tuning cache: the backend's device is " + stamp.ToString() + "; reloading for it");
      cache_->Reopen(stamp);
      notices();
    }
    cache_->Refresh();  // entries other replicas wrote since Create()
  }

  std::vector<const EnvelopeEntry*> missing;
  for (const EnvelopeEntry& e : envelope_) {
    if (cache_->Find(e.op, e.dtype, e.key)) {
      ++r.hits;
    } else {
      missing.push_back(&e);
    }
  }
  r.misses = static_cast<int64_t>(missing.size());
  std::string plan;
  if (!on_device) {
    plan = "no tuning on the " + std::string(backend != nullptr ? backend->name() : "absent") + " backend";
  } else if (missing.empty()) {
    plan = "nothing to tune";
  } else if (!options_.tune_missing) {
    plan = "tuning disabled: missing entries use default configs";
  } else {
    plan = absl::StrCat("tuning the missing ones (budget ", options_.tune_budget_seconds, " s)");
  }
  log(absl::StrCat("warm-up: envelope of ", envelope_.size(), " entries, ", r.hits, " in the tuning cache, ", r.misses,
                   " missing; ", plan));

  absl::Status status;
  if (on_device && options_.tune_missing && !missing.empty()) {
    status = TuneMissing(missing, start, &r, log);
  }
  cache_->Flush();
  notices();
  if (status.ok() && on_device) status = RunEnvelopeOnce(&r, log);
  if (tuner_ != nullptr) tuner_->Release();
  if (status.ok() && backend != nullptr) status = SmokeBackend(backend, log);

  r.cache_state = cache_->state();
  r.entries = cache_->size();
  std::vector<std::pair<std::string, int64_t>> rejected = cache_->rejected();
  for (const auto& [reason, n] : r.rejected) AddCount(&rejected, reason, n);
  r.rejected = std::move(rejected);
  r.seconds = SecondsSince(start);
  if (status.ok()) {
    log(absl::StrCat("warm-up done in ", Us(r.seconds), " s: cache ", r.cache_state, ", ", r.entries, " entries, ",
                     r.benchmarks, " configs timed"));
  }
  absl::MutexLock l(&mu_);
  report_ = r;
  return status;
}

absl::Status TuningServiceImpl::TuneMissing(const std::vector<const EnvelopeEntry*>& missing, Clock::time_point start,
                                            WarmupReport* r, const std::function<void(const std::string&)>& log) {
  const ConfigLookup tuned = lookup();
  Clock::time_point last_flush = Clock::now();
  const size_t n = missing.size();
  for (size_t i = 0; i < n; ++i) {
    const EnvelopeEntry& e = *missing[i];
    const std::string what = absl::StrCat("tuning ", i + 1, "/", n, " ", e.op, " ", DTypeFileName(e.dtype), " ",
                                          FormatTuningKey(e.op, e.key), ": ");
    if (SecondsSince(start) >= options_.tune_budget_seconds) {
      log(absl::StrCat("tuning budget of ", options_.tune_budget_seconds, " s spent; ", n - i,
                       " entries keep their default configs"));
      break;
    }
    if (cache_->Find(e.op, e.dtype, e.key)) {
      log(what + "tuned by another replica meanwhile");
      continue;
    }
    absl::StatusOr<TuneResult> result = tuner_->Tune(e, tuned);
    if (!result.ok()) {
      log(what + "failed: " + std::string(result.status().message()));
      return result.status();
    }
    r->benchmarks += result->benchmarks;
    std::vector<std::string> rejects;
    for (const auto& [config, reason] : result->rejected) {
      AddCount(&r->rejected, reason, 1);
      rejects.push_back(config + ": " + reason);
    }
    const std::string rejected_text =
        rejects.empty() ? "" : absl::StrCat("; rejected ", rejects.size(), " (", absl::StrJoin(rejects, ", "), ")");
    if (!result->supported) {
      log(what + "skipped (" + result->note + ")" + rejected_text);
      continue;
    }

    TuningEntry entry;
    entry.op = e.op;
    entry.dtype = e.dtype;
    entry.key = e.key;
    entry.candidates = result->candidates;
    entry.default_us = result->default_us;
    if (result->accepted.empty()) {
      // Nothing to choose from (one candidate or none): remember that, so a
      // warm restart does not look at this entry again.
      entry.config = result->default_config;
      cache_->Put(entry);
      log(absl::StrCat(what, result->candidates, result->candidates == 1 ? " candidate" : " candidates",
                       ", default config kept", rejected_text));
    } else {
      // A non-default config must beat the default by 1%: below that the
      // difference is timing noise and the default is the safer choice.
      const CandidateTime* best = &result->accepted[0];
      if (best->config != result->default_config && result->default_us > 0 && best->us > 0.99 * result->default_us) {
        for (const CandidateTime& c : result->accepted) {
          if (c.config == result->default_config) best = &c;
        }
      }
      entry.config = best->config;
      entry.time_us = best->us;
      for (const CandidateTime& c : result->accepted) {
        if (c.config != best->config) {
          entry.runner_up = c.config;
          entry.runner_up_us = c.us;
          break;
        }
      }
      cache_->Put(entry);
      std::string line =
          absl::StrCat(what, result->candidates, " candidates, best ", best->config, " ", Us(best->us), " us");
      if (result->default_us > 0) absl::StrAppend(&line, " (default ", Us(result->default_us), " us)");
      log(line + rejected_text);
    }
    if (SecondsSince(last_flush) >= internals_.flush_interval_seconds) {
      cache_->Flush();
      for (const std::string& notice : cache_->TakeNotices()) log(notice);
      last_flush = Clock::now();
    }
  }
  return absl::OkStatus();
}

absl::Status TuningServiceImpl::RunEnvelopeOnce(WarmupReport* r, const std::function<void(const std::string&)>& log) {
  const ConfigLookup tuned = lookup();
  std::set<std::string> unsupported;
  for (const EnvelopeEntry& e : envelope_) {
    if (unsupported.count(e.op)) continue;
    const std::string config = cache_->LookupConfig(e.op, e.dtype, e.key);
    absl::Status s = tuner_->RunOnce(e, config, tuned);
    if (absl::IsUnimplemented(s)) {
      unsupported.insert(e.op);
      continue;
    }
    if (absl::IsResourceExhausted(s)) {
      log(absl::StrCat("warm-up: ", e.op, " ", DTypeFileName(e.dtype), " ", FormatTuningKey(e.op, e.key),
                       " not run: ", s.message()));
      continue;
    }
    if (!s.ok() && !config.empty()) {
      // A cached config that no longer runs (e.g. a dev build whose kernels
      // changed under the same hash): use the default and forget the entry.
      log(absl::StrCat("warning: cached config ", config, " of ", e.op, " ", DTypeFileName(e.dtype), " ",
                       FormatTuningKey(e.op, e.key), " failed (", s.message(), "); using the default"));
      cache_->Forget(e.op, e.dtype, e.key);
      AddCount(&r->rejected, "launch_failed", 1);
      s = tuner_->RunOnce(e, "", tuned);
      if (absl::IsUnimplemented(s)) {
        unsupported.insert(e.op);
        continue;
      }
    }
    if (!s.ok()) {
      return absl::InternalError(absl::StrCat("warm-up run of ", e.op, " ", DTypeFileName(e.dtype), " ",
                                              FormatTuningKey(e.op, e.key), " failed: ", s.message()));
    }
  }
  if (!unsupported.empty()) {
    log("warm-up: no device kernel for " + absl::StrJoin(unsupported, ", ") + "; not run");
  }
  return absl::OkStatus();
}

absl::Status TuningServiceImpl::SmokeBackend(Backend* backend, const std::function<void(const std::string&)>& log) {
  std::set<std::string> done;
  std::vector<std::string> unsupported;
  for (const EnvelopeEntry& e : envelope_) {
    if (!done.insert(e.op + "|" + DTypeFileName(e.dtype)).second) continue;
    const OpRequest request = MakeRandomRequest(e.op, e.dtype, SmallTuningKey(e.op, e.key), /*seed=*/1);
    absl::StatusOr<TensorMap> out = backend->Run(request);
    if (absl::IsUnimplemented(out.status())) {
      unsupported.push_back(e.op);
      continue;
    }
    if (!out.ok()) {
      return absl::InternalError(absl::StrCat("warm-up run of ", e.op, " ", DTypeFileName(e.dtype), " on the ",
                                              backend->name(), " backend failed: ", out.status().message()));
    }
  }
  if (!unsupported.empty()) {
    log("warm-up: the " + backend->name() + " backend does not implement " + absl::StrJoin(unsupported, ", "));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TuningService>> CreateTuningService(const WarmupOptions& options, CacheStamp stamp,
                                                                   std::unique_ptr<Tuner> tuner,
                                                                   TuningServiceInternals internals) {
  if (options.max_tokens < 1) return absl::InvalidArgumentError("max_tokens must be at least 1");
  if (options.tune_budget_seconds < 0) return absl::InvalidArgumentError("tune_budget_seconds must be >= 0");
  std::vector<EnvelopeEntry> envelope;
  if (options.envelope_path.empty()) {
    envelope = DefaultEnvelope(options);
    for (const EnvelopeEntry& e : envelope) {
      if (absl::Status s = ValidateTuningKey(e.op, e.key); !s.ok()) {
        return absl::InvalidArgumentError("default envelope from the model dims: " + std::string(s.message()));
      }
    }
  } else {
    absl::StatusOr<std::vector<EnvelopeEntry>> loaded = LoadEnvelopeFile(options.envelope_path);
    if (!loaded.ok()) return loaded.status();
    envelope = std::move(*loaded);
  }
  std::shared_ptr<TuningCache> cache = TuningCache::Open(options.cache_path, std::move(stamp));
  return std::unique_ptr<TuningService>(
      new TuningServiceImpl(options, std::move(envelope), std::move(cache), std::move(tuner), internals));
}

absl::StatusOr<std::unique_ptr<TuningService>> TuningService::Create(const WarmupOptions& options) {
  std::unique_ptr<Tuner> tuner = MakeCudaTuner();
  CacheStamp stamp = tuner != nullptr ? tuner->Stamp() : HostStamp();
  return CreateTuningService(options, std::move(stamp), std::move(tuner));
}

}  // namespace fusedserve
