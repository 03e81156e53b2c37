// ===== csrc/python/: the nanobind modules =====
// _core (this file and cross_process_python.cc) and the benchmarks'
// _benchmark_targets. The top layer: may include nanobind and every folder
// below (runtime/, peers/, ffi/, driver/, contract/); nothing in csrc/
// includes these. Layers: contract <- driver <- ffi <- peers <- runtime <-
// python (scripts/check_csrc_layers.py).
//
// jax_mosaic_ffi._core: what Python needs from the C++ runtime.
//
// Handler capsules for jax.ffi registration, the state type, cache
// statistics, and the contract itself: its limits, the launch validator and
// the module parser, so that trace-time checks and the disk cache use the
// very code XLA's instantiate stage runs. Importing it touches no GPU.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "contract/contract.h"
#include "contract/launch_programs.h"
#include "contract/module_format.h"
#include "driver/zlib_inflate.h"
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

// The attributes a lowering is about to emit, as a Python dict of bool, int,
// bytes/str and lists of ints, for DecodeLaunchAttributes. Types are checked
// as strictly as XLA's own decoding does.
class PythonSource {
 public:
  explicit PythonSource(nb::dict attrs) : attrs_(attrs) {}

  Lookup Bool(const char* name, bool* out) {
    nb::handle value;
    if (!Find(name, &value)) return Lookup::kMissing;
    if (!nb::isinstance<nb::bool_>(value)) return Lookup::kWrongType;
    *out = nb::cast<bool>(value);
    return Lookup::kFound;
  }
  Lookup Int(const char* name, int64_t* out) {
    nb::handle value;
    if (!Find(name, &value)) return Lookup::kMissing;
    return ToInt(value, out) ? Lookup::kFound : Lookup::kWrongType;
  }
  Lookup Ints(const char* name, std::vector<int64_t>* out) {
    nb::handle value;
    if (!Find(name, &value)) return Lookup::kMissing;
    if (!nb::isinstance<nb::list>(value) && !nb::isinstance<nb::tuple>(value)) return Lookup::kWrongType;
    out->clear();
    for (nb::handle item : value) {
      int64_t v;
      if (!ToInt(item, &v) || out->size() > 1 << 20) return Lookup::kWrongType;
      out->push_back(v);
    }
    return Lookup::kFound;
  }
  Lookup Ints64(const char* name, std::vector<int64_t>* out) { return Ints(name, out); }
  Lookup Bytes(const char* name, std::string* out, size_t limit) {
    nb::handle value;
    if (!Find(name, &value)) return Lookup::kMissing;
    if (nb::isinstance<nb::bytes>(value)) {
      nb::bytes b = nb::borrow<nb::bytes>(value);
      if (b.size() > limit) return Lookup::kWrongType;
      out->assign(b.c_str(), b.size());
    } else if (nb::isinstance<nb::str>(value)) {
      std::string s = nb::cast<std::string>(value);
      if (s.size() > limit) return Lookup::kWrongType;
      *out = std::move(s);
    } else {
      return Lookup::kWrongType;
    }
    return Lookup::kFound;
  }

 private:
  bool Find(const char* name, nb::handle* value) {
    if (!attrs_.contains(name)) return false;
    *value = attrs_[name];
    return !value->is_none();
  }
  // A Python int (not a bool), saturated to int64: the validator bounds it.
  static bool ToInt(nb::handle value, int64_t* out) {
    if (nb::isinstance<nb::bool_>(value) || !nb::isinstance<nb::int_>(value)) return false;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
    if (overflow != 0) v = overflow > 0 ? std::numeric_limits<long long>::max() : std::numeric_limits<long long>::min();
    *out = v;
    return true;
  }

  nb::dict attrs_;
};

// The contract's checks of one launch, as XLA's instantiate stage runs them.
nb::dict ValidateLaunchForPython(nb::dict attrs, bool collective) {
  LaunchAttributes decoded;
  LaunchSpec spec;
  std::string error;
  PythonSource source(attrs);
  if (!DecodeLaunchAttributes(source, &decoded, &error) || !ValidateLaunch(decoded, collective, &spec, &error)) {
    throw nb::value_error(error.c_str());
  }
  nb::dict result;
  result["param_sizes"] = spec.param_sizes;
  result["num_buffers"] = spec.num_buffers;
  result["batch_size"] = spec.batch_size;
  result["host_launch"] = spec.host_launch;
  return result;
}

// The runtime's launch-program evaluator on given buffer shapes, as the
// first execution of a contract v2 call site runs it: (grid, scalars as the
// launch's 8-byte slots), or ValueError with the message the execution gives.
nb::tuple EvaluateLaunchForPython(nb::dict attrs, std::vector<std::vector<int64_t>> shapes) {
  LaunchAttributes decoded;
  LaunchSpec spec;
  std::string error;
  PythonSource source(attrs);
  if (!DecodeLaunchAttributes(source, &decoded, &error) || !ValidateLaunch(decoded, false, &spec, &error)) {
    throw nb::value_error(error.c_str());
  }
  if (shapes.size() != static_cast<size_t>(spec.num_buffers)) throw nb::value_error("one shape per buffer");
  BufferShapes buffer_shapes;
  buffer_shapes.count = spec.num_buffers;
  for (size_t b = 0; b < shapes.size(); ++b) {
    buffer_shapes.dims[b] = shapes[b].data();
    buffer_shapes.rank[b] = static_cast<int64_t>(shapes[b].size());
  }
  if (spec.programs != nullptr && !EvaluateLaunchPrograms(*spec.programs, buffer_shapes, &spec, &error)) {
    throw nb::value_error(error.c_str());
  }
  std::vector<int64_t> grid(spec.grid.begin(), spec.grid.end());
  return nb::make_tuple(grid, spec.scalars);
}

// The module `data` holds, parsed (images inflated) without the GIL; ValueError saying why where it is malformed.
ParsedModule ParseOrRaise(nb::bytes data) {
  ParsedModule module;
  std::string error;
  bool ok;
  {
    nb::gil_scoped_release release;
    ok = ParseModule(std::string_view(data.c_str(), data.size()), &InflateZlib, &module, &error);
  }
  if (!ok) throw nb::value_error(error.c_str());
  return module;
}

// The index of the image a GPU of compute capability `arch` would load, or -1.
int SelectImageForPython(nb::bytes data, int arch) {
  const ParsedModule module = ParseOrRaise(data);
  const Image* image = SelectImage(module, arch);
  return image == nullptr ? -1 : static_cast<int>(image - module.images.data());
}

nb::tuple ParseModuleForPython(nb::bytes data) {
  const ParsedModule module = ParseOrRaise(data);
  nb::list images;
  for (const Image& image : module.images) {
    nb::bytes data(image.data.data(), image.data.size());
    if (image.kind == ImageKind::kCuteObject) {  // and the DSL release and host argument kinds
      images.append(nb::make_tuple(static_cast<int>(image.kind), image.arch, image.suffix, data, image.dsl_version,
                                   image.host_arg_kinds));
    } else {
      images.append(nb::make_tuple(static_cast<int>(image.kind), image.arch, image.suffix, data));
    }
  }
  return nb::make_tuple(module.symbol, images, module.flags);
}

nb::dict Limits() {
  nb::dict d;
  d["max_params"] = kMaxParams;
  d["max_buffers"] = kMaxBuffers;
  d["max_devices"] = kMaxDevices;
  d["max_peers"] = kMaxPeers;
  d["max_threads_per_block"] = kMaxThreadsPerBlock;
  d["max_grid"] = nb::make_tuple(kMaxGrid[0], kMaxGrid[1], kMaxGrid[2]);
  d["max_block"] = nb::make_tuple(kMaxBlock[0], kMaxBlock[1], kMaxBlock[2]);
  d["max_cluster_blocks"] = kMaxClusterBlocks;
  d["max_smem_bytes"] = kMaxSmemBytes;
  d["max_scalar_bytes"] = kMaxScalarBytes;
  d["buffer_alignment"] = kBufferAlignment;
  d["max_batch"] = kMaxBatch;
  d["kernel_hash_bytes"] = kKernelHashBytes;
  d["max_tensor_maps"] = kMaxTensorMaps;
  d["max_batched_tensor_maps"] = kMaxBatchedTensorMaps;
  d["tensor_map_code"] = kTensorMapCode;
  d["tensor_map_fields"] = kTensorMapFields;
  d["module_format_version"] = kModuleFormatVersion;
  d["oldest_module_format_version"] = kOldestModuleFormatVersion;
  d["encoding_zlib"] = kEncodingZlib;
  d["max_inflated_module_bytes"] = kMaxInflatedModuleBytes;
  d["max_deflate_ratio"] = kMaxDeflateRatio;
  d["max_symbol_length"] = kMaxSymbolLength;
  d["max_images"] = kMaxImages;
  d["min_arch"] = kMinArch;
  d["max_arch"] = kMaxArch;
  d["module_flag_pdl_wait"] = kFlagPdlWait;
  d["module_flag_nvshmem"] = kFlagNvshmem;
  d["image_kind_cute"] = static_cast<int>(ImageKind::kCuteObject);
  d["max_cute_version_length"] = kMaxCuteVersionLength;
  d["max_host_args"] = kMaxHostArgs;
  d["host_arg_pointer"] = kHostArgPointer;
  d["host_arg_int64"] = kHostArgInt64;
  d["host_arg_fields"] = kHostArgFields;
  d["host_arg_address"] = kHostArgAddress;
  d["host_arg_dimension"] = kHostArgDimension;
  d["max_host_arg_dimension"] = kMaxHostArgDimension;
  nb::list suffixes;
  for (const char* suffix : kArchSuffixes) suffixes.append(suffix);
  d["arch_suffixes"] = nb::tuple(suffixes);
  return d;
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

void BindCrossProcess(nb::module_& m);  // cross_process_python.cc
void BindNvshmem(nb::module_& m);       // nvshmem_python.cc
void BindCute(nb::module_& m);          // cute_python.cc (after _testing: it adds hooks there)

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
  m.def("record_registration", [] {
    RecordRegistration r = GetRecordRegistration();
    return std::make_tuple(r.attempted, r.registered, r.message);
  });
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

  m.attr("LIMITS") = Limits();
  m.def("validate_launch", &ValidateLaunchForPython, nb::arg("attributes"), nb::arg("collective"),
        "Checks a launch's contract attributes as XLA's instantiate stage does; raises ValueError naming the "
        "attribute. Returns the parameter sizes the kernel must take and the buffer count.");
  m.def("parse_module", &ParseModuleForPython, nb::arg("data"),
        "Parses a serialized kernel module with the runtime's parser: (symbol, [(kind, arch, suffix, data)], flags); "
        "a CuTe DSL object's tuple adds its DSL release and host argument kinds.");
  m.def("visible_gpus", &VisibleGpus, "The visible GPUs and their launch limits; empty without a driver.");
  BindCrossProcess(m);
  BindNvshmem(m);

  nb::module_ testing = m.def_submodule("_testing", "Hooks for the test suite only; not API.");
  testing.def("rendezvous_probe", &RendezvousProbe, nb::arg("participants"), nb::arg("arriving"), nb::arg("timeout_s"),
              "Runs the collective rendezvous with threads as ranks.");
  testing.def("select_image", &SelectImageForPython, nb::arg("module"), nb::arg("arch"),
              "The index of the image the runtime loads on a GPU of compute capability `arch` (90), or -1.");
  testing.def("evaluate_launch", &EvaluateLaunchForPython, nb::arg("attributes"), nb::arg("shapes"),
              "Validates a plain launch and runs its launch programs on these buffer shapes: (grid, scalar slots).");
  BindCute(m);

  nb::dict built;
  built["jaxlib"] = JMF_JAXLIB_VERSION;
  built["ffi_api"] = std::to_string(XLA_FFI_API_MAJOR) + "." + std::to_string(XLA_FFI_API_MINOR);
  built["cuda"] = CUDA_VERSION;
  m.attr("BUILT_AGAINST") = built;
}
