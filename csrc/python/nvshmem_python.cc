// The Python side of NVSHMEM (jax_mosaic_ffi/call/peers/nvshmem.py): its starter,
// called from XLA's thread with the GIL taken here (as the peer exchange is),
// and the calls that starter makes: a unique id, the start, the finalize.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "peers/nvshmem_runtime.h"

namespace nb = nanobind;

namespace jmf {
namespace {

ffi::Error CallStarter(const nb::object& fn, int32_t device, const std::string& who) {
  if (!Py_IsInitialized()) return ffi::Error::Internal(who + ": Python is shutting down; NVSHMEM cannot start");
  nb::gil_scoped_acquire gil;
  try {
    fn(device, who);
    return ffi::Error::Success();
  } catch (nb::python_error& e) {
    const bool timeout = e.matches(PyExc_TimeoutError);
    return ffi::Error(timeout ? ffi::ErrorCode::kDeadlineExceeded : ffi::ErrorCode::kFailedPrecondition,
                      nb::str(e.value()).c_str());
  }
}

const Driver& DriverOrThrow() {
  std::string error;
  const Driver* driver = GetDriver(&error);
  if (driver == nullptr) throw std::runtime_error(error);
  return *driver;
}

void ThrowIfError(const ffi::Error& error) {
  if (error.failure()) throw std::runtime_error(error.message());
}

}  // namespace

void BindNvshmem(nb::module_& m) {
  m.def(
      "set_nvshmem_starter",
      [](nb::callable fn) {
        auto* held = new nb::object(std::move(fn));  // never released: XLA threads may call it until the end
        SetNvshmemStarter([held](int32_t device, const std::string& who) { return CallStarter(*held, device, who); });
      },
      nb::arg("fn"), "Registers fn(device, who), which starts NVSHMEM when a kernel first needs it.");
  m.def(
      "nvshmem_unique_id",
      [](const std::string& path) {
        std::string id;
        ThrowIfError(MakeNvshmemUniqueId(path, &id));
        return nb::bytes(id.data(), id.size());
      },
      nb::arg("library"), "A fresh NVSHMEM unique id (nvshmemx_get_uniqueid) from the host library at `library`.");
  m.def(
      "nvshmem_start",
      [](const std::string& path, nb::bytes id, int rank, int nranks, int32_t device) {
        const Driver& driver = DriverOrThrow();
        std::string uid(id.c_str(), id.size());
        nb::gil_scoped_release release;  // init waits for every peer
        ThrowIfError(StartNvshmem(driver, path, uid, rank, nranks, device));
      },
      nb::arg("library"), nb::arg("unique_id"), nb::arg("rank"), nb::arg("nranks"), nb::arg("device"),
      "Starts NVSHMEM as PE `rank` of `nranks` on local GPU `device` (nvshmemx_init_attr with the unique id).");
  m.def(
      "nvshmem_finalize",
      [] {
        nb::gil_scoped_release release;
        FinalizeNvshmem();
      },
      "nvshmem_finalize, once.");
  m.def("nvshmem_job", [] {
    NvshmemJob job = GetNvshmemJob();
    nb::dict d;
    d["started"] = job.started;
    d["pe"] = job.pe;
    d["npes"] = job.npes;
    d["device"] = job.device;
    d["symmetric_bytes"] = job.symmetric_bytes;
    d["symmetric_buffers"] = job.symmetric_buffers;
    d["registered_modules"] = job.registered_modules;
    return d;
  });
}

}  // namespace jmf
