// What Python tells and asks the runtime about CuTe DSL kernels: where NVIDIA's runtime library is (or why it
// could not be found), and the runtime's trust in CuTe DSL objects (docs/threat_model.md): the object check the
// parser runs (contract/cute_object.h), the prefix every object is compiled with, and the host code this
// process lowered (runtime/cute_module.h), which JAX_MOSAIC_FFI_HOST_CODE=lowered alone lets run. Test hooks
// run the runtime's own kernel cache and policy without a GPU.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <string>

#include "contract/cute_object.h"
#include "driver/cute_dsl_runtime.h"
#include "runtime/cute_module.h"
#include "runtime/kernel_cache.h"

namespace nb = nanobind;

namespace jmf {
namespace {

KernelHash HashOf(nb::bytes hash) {
  if (hash.size() != std::tuple_size<KernelHash>::value) {
    throw nb::value_error(("a kernel hash is 32 bytes, not " + std::to_string(hash.size())).c_str());
  }
  KernelHash out;
  std::memcpy(out.data(), hash.c_str(), out.size());
  return out;
}

void CheckCuteObjectForPython(nb::bytes object, const std::string& prefix) {
  std::string error;
  bool ok;
  {
    nb::gil_scoped_release release;
    ok = CheckCuteObject(std::string_view(object.c_str(), object.size()), prefix, &error);
  }
  if (!ok) throw nb::value_error(error.c_str());
}

// GetOrParseKernel, as instantiate runs it: the module checked against its hash on a miss, parsed, cached.
std::string ParseKernelForTests(nb::bytes hash, nb::bytes module) {
  auto parsed = GetOrParseKernel(HashOf(hash), std::string_view(module.c_str(), module.size()));
  if (!parsed.has_value()) throw nb::value_error(parsed.error().message().c_str());
  return (*parsed)->module.symbol;
}

// CheckHostCodePolicy, as a CuTe DSL call's instantiate runs it: "" where the object may run, else the error.
std::string HostCodePolicyForTests(nb::bytes hash) {
  ffi::Error refused = CheckHostCodePolicy(HashOf(hash));
  return refused.success() ? "" : refused.message();
}

}  // namespace

void BindCute(nb::module_& m) {
  m.def(
      "set_cute_dsl_runtime",
      [](const std::string& path, const std::string& release) {
        std::string error;
        if (!SetCuteDslRuntimeLibrary(path, release, &error)) throw nb::value_error(error.c_str());
      },
      nb::arg("path"), nb::arg("release"),
      "Where NVIDIA's CuTe DSL runtime library is (jax_mosaic_ffi/cute/package.py); opened at first use.");
  m.def("cute_dsl_runtime_library", &CuteDslRuntimeLibraryPath,
        "The CuTe DSL runtime library's path the runtime was told (empty until registration found it).");
  m.def("set_cute_dsl_runtime_problem", &SetCuteDslRuntimeProblem, nb::arg("problem"),
        "Why the CuTe DSL runtime library could not be found: the error a CuTe DSL call's instantiate then reports.");
  m.def("cute_dsl_runtime_problem", &CuteDslRuntimeProblem,
        "What set_cute_dsl_runtime_problem told the runtime (empty unless finding the library failed).");
  m.attr("CUTE_PREFIX") = kCutePrefix;
  m.def("check_cute_object", &CheckCuteObjectForPython, nb::arg("object"), nb::arg("prefix"),
        "Checks a CuTe DSL object (an ELF relocatable) as the module parser does before NVIDIA's runtime may see "
        "it; raises ValueError saying why not.");
  m.def(
      "note_lowered_host_code", [](nb::bytes hash) { NoteLoweredHostCode(HashOf(hash)); }, nb::arg("hash"),
      "Notes a CuTe DSL kernel (by hash) as lowered by this process: JAX_MOSAIC_FFI_HOST_CODE=lowered runs it.");
  m.def(
      "host_code_lowered", [](nb::bytes hash) { return HostCodeLowered(HashOf(hash)); }, nb::arg("hash"),
      "Whether this process lowered the CuTe DSL kernel of this hash.");
  nb::module_ testing = nb::borrow<nb::module_>(m.attr("_testing"));
  testing.def("parse_kernel", &ParseKernelForTests, nb::arg("hash"), nb::arg("module"),
              "The runtime's kernel cache lookup (checks the hash on a miss, parses): the module's symbol, or "
              "ValueError.");
  testing.def("host_code_policy", &HostCodePolicyForTests, nb::arg("hash"),
              "The host-code policy's verdict on a CuTe DSL kernel: '' where it may run, else the error.");
}

}  // namespace jmf
