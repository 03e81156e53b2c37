#include "peers/cross_process.h"

#include <map>
#include <mutex>

#include "ffi/status.h"

namespace jmf {
namespace {

std::mutex registry_mutex;
PeerExchangeFn* registered_exchange = nullptr;            // leaked: outlives static destructors
std::map<int32_t, int32_t>* ordinal_to_global = nullptr;  // null: one process drives every device
std::atomic<int64_t> live_workspaces{0}, peer_mappings{0};

}  // namespace

void SetPeerExchange(PeerExchangeFn exchange) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registered_exchange = new PeerExchangeFn(std::move(exchange));  // an old one is leaked on purpose: tiny, rare
}

void SetProcessDevices(const std::vector<std::pair<int32_t, int32_t>>& pairs) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto* map = new std::map<int32_t, int32_t>(pairs.begin(), pairs.end());
  ordinal_to_global = map;  // set once per process in practice; never freed, read without copies
}

int32_t GlobalDeviceId(int32_t ordinal) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  if (ordinal_to_global == nullptr) return ordinal;
  auto it = ordinal_to_global->find(ordinal);
  return it == ordinal_to_global->end() ? -1 : it->second;
}

int32_t LocalOrdinal(int32_t global_id) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  if (ordinal_to_global == nullptr) return global_id;
  for (const auto& [ordinal, global] : *ordinal_to_global) {
    if (global == global_id) return ordinal;
  }
  return -1;
}

bool IsLocalDevice(int32_t global_id) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  if (ordinal_to_global == nullptr) return true;
  for (const auto& [ordinal, global] : *ordinal_to_global) {
    if (global == global_id) return true;
  }
  return false;
}

CrossProcessStats GetCrossProcessStats() {
  return CrossProcessStats{live_workspaces.load(), peer_mappings.load(), LiveSharedPages()};
}

ffi::ErrorOr<std::unique_ptr<SharedWorkspace>> SharedWorkspace::Create(const Driver& driver, CUcontext context,
                                                                       size_t bytes,
                                                                       const PeerExchangeRequest& request) {
  PeerExchangeFn exchange;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    if (registered_exchange != nullptr) exchange = *registered_exchange;
  }
  if (!exchange) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      request.who +
                          ": the clique spans processes but no peer exchange is registered "
                          "(jax_mosaic_ffi.cross_process.install runs when such a kernel is lowered)");
  }
  std::unique_ptr<SharedWorkspace> ws(new SharedWorkspace(driver, context));
  ws->rank_ = request.rank;
  auto host = HostRendezvous::Create(request.rank, request.device_ids, request.who);
  if (!host.has_value()) return host.error();
  ws->host_ = std::move(*host);
  if (ffi::Error e = ws->Allocate(bytes, request.who); e.failure()) return e;
  PeerExchangeRequest trade = request;
  if (ffi::Error e = ws->Deposit(request.who, &trade.mine); e.failure()) return e;
  ws->exchange_ = exchange;
  ws->request_ = trade;
  SharedWorkspace* self = ws.get();  // owns the function: it never outlives the workspace
  ws->trade_again_ = [self](std::vector<std::string>* out) { return self->exchange_(self->request_, out); };
  std::vector<std::string> deposits;
  if (ffi::Error e = exchange(trade, &deposits); e.failure()) return e;
  if (deposits.size() != request.device_ids.size()) {
    return ffi::Error::Internal(request.who + ": the peer exchange returned " + std::to_string(deposits.size()) +
                                " deposits for a clique of " + std::to_string(request.device_ids.size()));
  }
  ws->peers_.resize(deposits.size());
  ws->peers_[ws->rank_].address = ws->local_;
  for (int r = 0; r < static_cast<int>(deposits.size()); ++r) {
    if (r == ws->rank_) continue;
    if (ffi::Error e = ws->MapPeer(r, deposits[r], request); e.failure()) return e;
  }
  return ws;
}

ffi::Error SharedWorkspace::Allocate(size_t bytes, const std::string& who) {
  ScopedContext scoped(driver_, context_);
  if (CUresult r = driver_.cuMemAlloc(&local_, bytes); r != CUDA_SUCCESS) {
    local_ = 0;
    return ffi::Error(
        ffi::ErrorCode::kResourceExhausted,
        who + ": allocating a " + std::to_string(bytes) + "-byte collective workspace: " + CudaErrorText(driver_, r));
  }
  bytes_ = bytes;
  live_workspaces.fetch_add(1);
  RegisterLocalWorkspace(local_, bytes_);
  // Zeroed and finished before any peer can learn of it and signal into it.
  CUresult r = driver_.cuMemsetD8(local_, 0, bytes);
  if (r == CUDA_SUCCESS) r = driver_.cuCtxSynchronize();
  if (r != CUDA_SUCCESS) return ffi::Error::Internal(who + ": clearing the workspace: " + CudaErrorText(driver_, r));
  return ffi::Error::Success();
}

ffi::Error SharedWorkspace::Deposit(const std::string& who, std::string* out) const {
  CUipcMemHandle handle{};
  ScopedContext scoped(driver_, context_);
  if (CUresult r = driver_.cuIpcGetMemHandle(&handle, local_); r != CUDA_SUCCESS) {
    return ffi::Error::Internal(who + ": exporting the workspace (cuIpcGetMemHandle): " + CudaErrorText(driver_, r));
  }
  *out = EncodeDeposit(bytes_, local_, handle, host_->page_name());
  return ffi::Error::Success();
}

ffi::Error SharedWorkspace::MapPeer(int r, const std::string& deposit, const PeerExchangeRequest& request) {
  DepositRecord d{};
  bool same_process = false;
  JMF_RETURN_IF_ERROR(host_->Admit(r, deposit, bytes_, request.who, &d, &same_process));
  if (same_process) {  // the pointer works with peer access on
    peers_[r].address = d.address;
    return ffi::Error::Success();
  }
  ScopedContext scoped(driver_, context_);
  CUdeviceptr mapped = 0;
  if (CUresult res = driver_.cuIpcOpenMemHandle(&mapped, d.handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
      res != CUDA_SUCCESS) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      request.who + ": opening " + host_->PeerName(r) +
                          "'s workspace with CUDA IPC: " + CudaErrorText(driver_, res) +
                          ". The GPUs of a clique must share one host and reach each other (NVLink or PCIe)");
  }
  peers_[r].address = mapped;
  peers_[r].opened = true;
  peer_mappings.fetch_add(1);
  return ffi::Error::Success();
}

SharedWorkspace::~SharedWorkspace() {
  ScopedContext scoped(driver_, context_);
  if (local_ != 0) driver_.cuCtxSynchronize();  // nothing queued may still use the mappings
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
    if (r != rank_ && peers_[r].opened) {
      driver_.cuIpcCloseMemHandle(peers_[r].address);
      peer_mappings.fetch_sub(1);
    }
  }
  host_.reset();
  if (local_ != 0) {
    UnregisterLocalWorkspace(local_);
    driver_.cuMemFree(local_);
    live_workspaces.fetch_sub(1);
  }
}

}  // namespace jmf
