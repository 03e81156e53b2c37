// ===== csrc/python/: the nanobind modules =====
// _core (this file, contract_python.cc, cross_process_python.cc and
// nvshmem_python.cc) and the benchmarks' _benchmark_targets. The top layer: may include nanobind and every folder
// below (runtime/, peers/, ffi/, driver/, contract/); nothing in csrc/
// includes these. Layers: contract <- driver <- ffi <- peers <- runtime <-
// python (scripts/check_csrc_layers.py).
//
// jax_mosaic_ffi._core: what Python needs from the C++ runtime.
//
// Handler capsules for jax.ffi registration, the state type, cache
// statistics, and the contract itself (contract_python.cc): its limits, the
// launch validator and the module parser, so that trace-time checks and the
// disk cache use the very code XLA's instantiate stage runs. Importing it
// touches no GPU.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "contract/contract.h"
#include "ffi/record_layouts.h"
#include "peers/collective.h"
#include "runtime/call_site.h"
#include "runtime/handlers.h"
#include "runtime/kernel_cache.h"

namespace nb = nanobind;

namespace jmf {
namespace {

constexpr XLA_FFI_TypeInfo kCallSiteTypeInfo = ffi::MakeTypeInfo<CallSite>();

nb::capsule Capsule(const void* ptr) { return nb::capsule(ptr); }

nb::dict HandlerCapsules(const std::string& name, bool with_record) {
  for (const TargetBundle& target : Targets()) {
    if (name != target.name) continue;
    nb::dict handlers;
    const XLA_FFI_Handler_Bundle& b = target.bundle;
    if (b.instantiate) handlers["instantiate"] = Capsule(reinterpret_cast<void*>(b.instantiate));
    if (b.prepare) handlers["prepare"] = Capsule(reinterpret_cast<void*>(b.prepare));
    if (b.initialize) handlers["initialize"] = Capsule(reinterpret_cast<void*>(b.initialize));
    handlers["execute"] = Capsule(reinterpret_cast<void*>(b.execute));
    if (with_record && b.record) handlers["record"] = Capsule(reinterpret_cast<void*>(b.record));
    return handlers;
  }
  throw nb::value_error(("unknown target " + name).c_str());
}

// Threads stand in for devices: `arriving` of `participants` ranks show up.
std::vector<std::string> RendezvousProbe(int participants, int arriving, double timeout_s) {
  if (participants < 1 || participants > kMaxPeers || arriving < 0 || arriving > participants) {
    throw nb::value_error("0 <= arriving <= participants <= kMaxPeers");
  }
  Rendezvous rendezvous(participants, 1);
  std::vector<std::string> results(arriving);
  std::vector<std::thread> threads;
  {
    nb::gil_scoped_release release;
    for (int rank = 0; rank < arriving; ++rank) {
      threads.emplace_back([&, rank] {
        uint64_t mine = 100 + rank;
        std::vector<uint64_t> all(participants);
        ffi::Error e = rendezvous.Exchange(7, rank, &mine, all.data(),
                                           std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)), "probe");
        if (e.failure()) {
          results[rank] = e.message();
        } else {
          for (uint64_t v : all) results[rank] += std::to_string(v) + " ";
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  return results;
}

nb::list VisibleGpus() {
  nb::list gpus;
  const Driver* driver = GetDriver(nullptr);
  int count = 0;
  if (driver == nullptr || driver->cuDeviceGetCount(&count) != CUDA_SUCCESS) return gpus;
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    CUdevice device;
    if (driver->cuDeviceGet(&device, ordinal) != CUDA_SUCCESS) continue;
    char name[256] = {0};
    driver->cuDeviceGetName(name, sizeof(name) - 1, device);
    auto attr = [&](CUdevice_attribute which) {
      int value = 0;
      driver->cuDeviceGetAttribute(&value, which, device);
      return value;
    };
    nb::dict gpu;
    gpu["ordinal"] = ordinal;
    gpu["name"] = std::string(name);
    gpu["arch"] =
        attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) * 10 + attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    gpu["max_shared_memory_per_block_optin"] = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    gpu["max_threads_per_block"] = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    gpu["max_grid"] =
        std::make_tuple(attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X), attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y),
                        attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z));
    gpu["max_block"] =
        std::make_tuple(attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X), attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y),
                        attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z));
    gpus.append(gpu);
  }
  return gpus;
}

}  // namespace

void BindContract(nb::module_& m, nb::module_& testing);  // contract_python.cc
void BindCrossProcess(nb::module_& m);                    // cross_process_python.cc
void BindNvshmem(nb::module_& m);                         // nvshmem_python.cc
void BindCute(nb::module_& m);                            // cute_python.cc (after _testing: it adds hooks there)

}  // namespace jmf

NB_MODULE(_core, m) {
  using namespace jmf;
  m.doc() = "C++ runtime of jax_mosaic_ffi: XLA FFI handlers, their caches, and the custom-call contract.";

  m.def("target_names", [] {
    std::vector<std::string> names;
    for (const TargetBundle& t : Targets()) names.push_back(t.name);
    return names;
  });
  m.def("command_buffer_targets", [] {
    std::vector<std::string> names;
    for (const TargetBundle& t : Targets()) {
      if (t.command_buffer) names.push_back(t.name);
    }
    return names;
  });
  m.def("handlers", &HandlerCapsules, nb::arg("name"), nb::arg("with_record") = false,
        "Capsules of one target's stage handlers, for jax.ffi.register_ffi_target.");
  m.def("bootstrap_handler", [] { return Capsule(reinterpret_cast<void*>(BootstrapHandler())); });
  m.attr("BOOTSTRAP_TARGET") = kBootstrapTarget;
  m.def("state_type", [] {
    nb::dict d;
    d["type_id"] = Capsule(&CallSite::id);
    d["type_info"] = Capsule(&kCallSiteTypeInfo);
    return d;
  });
  m.attr("RECORD_PROBE_TARGET") = kRecordProbeTarget;
  m.def("record_registration", [] {
    RecordRegistration r = GetRecordRegistration();
    nb::dict d;
    d["attempted"] = r.attempted;
    d["probe_registered"] = r.probe_registered;
    d["probe_seen"] = r.probe_seen;
    d["record_version"] = r.probe_seen ? nb::cast(std::make_tuple(r.record_major, r.record_minor)) : nb::none();
    d["registered"] = r.registered;
    d["message"] = r.message;
    return d;
  });
  m.def("register_record_targets", &RegisterRecordTargets, nb::call_guard<nb::gil_scoped_release>(),
        "After the probe proved the record layout: the targets, with record handlers, through the plugin's API.");
  m.def(
      "record_layout_for",
      [](int major, int minor) -> nb::object {
        const char* name = record_abi::LayoutName(record_abi::LayoutFor(major, minor));
        return *name ? nb::cast(std::string(name)) : nb::none();
      },
      nb::arg("major"), nb::arg("minor"),
      "The record-extension layout this build calls for version (major, minor), or None: no record handlers.");
  m.def("cache_stats", [] {
    CacheStats& s = GetCacheStats();
    nb::dict d;
    d["module_parses"] = s.module_parses.load();
    d["parse_cache_hits"] = s.parse_cache_hits.load();
    d["cached_kernels"] = KernelCacheSize();
    d["module_loads"] = s.module_loads.load();
    d["loaded_modules"] = s.loaded_modules.load();
    d["records_created"] = s.records_created.load();
    d["tensor_map_encodes"] = s.tensor_map_encodes.load();
    d["instantiations"] = s.instantiations.load();
    d["instantiate_seconds"] = s.instantiate_ns.load() * 1e-9;
    d["collective_prepares"] = s.collective_prepares.load();
    d["collective_initializes"] = s.collective_initializes.load();
    return d;
  });
  m.def("clear_kernel_cache", &ClearKernelCache);

  m.def("visible_gpus", &VisibleGpus, "The visible GPUs and their launch limits; empty without a driver.");
  BindCrossProcess(m);
  BindNvshmem(m);

  nb::module_ testing = m.def_submodule("_testing", "Hooks for the test suite only; not API.");
  testing.def("rendezvous_probe", &RendezvousProbe, nb::arg("participants"), nb::arg("arriving"), nb::arg("timeout_s"),
              "Runs the collective rendezvous with threads as ranks.");
  BindContract(m, testing);
  BindCute(m);

  nb::dict built;
  built["jaxlib"] = JMF_JAXLIB_VERSION;
  built["ffi_api"] = std::to_string(XLA_FFI_API_MAJOR) + "." + std::to_string(XLA_FFI_API_MINOR);
  built["cuda"] = CUDA_VERSION;
  m.attr("BUILT_AGAINST") = built;
}
