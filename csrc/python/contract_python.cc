// The contract for Python (part of _core, python_module.cc): its limits, the
// launch validator and the launch-program evaluator, the module parser, so
// that trace-time checks and the disk cache use the very code XLA's
// instantiate stage runs.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "contract/contract.h"
#include "contract/launch_programs.h"
#include "contract/module_format.h"
#include "driver/zlib_inflate.h"
#include "runtime/cute_module.h"
#include "runtime/kernel_cache.h"

namespace nb = nanobind;

namespace jmf {
namespace {

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

// The index in `images` ((kind, arch, suffix) each, as a module holds them) of the image a GPU of compute
// capability `arch` would load, by the runtime's own rule for that kind of module, or -1: what `pack check`
// reports for a fleet without loading anything.
int ServedImageForPython(const std::vector<std::tuple<int, int, int>>& images, int arch) {
  ParsedModule module;
  for (const auto& [kind, image_arch, suffix] : images) {
    if (kind != static_cast<int>(ImageKind::kCubin) && kind != static_cast<int>(ImageKind::kPtx) &&
        kind != static_cast<int>(ImageKind::kCuteObject)) {
      throw nb::value_error(("image kind " + std::to_string(kind) + " is none the runtime loads").c_str());
    }
    if (suffix < 0 || suffix >= static_cast<int>(std::size(kArchSuffixes)) || image_arch < 0) {
      throw nb::value_error(
          ("image arch " + std::to_string(image_arch) + " suffix " + std::to_string(suffix) + " is out of range")
              .c_str());
    }
    Image image;
    image.kind = static_cast<ImageKind>(kind);
    image.arch = static_cast<uint32_t>(image_arch);
    image.suffix = static_cast<uint32_t>(suffix);
    module.images.push_back(std::move(image));
  }
  const bool cute = !module.images.empty() && module.images[0].kind == ImageKind::kCuteObject;
  const Image* image = cute ? SelectCuteImage(module, arch) : SelectImage(module, arch);
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

}  // namespace

void BindContract(nb::module_& m, nb::module_& testing) {
  m.attr("LIMITS") = Limits();
  m.def("validate_launch", &ValidateLaunchForPython, nb::arg("attributes"), nb::arg("collective"),
        "Checks a launch's contract attributes as XLA's instantiate stage does; raises ValueError naming the "
        "attribute. Returns the parameter sizes the kernel must take and the buffer count.");
  m.def("parse_module", &ParseModuleForPython, nb::arg("data"),
        "Parses a serialized kernel module with the runtime's parser: (symbol, [(kind, arch, suffix, data)], flags); "
        "a CuTe DSL object's tuple adds its DSL release and host argument kinds.");
  m.def("served_image", &ServedImageForPython, nb::arg("images"), nb::arg("arch"),
        "The index in `images` ((kind, arch, suffix) each) of the image the runtime loads on a GPU of compute "
        "capability `arch` (100), by its own rule for the module's kind, or -1.");
  testing.def("select_image", &SelectImageForPython, nb::arg("module"), nb::arg("arch"),
              "The index of the image the runtime loads on a GPU of compute capability `arch` (90), or -1.");
  testing.def("evaluate_launch", &EvaluateLaunchForPython, nb::arg("attributes"), nb::arg("shapes"),
              "Validates a plain launch and runs its launch programs on these buffer shapes: (grid, scalar slots).");
}

}  // namespace jmf
