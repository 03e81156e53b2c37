// The tensor-map descriptor rules of the contract (docs/contract.md): each
// map's fields in range, then the driver's rules between them (what
// cuTensorMapEncodeTiled would refuse, or silently ignore) and the bytes the
// map reaches. Values come from the artifact: all bounded before any
// arithmetic.
#include <cstdint>
#include <string>

#include "contract/checker.h"
#include "contract/contract.h"

namespace jmf {
namespace {

// The driver's element sizes of CUtensorMapDataType 0..12.
constexpr uint8_t kTensorElementBytes[kMaxTensorMapDataType + 1] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};

// Each field of one map in range. Values come from the artifact: all bounded
// before any arithmetic.
bool CheckTensorMapFields(const int64_t* f, int64_t num_buffers, const std::string& name, TensorMapSpec* t,
                          Checker& check) {
  auto bad = [&](const char* field, int64_t value, const std::string& rule) {
    return check.Fail(name + ": " + field + " = " + Num(value) + " " + rule);
  };
  if (f[0] < 0 || f[0] >= num_buffers) return bad("buffer", f[0], "names no buffer of the call");
  if (f[1] < 0 || f[1] > kMaxTensorMapDataType) return bad("data_type", f[1], "is not a CUtensorMapDataType 0..12");
  if (f[2] < 1 || f[2] > kMaxTensorRank) return bad("rank", f[2], "is out of range 1..5");
  if (f[3] < 0 || f[3] > 2) return bad("interleave", f[3], "is out of range 0..2 (none, 16B, 32B)");
  if (f[4] < 0 || f[4] > 3) return bad("swizzle", f[4], "is out of range 0..3 (none, 32B, 64B, 128B)");
  if (f[5] < 0 || f[5] > 3) return bad("l2_promotion", f[5], "is out of range 0..3 (none, 64B, 128B, 256B)");
  if (f[6] < 0 || f[6] > 1) return bad("oob_fill", f[6], "is out of range 0..1 (zeros, NaN)");
  t->buffer = static_cast<uint16_t>(f[0]);
  t->data_type = static_cast<uint8_t>(f[1]);
  t->rank = static_cast<uint8_t>(f[2]);
  t->interleave = static_cast<uint8_t>(f[3]);
  t->swizzle = static_cast<uint8_t>(f[4]);
  t->l2_promotion = static_cast<uint8_t>(f[5]);
  t->oob_fill = static_cast<uint8_t>(f[6]);
  t->element_bytes = kTensorElementBytes[t->data_type];
  t->alignment = t->interleave == 2 ? 32 : 16;
  const int64_t *dims = f + 7, *strides = f + 12, *box = f + 16, *elements = f + 21;
  for (int d = 0; d < kMaxTensorRank; ++d) {
    const bool used = d < t->rank;
    const std::string at = "[" + Num(d) + "]";
    if (used ? (dims[d] < 1 || dims[d] > (int64_t{1} << 32)) : dims[d] != 1) {
      return bad(("dims" + at).c_str(), dims[d], used ? "is out of range 1..2^32" : "must be 1 past the rank");
    }
    if (used ? (box[d] < 1 || box[d] > 256) : box[d] != 1) {
      return bad(("box" + at).c_str(), box[d], used ? "is out of range 1..256" : "must be 1 past the rank");
    }
    if (used ? (elements[d] < 1 || elements[d] > 8) : elements[d] != 1) {
      return bad(("element_strides" + at).c_str(), elements[d],
                 used ? "is out of range 1..8" : "must be 1 past the rank");
    }
    t->dims[d] = static_cast<uint64_t>(dims[d]);
    t->box[d] = static_cast<uint32_t>(box[d]);
    t->element_strides[d] = static_cast<uint32_t>(elements[d]);
    if (d == 0) continue;
    const int64_t s = strides[d - 1];
    if (used ? (s < 16 || s >= (int64_t{1} << 40) || s % t->alignment != 0) : s != 0) {
      return bad(("strides" + at).c_str(), s,
                 used ? "must be a multiple of " + Num(t->alignment) + " bytes below 2^40" : "must be 0 past the rank");
    }
    t->strides[d - 1] = static_cast<uint64_t>(s);
  }
  return true;
}

// The driver's rules between fields, and the bytes the map reaches.
bool CheckTensorMapRules(const std::string& name, TensorMapSpec* t, Checker& check) {
  const uint64_t inner_bytes = uint64_t{t->box[0]} * t->element_bytes;
  if (t->interleave == 0 && inner_bytes % 16 != 0) {
    return check.Fail(name + ": the box's inner dimension is " + Num(static_cast<int64_t>(inner_bytes)) +
                      " bytes; without interleave it must be a multiple of 16 bytes");
  }
  // The driver takes an innermost element stride only with interleave and silently ignores it otherwise: the
  // kernel would get every element where it asked for every n-th.
  if (t->interleave == 0 && t->element_strides[0] != 1) {
    return check.Fail(name + ": element_strides[0] = " + Num(t->element_strides[0]) +
                      ", but without interleave TMA has no stride along the innermost dimension (the driver ignores "
                      "it); use 1");
  }
  // Each stride must cover the whole of the dimension below it (the driver's layout rule): a smaller one makes
  // rows overlap, and the bytes reached would not be the ones the kernel describes.
  unsigned __int128 below = static_cast<unsigned __int128>(t->dims[0]) * t->element_bytes;
  for (int d = 1; d < t->rank; ++d) {
    if (t->strides[d - 1] < below) {
      return check.Fail(
          name + ": strides[" + Num(d) + "] = " + Num(static_cast<int64_t>(t->strides[d - 1])) +
          " bytes is less than the " +
          (below > (unsigned __int128){1} << 62 ? std::string("over 2^62") : Num(static_cast<int64_t>(below))) +
          " bytes of dimension " + Num(d - 1) + (d == 1 ? " (a row)" : "") +
          "; each stride must span the dimension below it");
    }
    below = static_cast<unsigned __int128>(t->strides[d - 1]) * t->dims[d];
  }
  if (t->interleave != 0 && t->rank < 3) return check.Fail(name + ": an interleaved tensor map needs rank 3 or more");
  if (t->interleave == 2 && t->swizzle != 1) return check.Fail(name + ": interleave 32B needs swizzle 32B");
  const uint64_t span = t->swizzle == 0 ? 0 : uint64_t{16} << t->swizzle;  // 32, 64, 128 bytes
  if (t->interleave == 0 && span != 0 && inner_bytes > span) {
    return check.Fail(name + ": the box's inner dimension is " + Num(static_cast<int64_t>(inner_bytes)) +
                      " bytes, more than the " + Num(static_cast<int64_t>(span)) +
                      "-byte swizzle span; use a narrower box or a wider swizzle");
  }
  if (t->oob_fill == 1 && t->data_type < 6) {  // 6..12 are the float types
    return check.Fail(name + ": NaN out-of-bounds fill needs a floating-point data type");
  }
  // dims <= 2^32 and strides < 2^40: each product fits in 2^72, so sum in 128 bits.
  unsigned __int128 extent = static_cast<unsigned __int128>(t->dims[0]) * t->element_bytes;
  for (int d = 1; d < t->rank; ++d) extent += static_cast<unsigned __int128>(t->dims[d] - 1) * t->strides[d - 1];
  if (extent > (static_cast<unsigned __int128>(1) << 62))
    return check.Fail(name + ": the tensor spans over 2^62 bytes");
  t->extent_bytes = static_cast<uint64_t>(extent);
  return true;
}

}  // namespace

bool CheckTensorMaps(const LaunchAttributes& a, LaunchSpec* spec, Checker& check) {
  for (size_t m = 0; m < spec->tensor_maps.size(); ++m) {
    TensorMapSpec& t = spec->tensor_maps[m];
    const std::string name = "tensor map " + Num(static_cast<int64_t>(m)) + " (parameter " + Num(t.param) + ")";
    if (!CheckTensorMapFields(a.tensor_maps.data() + m * kTensorMapFields, spec->num_buffers, name, &t, check) ||
        !CheckTensorMapRules(name, &t, check)) {
      return false;
    }
  }
  return true;
}

bool CheckTensorMapBatch(const LaunchSpec& spec, Checker& check) {
  // Each element's descriptor starts one stride after the last: TMA's alignment must hold for every element.
  for (size_t m = 0; m < spec.tensor_maps.size(); ++m) {
    const TensorMapSpec& t = spec.tensor_maps[m];
    if (spec.batch_strides[t.buffer] % t.alignment != 0) {
      return check.Fail("tensor map " + Num(static_cast<int64_t>(m)) + " describes buffer " + Num(t.buffer) +
                        ", whose batch elements are " + Num(static_cast<int64_t>(spec.batch_strides[t.buffer])) +
                        " bytes apart; TMA needs each element's address " + Num(t.alignment) +
                        "-byte aligned: pad the element to a multiple of " + Num(t.alignment) +
                        " bytes, or loop with lax.map instead of vmap");
    }
  }
  return true;
}

}  // namespace jmf
