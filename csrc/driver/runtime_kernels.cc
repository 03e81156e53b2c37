#include "driver/runtime_kernels.h"

#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace jmf {
namespace {

// The pre-launch device barrier: thread t signals rank t and waits for it.
// A peer that never signals traps after `timeout` ns rather than hanging the
// GPU (the host-side rendezvous normally catches it first).
constexpr char kBarrierPtx[] = R"ptx(
.version 7.0
.target sm_70
.address_size 64

.visible .entry jmf_runtime_barrier(
    .param .u64 areas_param,
    .param .u32 rank_param,
    .param .u32 peers_param,
    .param .u64 timeout_param)
{
    .reg .pred %p<4>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<17>;

    ld.param.u64 %rd1, [areas_param];
    ld.param.u32 %r1, [rank_param];
    ld.param.u32 %r2, [peers_param];
    ld.param.u64 %rd2, [timeout_param];
    mov.u32 %r3, %tid.x;
    mul.wide.u32 %rd3, %r1, 8;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.u64 %rd5, [%rd4];
    ld.volatile.global.u64 %rd6, [%rd5+512];
    add.s64 %rd7, %rd6, 1;
    setp.ge.u32 %p1, %r3, %r2;
    @%p1 bra SYNC;
    mul.wide.u32 %rd8, %r3, 8;
    add.s64 %rd9, %rd1, %rd8;
    ld.global.u64 %rd10, [%rd9];
    add.s64 %rd11, %rd10, %rd3;
    st.release.sys.global.u64 [%rd11], %rd7;
    add.s64 %rd12, %rd5, %rd8;
    mov.u64 %rd13, %globaltimer;
WAIT:
    ld.acquire.sys.global.u64 %rd14, [%rd12];
    setp.ge.u64 %p2, %rd14, %rd7;
    @%p2 bra SYNC;
    nanosleep.u32 32;
    mov.u64 %rd15, %globaltimer;
    sub.s64 %rd16, %rd15, %rd13;
    setp.lt.u64 %p3, %rd16, %rd2;
    @%p3 bra WAIT;
    trap;
SYNC:
    bar.sync 0;
    setp.ne.u32 %p1, %r3, 0;
    @%p1 bra DONE;
    st.volatile.global.u64 [%rd5+512], %rd7;
DONE:
    ret;
}
)ptx";

static_assert(kRuntimeGeneration * 8 == 512, "the barrier PTX reads the generation at byte 512");

// Debug poisoning and scratch zeroing inside CUDA graphs, where the record API has no memset:
// 4-byte stores over the words, then thread 0 of block 0 does the tail bytes.
constexpr char kFillPtx[] = R"ptx(
.version 7.0
.target sm_70
.address_size 64

.visible .entry jmf_runtime_fill(
    .param .u64 ptr_param,
    .param .u64 bytes_param,
    .param .u32 word_param)
{
    .reg .pred %p<4>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<12>;

    ld.param.u64 %rd1, [ptr_param];
    ld.param.u64 %rd2, [bytes_param];
    shr.u64 %rd3, %rd2, 2;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    cvt.u64.u32 %rd5, %r3;
    mad.wide.u32 %rd4, %r1, %r2, %rd5;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd6, %r4, %r2;
    ld.param.u32 %r5, [word_param];
WORDS:
    setp.ge.u64 %p1, %rd4, %rd3;
    @%p1 bra TAIL;
    shl.b64 %rd7, %rd4, 2;
    add.s64 %rd8, %rd1, %rd7;
    st.global.u32 [%rd8], %r5;
    add.s64 %rd4, %rd4, %rd6;
    bra.uni WORDS;
TAIL:
    or.b32 %r6, %r1, %r3;
    setp.ne.u32 %p2, %r6, 0;
    @%p2 bra DONE;
    shl.b64 %rd9, %rd3, 2;
TAILLOOP:
    setp.ge.u64 %p3, %rd9, %rd2;
    @%p3 bra DONE;
    add.s64 %rd10, %rd1, %rd9;
    st.global.u8 [%rd10], %r5;
    add.s64 %rd9, %rd9, 1;
    bra.uni TAILLOOP;
DONE:
    ret;
}
)ptx";

}  // namespace

RuntimeKernelSource Source(RuntimeKernel kernel) {
  switch (kernel) {
    case RuntimeKernel::kBarrier:
      return {"jmf_runtime_barrier", kBarrierPtx, sizeof(kBarrierPtx)};
    case RuntimeKernel::kFill:
      return {"jmf_runtime_fill", kFillPtx, sizeof(kFillPtx)};
  }
  return {"", "", 1};
}

CUfunction LoadRuntimeKernel(const Driver& driver, CUcontext context, RuntimeKernel kernel, std::string* error) {
  static std::mutex mutex;
  static auto* loaded = new std::map<std::pair<CUcontext, RuntimeKernel>, CUfunction>();
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = loaded->find({context, kernel}); it != loaded->end()) return it->second;
  const RuntimeKernelSource source = Source(kernel);
  ScopedContext scoped(driver, context);
  CUmodule module = nullptr;
  if (CUresult r = driver.cuModuleLoadDataEx(&module, source.ptx, 0, nullptr, nullptr); r != CUDA_SUCCESS) {
    *error = std::string("loading the runtime kernel ") + source.symbol + ": " + CudaErrorText(driver, r);
    return nullptr;
  }
  CUfunction function = nullptr;
  if (CUresult r = driver.cuModuleGetFunction(&function, module, source.symbol); r != CUDA_SUCCESS) {
    *error = std::string("loading the runtime kernel ") + source.symbol + ": " + CudaErrorText(driver, r);
    return nullptr;
  }
  (*loaded)[{context, kernel}] = function;
  return function;
}

}  // namespace jmf
