// What the two halves of the validator share (contract.cc: the launch, its
// parameters, buffers and cliques; tensor_maps.cc: the tensor-map descriptor
// rules): the error sink every check reports through, and the tensor-map
// check that ValidateLaunch runs. Internal to csrc/contract/.
#ifndef JAX_MOSAIC_FFI_CHECKER_H_
#define JAX_MOSAIC_FFI_CHECKER_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "contract/contract.h"

namespace jmf {

inline std::string Num(int64_t v) { return std::to_string(v); }

class Checker {
 public:
  Checker(std::string* error) : error_(error) {}

  bool Fail(const std::string& message) {
    *error_ = message;
    return false;
  }

  // Three dimensions, each in [1, limit[i]].
  bool Dims(const char* name, const std::vector<int64_t>& values, const std::array<int64_t, 3>& limits,
            std::array<uint32_t, 3>* out) {
    if (values.size() != 3) {
      return Fail(std::string(name) + " must hold 3 values, it holds " + Num(static_cast<int64_t>(values.size())));
    }
    for (int i = 0; i < 3; ++i) {
      if (values[i] < 1 || values[i] > limits[i]) {
        return Fail(std::string(name) + "[" + Num(i) + "] = " + Num(values[i]) + " is out of range; it must be 1.." +
                    Num(limits[i]));
      }
      (*out)[i] = static_cast<uint32_t>(values[i]);
    }
    return true;
  }

 private:
  std::string* error_;
};

// Every tensor map of the launch (tensor_maps.cc): its fields in range, then
// the driver's rules between them and the bytes it reaches.
bool CheckTensorMaps(const LaunchAttributes& a, LaunchSpec* spec, Checker& check);
// Under vmap (batch_strides read): every element of a described buffer keeps the map's alignment.
bool CheckTensorMapBatch(const LaunchSpec& spec, Checker& check);

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_CHECKER_H_
