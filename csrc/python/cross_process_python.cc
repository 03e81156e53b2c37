// The Python side of collectives across processes: the key-value exchange
// (jax_mosaic_ffi/call/peers/cross_process.py), called from XLA's thread with the GIL
// taken here. jax releases the GIL while executables run, as its own host
// callbacks need, so this cannot deadlock against the caller.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "peers/cross_process.h"
#include "peers/host_rendezvous.h"

namespace nb = nanobind;

namespace jmf {
namespace {

// Calls a Python function that returns every rank's bytes (the GIL taken here); its TimeoutError is a
// deadline, any other exception a failed precondition, with its message.
template <typename Call>
ffi::Error CallForDeposits(const Call& call, const std::string& who, std::vector<std::string>* all) {
  if (!Py_IsInitialized()) return ffi::Error::Internal(who + ": Python is shutting down; no peer exchange");
  nb::gil_scoped_acquire gil;
  try {
    nb::object result = call();
    all->clear();
    for (nb::handle item : result) {
      nb::bytes value = nb::cast<nb::bytes>(item);
      all->emplace_back(value.c_str(), value.size());
    }
    return ffi::Error::Success();
  } catch (nb::python_error& e) {
    const bool timeout = e.matches(PyExc_TimeoutError);
    std::string message = nb::str(e.value()).c_str();
    return ffi::Error(timeout ? ffi::ErrorCode::kDeadlineExceeded : ffi::ErrorCode::kFailedPrecondition, message);
  } catch (const std::exception& e) {
    return ffi::Error::Internal(who + ": the peer exchange returned something other than a list of bytes: " + e.what());
  }
}

ffi::Error CallExchange(const nb::object& fn, const PeerExchangeRequest& r, std::vector<std::string>* all) {
  return CallForDeposits(
      [&] {
        return fn(r.key, r.rank, r.device_ids, nb::bytes(r.mine.data(), r.mine.size()), r.timeout.count() / 1000.0,
                  r.who);
      },
      r.who, all);
}

// Test hook (tests/test_cross_process.py): the host half of one rank of a
// clique across processes, with no GPU. It runs the runtime's own code for
// the flag page and for checking a peer's deposit, and the rendezvous;
// `address` stands in for the device workspace and is registered as a live
// workspace of this process, as cuMemAlloc's is. Errors raise RuntimeError
// with the runtime's message.
class HostRankForTests {
 public:
  HostRankForTests(int rank, std::vector<int32_t> device_ids, uint64_t bytes, uint64_t address)
      : bytes_(bytes), address_(address) {
    auto host = HostRendezvous::Create(rank, device_ids, "test rank " + std::to_string(rank));
    if (!host.has_value()) throw std::runtime_error(host.error().message());
    host_ = std::move(*host);
    RegisterLocalWorkspace(address_, bytes_);
  }
  ~HostRankForTests() { Close(); }

  nb::bytes Deposit() const {
    std::string d = DepositBytes();
    return nb::bytes(d.data(), d.size());
  }

  // Admits every peer's deposit; says for each rank whether its address is used as is.
  std::vector<std::string> Admit(const std::vector<nb::bytes>& deposits) {
    HostRendezvous& host = Host();
    if (static_cast<int>(deposits.size()) != host.size()) throw std::invalid_argument("one deposit per rank");
    std::vector<std::string> out;
    for (int r = 0; r < host.size(); ++r) {
      if (r == host.rank()) {
        out.push_back("self");
        continue;
      }
      DepositRecord d{};
      bool same = false;
      const std::string bytes(deposits[r].c_str(), deposits[r].size());
      if (ffi::Error e = host.Admit(r, bytes, bytes_, "test rank " + std::to_string(host.rank()), &d, &same);
          e.failure()) {
        throw std::runtime_error(e.message());
      }
      out.push_back(same ? "same process" : "other process");
    }
    return out;
  }

  void Arrive(double timeout_s) {
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    ffi::Error e = Host().Arrive(timeout, "test rank " + std::to_string(Host().rank()));
    if (e.failure()) throw std::runtime_error(e.message());
  }

  // What each execution does (HostRendezvous::Meet): `trade(deposit)` returns every rank's deposit, as the
  // key-value exchange does (tests pass jax_mosaic_ffi.call.peers.cross_process.exchange, bound to their key).
  void Meet(nb::object trade, double timeout_s) {
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    const std::string who = "test rank " + std::to_string(Host().rank());
    const std::string mine = DepositBytes();
    const DepositTrade again = [&](std::vector<std::string>* all) {
      return CallForDeposits([&] { return trade(nb::bytes(mine.data(), mine.size())); }, who, all);
    };
    ffi::Error e = ffi::Error::Success();
    {
      nb::gil_scoped_release released;
      e = Host().Meet(again, mine, timeout, who);
    }
    if (e.failure()) throw std::runtime_error(e.message());
  }

  bool Broken() const { return Host().broken(); }

  std::string PageName() const { return Host().page_name(); }

  void Close() {
    if (host_ == nullptr) return;
    host_.reset();
    UnregisterLocalWorkspace(address_);
  }

 private:
  HostRendezvous& Host() const {
    if (host_ == nullptr) throw std::runtime_error("closed");
    return *host_;
  }
  // Made once, as the runtime's is at set-up (the page's name is released after the first rendezvous).
  std::string DepositBytes() const {
    if (deposit_.empty()) deposit_ = EncodeDeposit(bytes_, address_, CUipcMemHandle{}, Host().page_name());
    return deposit_;
  }
  uint64_t bytes_, address_;
  mutable std::string deposit_;
  std::unique_ptr<HostRendezvous> host_;
};

}  // namespace

void BindCrossProcess(nb::module_& m) {
  nb::class_<HostRankForTests>(m, "_HostRankForTests",
                               "Test hook: the host half of one cross-process rank, no GPU needed.")
      .def(nb::init<int, std::vector<int32_t>, uint64_t, uint64_t>(), nb::arg("rank"), nb::arg("device_ids"),
           nb::arg("bytes"), nb::arg("address"))
      .def("deposit", &HostRankForTests::Deposit)
      .def("admit", &HostRankForTests::Admit, nb::arg("deposits"))
      .def("arrive", &HostRankForTests::Arrive, nb::arg("timeout_s"), nb::call_guard<nb::gil_scoped_release>())
      .def("meet", &HostRankForTests::Meet, nb::arg("trade"), nb::arg("timeout_s"))
      .def_prop_ro("broken", &HostRankForTests::Broken)
      .def_prop_ro("page_name", &HostRankForTests::PageName)
      .def("close", &HostRankForTests::Close);
  m.def("_cross_process_layout", [] {
    nb::dict d;  // where a test finds the fields of a deposit and of a flag page
    d["deposit_bytes"] = sizeof(DepositRecord);
    d["deposit_pid"] = offsetof(DepositRecord, pid);
    d["deposit_address"] = offsetof(DepositRecord, address);
    d["deposit_token"] = offsetof(DepositRecord, token);
    d["deposit_page"] = offsetof(DepositRecord, page);
    d["token_bytes"] = kTokenBytes;
    d["page_bytes"] = kPageBytes;
    d["page_token"] = offsetof(SharedPage, token);
    d["page_arrived"] = offsetof(SharedPage, flags) + offsetof(HostFlags, arrived);
    d["page_broken_by"] = offsetof(SharedPage, flags) + offsetof(HostFlags, broken_by);
    return d;
  });
  m.def(
      "set_peer_exchange",
      [](nb::callable fn) {
        // Never released: XLA threads may call it until the process ends.
        auto* held = new nb::object(std::move(fn));
        SetPeerExchange([held](const PeerExchangeRequest& r, std::vector<std::string>* all) {
          return CallExchange(*held, r, all);
        });
      },
      nb::arg("fn"), "Registers the key-value exchange for cliques that span processes.");
  m.def("set_process_devices", &SetProcessDevices, nb::arg("ordinal_to_global"),
        "Which global device id each local GPU ordinal is (jax.distributed).");
  m.def("cross_process_stats", [] {
    CrossProcessStats s = GetCrossProcessStats();
    nb::dict d;
    d["live_workspaces"] = s.live_workspaces;
    d["peer_mappings"] = s.peer_mappings;
    d["shared_pages"] = s.shared_pages;
    return d;
  });
}

}  // namespace jmf
