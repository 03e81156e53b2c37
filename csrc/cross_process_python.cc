// The Python side of collectives across processes: the key-value exchange
// (jax_mosaic_ffi/cross_process.py), called from XLA's thread with the GIL
// taken here. jax releases the GIL while executables run, as its own host
// callbacks need, so this cannot deadlock against the caller.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cross_process.h"

namespace nb = nanobind;

namespace jmf {
namespace {

ffi::Error CallExchange(const nb::object& fn, const PeerExchangeRequest& r, std::vector<std::string>* all) {
  if (!Py_IsInitialized()) return ffi::Error::Internal(r.who + ": Python is shutting down; no peer exchange");
  nb::gil_scoped_acquire gil;
  try {
    nb::object result =
        fn(r.key, r.rank, r.device_ids, nb::bytes(r.mine.data(), r.mine.size()), r.timeout.count() / 1000.0, r.who);
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
    return ffi::Error::Internal(r.who +
                                ": the peer exchange returned something other than a list of bytes: " + e.what());
  }
}

}  // namespace

void BindCrossProcess(nb::module_& m) {
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
