// A CUPTI injection library that records every kernel (graph nodes included)
// with its start/end timestamps, for machines without Nsight Systems.
//   CUDA_INJECTION64_PATH=libcupti_trace.so FS_TRACE_OUT=kernels.csv ./binary
// Writes "start_ns,end_ns,grid_x,block_x,name" lines at exit
// (bench/tools/cupti_steps.py summarises them per decode step). Not part of
// the CMake build; build it beside the CUDA toolkit's CUPTI and ship both:
//   g++ -O2 -shared -fPIC -o libcupti_trace.so bench/tools/cupti_trace.cc
//       -I$CUDA/include -L$CUDA/lib -lcupti -Wl,-rpath,'$ORIGIN'   (one line)
//   cp $CUDA/lib/libcupti.so.13 .   (next to libcupti_trace.so)
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Rec {
  uint64_t start, end;
  int32_t grid, block;
  std::string name;
};
std::mutex g_mu;
std::vector<Rec>* g_recs = new std::vector<Rec>();  // leaked: used from the atexit flush

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 8 << 20;
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      g_recs->push_back(Rec{k->start, k->end, k->gridX, k->blockX, k->name ? k->name : "?"});
    }
  }
  free(buffer);
}

void Flush() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("FS_TRACE_OUT");
  FILE* f = std::fopen(path ? path : "kernels.csv", "w");
  if (f == nullptr) return;
  std::lock_guard<std::mutex> lock(g_mu);
  for (const Rec& r : *g_recs) {
    std::string n = r.name;
    for (char& c : n)
      if (c == ',') c = ';';
    std::fprintf(f, "%llu,%llu,%d,%d,%s\n", static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.grid, r.block, n.c_str());
  }
  std::fclose(f);
}

}  // namespace

extern "C" int InitializeInjection() {
  cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  std::atexit(Flush);
  return 1;
}
