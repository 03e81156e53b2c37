// Fuzz driver for the custom-call contract: attribute decoding and
// ValidateLaunch, ParseCliques (csrc/contract/contract.cc, tensor_maps.cc) and ParseModule
// (csrc/contract/module_format.cc). Their inputs come from artifacts anyone can edit,
// so they must never crash, overflow or read out of bounds, and what they
// accept must satisfy every assumption the launch path makes. The sanitizers
// catch the first; the invariant checks below, which abort, the second.
//
// A test tool, not part of the extension: it links the contract sources and
// driver/zlib_inflate.cc (zlib, opened at run time, for compressed images)
// directly and needs no XLA, CUDA or Python headers. tests/test_fuzz.py and
// scripts/fuzz.sh build it as
//
//   g++ -std=c++20 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
//       -D_GLIBCXX_ASSERTIONS -Icsrc tests/fuzz/contract_fuzz.cc csrc/contract/contract.cc
//       csrc/contract/tensor_maps.cc csrc/contract/launch_programs.cc csrc/contract/module_format.cc
//       csrc/contract/cute_object.cc csrc/driver/zlib_inflate.cc -ldl
//
// (_GLIBCXX_ASSERTIONS checks every operator[] of std::string, vector and
// array against size(): ASAN alone misses an index past size() that stays
// inside the allocation, like seen[64] of a std::array<bool, 64> member.)
//
//   contract_fuzz --seconds N [--seed S] [--cases N] [--artifacts DIR]   the seeded loop
//   contract_fuzz FILE_OR_DIR...                                          replays inputs
//
// With clang, -fsanitize=fuzzer -DJMF_LIBFUZZER builds it as a libFuzzer
// target instead (scripts/fuzz.sh; docs/fuzzing.md).
//
// One input is one case. Its first byte picks the target (byte % 3:
// 0 validator, 1 module parser, 2 ParseCliques); the rest is read as two
// streams of choices (Input): forwards, to build a well-formed launch, module
// or clique list, and backwards from the end, to pick the edits that break
// it. Past the end every read is 0, and 0 always picks the plain choice
// (no edits), so short inputs make well-formed cases: a coverage-guided
// fuzzer and the built-in loop both start from the valid shapes and mutate
// away from them.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "contract/contract.h"
#include "contract/cute_object.h"
#include "contract/launch_programs.h"
#include "contract/module_format.h"
#include "driver/zlib_inflate.h"

// Provided by the sanitizer runtimes; null without them.
extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

namespace {

using jmf::Lookup;

// ------------------------------------------------------------ reporting

// Context printed with a violated invariant.
const jmf::LaunchAttributes* g_attrs = nullptr;

std::string Escape(std::string_view text, size_t limit = 96) {
  std::string out;
  for (unsigned char c : text.substr(0, limit)) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    }
  }
  if (text.size() > limit) out += "...(" + std::to_string(text.size()) + " bytes)";
  return out;
}

std::string Join(const std::vector<int64_t>& values, size_t limit = 32) {
  std::string out = "[";
  for (size_t i = 0; i < values.size() && i < limit; ++i) out += (i ? "," : "") + std::to_string(values[i]);
  if (values.size() > limit) out += ",...(" + std::to_string(values.size()) + ")";
  return out + "]";
}

std::string Describe(const jmf::LaunchAttributes& a) {
  return "  grid " + Join(a.grid) + " block " + Join(a.block) + " cluster " + Join(a.cluster) + " smem " +
         std::to_string(a.smem_bytes) + "\n  num_inputs " + std::to_string(a.num_inputs) + " num_outputs " +
         (a.num_outputs ? std::to_string(*a.num_outputs) : "absent") + " param_order " + Join(a.param_order) +
         "\n  scalar_sizes " + Join(a.scalar_sizes) + " scalar_data " + std::to_string(a.scalar_data.size()) +
         " bytes, poison_outputs " + Join(a.poison_outputs) + "\n  xla_replica_ids '" + Escape(a.xla_replica_ids) +
         "' symmetric '" + Escape(a.symmetric_memory_parameters) + "' hash " + std::to_string(a.kernel_hash.size()) +
         " bytes\n  host_args " + Join(a.host_args) + "\n";
}

[[noreturn]] void Violation(const char* what, int line, const std::string& detail) {
  std::fprintf(stderr, "contract_fuzz: invariant violated (contract_fuzz.cc:%d): %s\n", line, what);
  if (!detail.empty()) std::fprintf(stderr, "  %s\n", detail.c_str());
  if (g_attrs != nullptr) std::fprintf(stderr, "%s", Describe(*g_attrs).c_str());
  std::abort();
}

#define FUZZ_CHECK(cond, ...)                                          \
  do {                                                                 \
    if (!(cond)) Violation(#cond, __LINE__, std::string(__VA_ARGS__)); \
  } while (0)

// ---------------------------------------------------------------- input

// `pattern` repeated to `length` bytes, by doubling: a per-byte loop costs a
// traced comparison per byte under libFuzzer.
std::string Repeat(std::string pattern, size_t length) {
  if (pattern.empty()) pattern.assign(1, '\0');
  while (pattern.size() < length) pattern += pattern;
  pattern.resize(length);
  return pattern;
}

// Reads choices from the fuzz input; 0 past its end. A target builds a
// well-formed case reading forwards from the start and picks its edits
// reading backwards from the end, so that a short input has edits too.
class Input {
 public:
  Input(const uint8_t* data, size_t size, bool backwards = false) : data_(data), size_(size), backwards_(backwards) {}

  uint8_t U8() {
    if (pos_ >= size_) return 0;
    const size_t i = pos_++;
    return data_[backwards_ ? size_ - 1 - i : i];
  }
  // Little-endian, one read per statement: the operands of | are unsequenced,
  // and an input must mean the same case under every compiler.
  uint16_t U16() {
    const uint16_t low = U8();
    return static_cast<uint16_t>(low | U8() << 8);
  }
  uint32_t U32() {
    const uint32_t low = U16();
    return low | static_cast<uint32_t>(U16()) << 16;
  }
  uint64_t U64() {
    const uint64_t low = U32();
    return low | static_cast<uint64_t>(U32()) << 32;
  }
  // In [0, n).
  uint64_t Below(uint64_t n) {
    if (n <= 1) return 0;
    if (n <= 256) return U8() % n;
    if (n <= 65536) return U16() % n;
    if (n <= (uint64_t{1} << 32)) return U32() % n;
    return U64() % n;
  }
  // True one time in n (n >= 2); false once the input is used up.
  bool OneIn(uint64_t n) { return Below(n) == n - 1; }
  bool Bool() { return U8() & 1; }
  std::string Raw(size_t n) {
    std::string out(n, '\0');
    for (char& c : out) c = static_cast<char>(U8());
    return out;
  }
  // n bytes of a short random pattern: for bytes whose value matters less
  // than their length (a hash, scalar data, a cubin's body).
  std::string Pattern(size_t n) { return Repeat(Raw(1 + Below(8)), n); }
  std::string Rest() {
    std::string rest;
    while (pos_ < size_) rest += static_cast<char>(U8());
    return rest;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  bool backwards_;
  size_t pos_ = 0;
};

template <typename T, size_t N>
T Pick(Input& in, const T (&table)[N]) {
  return table[in.Below(N)];
}

int64_t Wrap(int64_t value, int64_t delta) {  // value + delta without signed overflow
  return static_cast<int64_t>(static_cast<uint64_t>(value) + static_cast<uint64_t>(delta));
}

// Integers a bound check can get wrong: zero, signs, the ends of each width,
// powers of two, and every contract limit and its neighbours.
const std::vector<int64_t>& EdgeInts() {
  static const std::vector<int64_t> values = [] {
    // clang-format off
    std::vector<int64_t> v = {0,     1,     2,     3,     4,     5,     7,     8,     9,      15,     16,   17,
                              31,    32,    33,    63,    64,    65,    255,   256,   257,    1023,   1024, 1025,
                              65535, 65536, 65537, INT32_MIN, INT32_MAX, int64_t{INT32_MIN} - 1,
                              int64_t{INT32_MAX} + 1, UINT32_MAX, int64_t{UINT32_MAX} + 1, INT64_MIN, INT64_MAX,
                              INT64_MIN + 1, INT64_MAX - 1};
    for (int k = 0; k < 63; ++k) {
      v.push_back(int64_t{1} << k);
      v.push_back(-(int64_t{1} << k));
    }
    std::vector<int64_t> limits = {jmf::kMaxParams, jmf::kMaxBuffers, jmf::kMaxDevices, jmf::kMaxPeers,
                                   jmf::kMaxThreadsPerBlock, jmf::kMaxClusterBlocks, jmf::kPortableClusterBlocks,
                                   jmf::kMaxSmemBytes, jmf::kMaxScalarBytes,
                                   static_cast<int64_t>(jmf::kMaxLabelBytes),
                                   static_cast<int64_t>(jmf::kMaxReplicaIdsBytes),
                                   static_cast<int64_t>(jmf::kKernelHashBytes), jmf::kMaxBatch,
                                   jmf::kMaxBatchStride};
    // clang-format on
    limits.insert(limits.end(), jmf::kMaxGrid.begin(), jmf::kMaxGrid.end());
    limits.insert(limits.end(), jmf::kMaxBlock.begin(), jmf::kMaxBlock.end());
    for (int64_t limit : limits) {
      for (int64_t d = -1; d <= 1; ++d) {
        v.push_back(limit + d);
        v.push_back(-(limit + d));  // a scalar code names scalar limit + d - 1
      }
    }
    return v;
  }();
  return values;
}

int64_t Int(Input& in) {
  // The ends of each width, apart, so that they are not lost among the rest.
  static constexpr int64_t kExtremes[] = {INT64_MIN, INT64_MAX, INT64_MIN + 1, INT32_MIN, INT32_MAX, UINT32_MAX, -1};
  switch (in.Below(8)) {
    case 0:
    case 1:
      return static_cast<int64_t>(in.Below(20)) - 2;
    case 2:
      return Pick(in, kExtremes);
    case 3:
    case 4:
      return EdgeInts()[in.Below(EdgeInts().size())];
    case 5:
      return static_cast<int32_t>(in.U32());
    case 6:
      return static_cast<int64_t>(in.U64());
    default:
      return static_cast<int64_t>(in.Below(601)) - 300;
  }
}

// A count in [0, max], mostly small, often exactly max.
int64_t Count(Input& in, int64_t max) {
  if (max <= 0) return 0;
  switch (in.Below(8)) {
    case 6:
      return max;
    case 7:
      return static_cast<int64_t>(in.Below(static_cast<uint64_t>(max) + 1));
    default:
      return static_cast<int64_t>(in.Below(static_cast<uint64_t>(std::min<int64_t>(max, 4)) + 1));
  }
}

// A length for a mutated array or string: small, random, or at an edge of
// `limit` (the size the decoder allows; 0 for none). Long ones are rare, so
// that they do not take most of the time.
size_t Length(Input& in, size_t limit) {
  static constexpr size_t kEdges[] = {0,   1,   2,   3,   4,   7,    8,    9,    31,    32,    33,   255,
                                      256, 257, 511, 512, 513, 1024, 1025, 4096, 65535, 65536, 65537};
  switch (in.Below(16)) {
    case 12:
    case 13:
      return Pick(in, kEdges);
    case 14:
      return in.Below(600);
    case 15:
      return limit == 0 ? in.Below(1 << 12) : limit - 1 + in.Below(3);  // limit - 1 .. limit + 1
    default:
      return in.Below(9);
  }
}

// Text for string attributes: the characters the contract's parsers treat
// specially, plus NULs, controls and bytes above ASCII. Long text repeats a
// short pattern so it costs few input bytes.
std::string Text(Input& in, size_t length) {
  static constexpr char kSpecial[] = {'0', '1', ',', ';', ' ', '9', '\0', '\n', '\x7f', '-', '+', 'x'};
  std::string pattern(1 + in.Below(16), '\0');
  const int alphabet = static_cast<int>(in.Below(4));
  for (char& c : pattern) {
    switch (alphabet) {
      case 0:  // clique lists and flags
        c = "0123456789,; "[in.Below(13)];
        break;
      case 1:
        c = Pick(in, kSpecial);
        break;
      case 2:
        c = static_cast<char>('0' + in.Below(10));
        break;
      default:
        c = static_cast<char>(in.U8());
    }
  }
  return Repeat(pattern, length);
}

// ---------------------------------------------------- attribute source

enum class Type : uint8_t { kMissing, kBool, kInt, kInts, kInts64, kBytes };

struct Attr {
  Type type = Type::kMissing;
  bool b = false;
  int64_t i = 0;
  std::vector<int64_t> ints;
  std::string bytes;
};

struct AttrSpec {
  std::string name;
  Type type;
  size_t limit;  // for bytes: the most the decoder takes
};

// The attributes DecodeLaunchAttributes reads, with their types and limits,
// learned by running it once against a source that has none. A new
// attribute is fuzzed without changing this file.
class RecordingSource {
 public:
  explicit RecordingSource(std::vector<AttrSpec>* specs) : specs_(specs) {}
  Lookup Bool(const char* name, bool*) { return Add(name, Type::kBool, 0); }
  Lookup Int(const char* name, int64_t*) { return Add(name, Type::kInt, 0); }
  Lookup Ints(const char* name, std::vector<int64_t>*) { return Add(name, Type::kInts, 0); }
  Lookup Ints64(const char* name, std::vector<int64_t>*) { return Add(name, Type::kInts64, 0); }
  Lookup Bytes(const char* name, std::string*, size_t limit) { return Add(name, Type::kBytes, limit); }

 private:
  Lookup Add(const char* name, Type type, size_t limit) {
    for (const AttrSpec& spec : *specs_) {
      if (spec.name == name) return Lookup::kMissing;
    }
    specs_->push_back(AttrSpec{name, type, limit});
    return Lookup::kMissing;
  }
  std::vector<AttrSpec>* specs_;
};

const std::vector<AttrSpec>& Schema() {
  static const std::vector<AttrSpec> specs = [] {
    std::vector<AttrSpec> out;
    RecordingSource source(&out);
    jmf::LaunchAttributes a;
    std::string error;
    jmf::DecodeLaunchAttributes(source, &a, &error);
    return out;
  }();
  return specs;
}

int AttrIndex(const char* name) {
  const std::vector<AttrSpec>& schema = Schema();
  for (size_t i = 0; i < schema.size(); ++i) {
    if (schema[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

// The driver builds coherent launches by name: a renamed attribute must be
// followed here, or the fuzzer would quietly stop covering it.
size_t RequireIndex(const char* name) {
  const int i = AttrIndex(name);
  if (i < 0) {
    std::fprintf(stderr, "contract_fuzz: DecodeLaunchAttributes no longer reads '%s'; update the driver\n", name);
    std::abort();
  }
  return static_cast<size_t>(i);
}

// One value (or none) per schema attribute.
class Attributes {
 public:
  Attributes() : values_(Schema().size()) {}

  Attr& operator[](size_t i) { return values_[i]; }
  const Attr& operator[](size_t i) const { return values_[i]; }
  size_t size() const { return values_.size(); }

  Attr& Named(const char* name) { return values_[RequireIndex(name)]; }
  void SetBool(const char* name, bool v) { Named(name) = Attr{Type::kBool, v, 0, {}, {}}; }
  void SetInt(const char* name, int64_t v) { Named(name) = Attr{Type::kInt, false, v, {}, {}}; }
  void SetInts(const char* name, std::vector<int64_t> v, Type type = Type::kInts) {
    Named(name) = Attr{type, false, 0, std::move(v), {}};
  }
  void SetBytes(const char* name, std::string v) { Named(name) = Attr{Type::kBytes, false, 0, {}, std::move(v)}; }

 private:
  std::vector<Attr> values_;
};

// The template parameter of DecodeLaunchAttributes, answering from
// Attributes the way XLA's dictionary and the Python dict do: a value of
// another type, or bytes past the limit, is kWrongType.
class FuzzSource {
 public:
  explicit FuzzSource(const Attributes& attrs) : attrs_(attrs) {}

  Lookup Bool(const char* name, bool* out) {
    const Attr* v;
    const Lookup found = Find(name, Type::kBool, &v);
    if (found == Lookup::kFound) *out = v->b;
    return found;
  }
  Lookup Int(const char* name, int64_t* out) {
    const Attr* v;
    const Lookup found = Find(name, Type::kInt, &v);
    if (found == Lookup::kFound) *out = v->i;
    return found;
  }
  Lookup Ints(const char* name, std::vector<int64_t>* out) {
    const Attr* v;
    const Lookup found = Find(name, Type::kInts, &v);
    if (found == Lookup::kFound) *out = v->ints;
    return found;
  }
  // array<i64>: an array<i32> is the wrong type, as in XLA's dictionary.
  Lookup Ints64(const char* name, std::vector<int64_t>* out) {
    const Attr* v;
    const Lookup found = Find(name, Type::kInts64, &v);
    if (found == Lookup::kFound) *out = v->ints;
    return found;
  }
  Lookup Bytes(const char* name, std::string* out, size_t limit) {
    const Attr* v;
    Lookup found = Find(name, Type::kBytes, &v);
    if (found == Lookup::kFound && v->bytes.size() > limit) found = Lookup::kWrongType;
    if (found == Lookup::kFound) *out = v->bytes;
    return found;
  }

 private:
  Lookup Find(const char* name, Type type, const Attr** value) {
    const int i = AttrIndex(name);
    if (i < 0 || attrs_[i].type == Type::kMissing) return Lookup::kMissing;
    if (attrs_[i].type != type) return Lookup::kWrongType;
    *value = &attrs_[i];
    return Lookup::kFound;
  }
  const Attributes& attrs_;
};

// ------------------------------------------------- coherent launches

void Shuffle(Input& in, std::vector<int64_t>* values) {
  for (size_t i = values->size(); i > 1; --i) std::swap((*values)[i - 1], (*values)[in.Below(i)]);
}

// "0,1;2,3"-style cliques: distinct device ids, valid by construction.
std::string CliqueText(Input& in, std::vector<std::vector<int32_t>>* cliques) {
  std::vector<int64_t> ids(jmf::kMaxDevices);
  for (int i = 0; i < jmf::kMaxDevices; ++i) ids[i] = i;
  const int64_t n = 1 + Count(in, jmf::kMaxDevices - 1);
  // A partial shuffle: the first n ids.
  for (int64_t i = 0; i < n; ++i) std::swap(ids[i], ids[i + in.Below(jmf::kMaxDevices - i)]);
  std::string text;
  cliques->assign(1, {});
  for (int64_t i = 0; i < n; ++i) {
    if (i > 0) {
      const bool next_clique = in.OneIn(4);
      text += next_clique ? ';' : ',';
      if (next_clique) cliques->emplace_back();
      if (in.OneIn(8)) text += ' ';
    }
    if (in.OneIn(16)) text += "00";  // leading zeros
    text += std::to_string(ids[i]);
    cliques->back().push_back(static_cast<int32_t>(ids[i]));
  }
  return text;
}

// Dimensions within `limits` whose product is at most `budget`, with each
// also a multiple of `factor` when given.
std::vector<int64_t> Dims(Input& in, const std::array<int64_t, 3>& limits, int64_t budget,
                          const std::vector<int64_t>* factor) {
  std::vector<int64_t> out(3, 1);
  int order[3] = {0, 1, 2};
  for (int i = 2; i > 0; --i) std::swap(order[i], order[in.Below(i + 1)]);
  for (int i : order) {
    const int64_t f = factor ? (*factor)[i] : 1;
    const int64_t most = std::min(limits[i], budget) / f;
    int64_t m = 1;
    switch (in.Below(4)) {
      case 1:
        m = 1 + static_cast<int64_t>(in.Below(static_cast<uint64_t>(std::min<int64_t>(most, 64))));
        break;
      case 2:
        m = most;
        break;
      case 3:
        m = 1 + static_cast<int64_t>(in.Below(static_cast<uint64_t>(most)));
        break;
    }
    out[i] = m * f;
    budget /= out[i];
  }
  return out;
}

// One tensor map the validator must accept (kTensorMapFields values): the
// driver's rules hold by construction (inner box a multiple of 16 bytes and
// within the swizzle span, NaN fill only for floats, strides that span the
// dimension below, no innermost element stride), and its extent stays
// well inside 2^62 bytes. Mutations reach the edges.
std::vector<int64_t> TensorMapRecord(Input& in, int64_t num_buffers) {
  static constexpr int64_t kElementBytes[jmf::kMaxTensorMapDataType + 1] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
  std::vector<int64_t> f(jmf::kTensorMapFields, 0);
  const int64_t type = static_cast<int64_t>(in.Below(jmf::kMaxTensorMapDataType + 1));
  const int64_t element = kElementBytes[type];
  const int64_t rank = 1 + static_cast<int64_t>(in.Below(jmf::kMaxTensorRank));
  const int64_t swizzle = static_cast<int64_t>(in.Below(4));
  const int64_t span = swizzle == 0 ? 256 * element : int64_t{16} << swizzle;  // inner box bytes allowed
  const int64_t unit = 16 / element;                                           // elements in 16 bytes
  const int64_t most = std::max<int64_t>(1, std::min<int64_t>(256, span / element) / unit);
  f[0] = static_cast<int64_t>(in.Below(num_buffers));
  f[1] = type;
  f[2] = rank;
  f[4] = swizzle;
  f[5] = static_cast<int64_t>(in.Below(4));
  f[6] = type >= 6 ? static_cast<int64_t>(in.Below(2)) : 0;
  // Each stride spans the dimensions below it plus some padding, and the
  // dimension above is sized so that its span stays within 2^39 bytes: every
  // stride then stays below 2^40 as the driver requires.
  int64_t below = 0;  // bytes spanned by the dimensions below d
  for (int d = 0; d < jmf::kMaxTensorRank; ++d) {
    const bool used = d < rank;
    int64_t stride = 0;
    if (d > 0 && used) stride = (below + 15) / 16 * 16 + 16 * static_cast<int64_t>(in.Below(1024));
    const int64_t room = stride == 0 ? int64_t{1} << 20 : std::clamp<int64_t>((int64_t{1} << 39) / stride, 1, 1 << 20);
    f[7 + d] = used ? 1 + static_cast<int64_t>(in.Below(room)) : 1;
    if (d > 0) f[11 + d] = stride;
    if (used) below = d == 0 ? f[7] * element : stride * f[7 + d];
    f[16 + d] = d == 0 ? unit * (1 + static_cast<int64_t>(in.Below(most))) : used ? 1 + in.Below(256) : 1;
    f[21 + d] = used && d > 0 ? 1 + static_cast<int64_t>(in.Below(8)) : 1;  // no inner stride without interleave
  }
  return f;
}

// A well-formed launch program's code (launch_programs.h): an expression
// tree at most 3 deep, so its stack stays within 4 values.
void ProgramCode(Input& in, int64_t num_buffers, int depth, std::vector<int64_t>* code) {
  const int64_t choice = static_cast<int64_t>(in.Below(depth >= 3 ? 2 : 8));
  if (choice == 0 || (choice == 1 && num_buffers == 0)) {
    static constexpr int64_t kConstants[] = {
        0, 1, -1, 256, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
    code->push_back(jmf::kOpConst);
    code->push_back(in.Bool() ? kConstants[in.Below(6)] : static_cast<int64_t>(in.Below(1 << 20)));
  } else if (choice == 1) {
    code->push_back(jmf::kOpDim);
    code->push_back(static_cast<int64_t>(in.Below(num_buffers)));
    code->push_back(static_cast<int64_t>(in.Below(4)));
  } else {
    ProgramCode(in, num_buffers, depth + 1, code);
    ProgramCode(in, num_buffers, depth + 1, code);
    code->push_back(choice);  // kOpAdd .. kOpMin
  }
}

// Launch programs for some grid axes and scalars: [target, index, length, code...] each.
std::vector<int64_t> LaunchProgramsAttr(Input& in, int64_t num_buffers, int64_t num_scalars) {
  std::vector<int64_t> out;
  auto add = [&](int64_t target, int64_t index) {
    std::vector<int64_t> code;
    ProgramCode(in, num_buffers, 0, &code);
    out.insert(out.end(), {target, index, static_cast<int64_t>(code.size())});
    out.insert(out.end(), code.begin(), code.end());
  };
  for (int64_t axis = 0; axis < 3; ++axis) {
    if (in.Bool()) add(jmf::kProgramGrid, axis);
  }
  for (int64_t k = 0; k < num_scalars; ++k) {
    if (in.OneIn(4)) add(in.Bool() ? jmf::kProgramSignedScalar : jmf::kProgramUnsignedScalar, k);
  }
  return out;
}

// A launch ValidateLaunch must accept for `collective`.
void BuildLaunch(Input& in, bool collective, Attributes* attrs) {
  const int64_t kNoBudget = std::numeric_limits<int64_t>::max();
  attrs->SetBytes("kernel_hash", in.Pattern(jmf::kKernelHashBytes));
  for (const char* label : {"kernel_name", "call_site"}) {
    const size_t limit = Schema()[RequireIndex(label)].limit;
    if (in.Bool()) attrs->SetBytes(label, Text(in, std::min(Length(in, limit), limit)));
  }
  if (in.Bool()) attrs->SetBool("use_custom_barrier", false);
  if (collective || in.Bool()) attrs->SetBool("uses_xla_collective_metadata", collective);
  std::vector<int64_t> cluster = Dims(in, {jmf::kMaxClusterBlocks, jmf::kMaxClusterBlocks, jmf::kMaxClusterBlocks},
                                      jmf::kMaxClusterBlocks, nullptr);
  attrs->SetInts("grid", Dims(in, jmf::kMaxGrid, kNoBudget, &cluster));
  attrs->SetInts("block", Dims(in, jmf::kMaxBlock, jmf::kMaxThreadsPerBlock, nullptr));
  attrs->SetInts("cluster", cluster);
  if (in.Bool()) attrs->SetInt("smem_bytes", in.Bool() ? jmf::kMaxSmemBytes : in.Below(jmf::kMaxSmemBytes + 1));
  if (in.Bool()) attrs->SetBool("uses_pdl", in.Bool());

  const int64_t num_inputs = Count(in, jmf::kMaxBuffers);
  const int64_t num_outputs = Count(in, jmf::kMaxBuffers - num_inputs);
  const int64_t num_buffers = num_inputs + num_outputs;
  attrs->SetInt("num_inputs", num_inputs);
  attrs->SetInt("num_outputs", num_outputs);

  // Parameters: each scalar at most once, buffers any number of times.
  const int64_t max_params = jmf::kMaxParams - (collective ? 1 : 0);
  const int64_t num_scalars = Count(in, jmf::kMaxParams);
  std::vector<int64_t> params;
  for (int64_t k = 0; k < num_scalars && static_cast<int64_t>(params.size()) < max_params; ++k) {
    if (!in.OneIn(8)) params.push_back(-(k + 1));
  }
  if (num_buffers > 0) {
    const int64_t buffer_params = Count(in, max_params - static_cast<int64_t>(params.size()));
    for (int64_t j = 0; j < buffer_params; ++j) {
      params.push_back(j < num_buffers && !in.OneIn(8) ? j : static_cast<int64_t>(in.Below(num_buffers)));
    }
  }
  // TMA descriptors; under vmap, one per element and map (the batch is bounded below).
  const bool batched = !collective && in.OneIn(4);
  int64_t maps = 0;
  std::vector<int64_t> described;  // the buffers the maps describe
  if (num_buffers > 0 && in.OneIn(4)) {
    maps = std::min<int64_t>(1 + Count(in, jmf::kMaxTensorMaps - 1), max_params - static_cast<int64_t>(params.size()));
    std::vector<int64_t> records;
    for (int64_t m = 0; m < maps; ++m) {
      params.push_back(jmf::kTensorMapCode + m);
      std::vector<int64_t> record = TensorMapRecord(in, num_buffers);
      described.push_back(record[0]);
      records.insert(records.end(), record.begin(), record.end());
    }
    if (maps > 0) attrs->SetInts("tensor_maps", records, Type::kInts64);
  }
  Shuffle(in, &params);
  attrs->SetInts("param_order", params);
  if (num_scalars > 0 || in.Bool()) {
    std::vector<int64_t> sizes(num_scalars);
    for (int64_t& size : sizes) size = 1 + in.Below(jmf::kMaxScalarBytes);
    attrs->SetInts("scalar_sizes", sizes);
    attrs->SetBytes("scalar_data", in.Pattern(8 * num_scalars));
  }
  // Contract v2: a grid and scalars computed from the buffers' shapes, on plain unbatched launches only.
  if (!collective && !batched && in.OneIn(4)) {
    attrs->SetInts("launch_programs", LaunchProgramsAttr(in, num_buffers, num_scalars), Type::kInts64);
  }
  if (num_outputs > 0 && in.OneIn(4)) {
    // Each output at most once, in any order: what the contract accepts.
    std::vector<int64_t> poison;
    for (int64_t output = 0; output < num_outputs; ++output) {
      if (in.Bool()) poison.insert(poison.begin() + in.Below(static_cast<int64_t>(poison.size()) + 1), output);
    }
    attrs->SetInts("poison_outputs", poison);
  }
  if (num_outputs > 0 && in.OneIn(4)) {  // scratch outputs zeroed before each launch
    std::vector<int64_t> zero;
    for (int64_t output = 0; output < num_outputs; ++output) {
      if (in.Bool()) zero.insert(zero.begin() + in.Below(static_cast<int64_t>(zero.size()) + 1), output);
    }
    attrs->SetInts("zero_outputs", zero);
  }
  // vmap: more than one element on the plain target only, a stride per
  // buffer, at least 1 byte for an output (each element writes its own).
  if (batched) {
    const int64_t most = maps > 0 ? std::max<int64_t>(2, jmf::kMaxBatchedTensorMaps / maps) : jmf::kMaxBatch;
    attrs->SetInt("batch_size", 2 + Count(in, most - 2));
    std::vector<int64_t> strides(num_buffers);
    for (int64_t b = 0; b < num_buffers; ++b) {
      const int64_t least = b < num_inputs ? 0 : 1;
      switch (in.Below(4)) {
        case 0:
          strides[b] = least;
          break;
        case 1:
          strides[b] = jmf::kMaxBatchStride;
          break;
        case 2:
          strides[b] = least + static_cast<int64_t>(in.Below(jmf::kMaxBatchStride));
          break;
        default:
          strides[b] = 256 * (1 + static_cast<int64_t>(in.Below(4096)));
      }
    }
    // A described buffer's elements keep TMA's alignment (32 bytes covers 32-byte interleave too).
    for (int64_t b : described) strides[b] = strides[b] == 0 ? 0 : std::max<int64_t>(32, strides[b] / 32 * 32);
    attrs->SetInts("batch_strides", strides, Type::kInts64);
  } else if (in.OneIn(4)) {
    attrs->SetInt("batch_size", 1);
  }
  if (collective || in.OneIn(4)) {
    std::vector<std::vector<int32_t>> cliques;
    attrs->SetBytes("xla_replica_ids", CliqueText(in, &cliques));
  }
  if (collective || in.OneIn(4)) {
    std::string flags;
    const int separator = static_cast<int>(in.Below(3));
    for (int64_t b = 0; b < num_buffers; ++b) {
      if (b > 0) flags += separator == 0 ? "," : separator == 1 ? ", " : "";
      flags += in.Bool() ? '1' : '0';
    }
    switch (in.Below(4)) {
      case 0:
        attrs->SetBytes("symmetric_memory_parameters", flags);
        break;
      case 1:
        attrs->SetBytes("multimem_parameters", flags);  // the older name
        break;
      case 2:
        attrs->SetBytes("symmetric_memory_parameters", "");  // none symmetric
        break;
    }
  }
  if (in.Bool()) attrs->SetBool("skip_device_barrier", in.Bool());
  if (!collective && !batched && in.OneIn(4)) {  // an NVSHMEM call: one flag per buffer (Mutate breaks it)
    std::string flags;
    for (int64_t b = 0; b < num_buffers; ++b) flags += std::string(b > 0 ? "," : "") + (in.Bool() ? '1' : '0');
    attrs->SetBytes("nvshmem_symmetric", flags);
  }
  // The CuTe target: the module's host function launches, so the call has a [1, 1, 1] launch, no parameters,
  // scalars, tensor maps, programs or shared memory, and per host-function argument (after the stream) a
  // buffer's address or one of its dimensions. Decided last, so that the choices above keep their meaning.
  if (!collective && num_buffers > 0 && in.OneIn(4)) {
    for (const char* name : {"grid", "block", "cluster"}) attrs->SetInts(name, {1, 1, 1});
    for (const char* name : {"smem_bytes", "uses_pdl", "scalar_sizes", "scalar_data", "tensor_maps", "launch_programs",
                             "nvshmem_symmetric"}) {
      attrs->Named(name) = Attr();
    }
    attrs->SetInts("param_order", {});
    std::vector<int64_t> host_args;
    const int64_t args = 1 + Count(in, jmf::kMaxParams - 1);
    for (int64_t k = 0; k < args; ++k) {
      const bool address = in.Bool();
      host_args.push_back(address ? jmf::kHostArgAddress : jmf::kHostArgDimension);
      host_args.push_back(k < num_buffers && !in.OneIn(4) ? k : static_cast<int64_t>(in.Below(num_buffers)));
      host_args.push_back(address ? 0 : in.OneIn(8) ? jmf::kMaxHostArgDimension : in.Below(5));
    }
    attrs->SetInts("host_args", host_args);
  }
}

// Replaces one attribute with a value of another type, or edits its value.
void Mutate(Input& in, Attributes* attrs) {
  // Mostly an attribute the launch has: a third of them are optional and
  // absent, and adding one is less often the edge that matters.
  std::vector<size_t> present;
  for (size_t i = 0; i < attrs->size(); ++i) {
    if ((*attrs)[i].type != Type::kMissing) present.push_back(i);
  }
  const size_t index = present.empty() || in.OneIn(4) ? in.Below(attrs->size()) : present[in.Below(present.size())];
  const AttrSpec& spec = Schema()[index];
  Attr& v = (*attrs)[index];
  const int op = static_cast<int>(in.Below(8));
  if (op == 0) {
    v = Attr();
    return;
  }
  Type type = spec.type;
  if (op == 1) type = static_cast<Type>(1 + in.Below(5));  // any type, usually a wrong one
  if (v.type != type) {
    v = Attr();
    v.type = type;
  }
  switch (type) {
    case Type::kMissing:
      break;
    case Type::kBool:
      v.b = in.Bool() ? !v.b : in.Bool();
      break;
    case Type::kInt:
      v.i = in.Bool() ? Int(in) : Wrap(v.i, static_cast<int8_t>(in.U8()) % 4);
      break;
    case Type::kInts:
    case Type::kInts64: {
      std::vector<int64_t>& ints = v.ints;
      switch (in.Below(7)) {
        case 0:
          if (!ints.empty()) ints[in.Below(ints.size())] = Int(in);
          break;
        case 1: {
          const size_t at = in.Below(ints.size() + 1);
          ints.insert(ints.begin() + static_cast<ptrdiff_t>(at), Int(in));
          break;
        }
        case 2:
          if (!ints.empty()) ints.erase(ints.begin() + static_cast<ptrdiff_t>(in.Below(ints.size())));
          break;
        case 3:
          if (!ints.empty()) {
            int64_t& x = ints[in.Below(ints.size())];
            x = Wrap(x, in.Bool() ? 1 : -1);
          }
          break;
        case 4: {
          // A new length; long arrays repeat a value, or count up or down.
          const size_t length = Length(in, 0);
          const int fill = static_cast<int>(in.Below(3));
          const int64_t value = Int(in);
          const size_t old = ints.size();
          ints.resize(length, value);
          if (fill != 0 && length > old) {
            std::iota(ints.begin() + static_cast<ptrdiff_t>(old), ints.end(), static_cast<int64_t>(old));
          }
          if (fill == 2) {
            for (size_t i = old; i < length; ++i) ints[i] = -ints[i] - 1;  // scalar codes
          }
          break;
        }
        case 5:
          if (ints.size() > 1) {
            const size_t i = in.Below(ints.size());
            std::swap(ints[i], ints[in.Below(ints.size())]);
          }
          break;
        default: {
          ints.assign(in.Below(6), 0);
          for (int64_t& x : ints) x = Int(in);
        }
      }
      break;
    }
    case Type::kBytes: {
      std::string& s = v.bytes;
      static constexpr char kSpecial[] = {'\0', ',', ';', ' ', '0', '1', '9', '\xff', '-', '\n'};
      switch (in.Below(6)) {
        case 0:
          s.resize(in.Below(s.size() + 1));
          break;
        case 1:
          s += Text(in, Length(in, 0));
          break;
        case 2:
          if (!s.empty()) s[in.Below(s.size())] = Pick(in, kSpecial);
          break;
        case 3: {
          const size_t at = in.Below(s.size() + 1);
          s.insert(s.begin() + static_cast<ptrdiff_t>(at), Pick(in, kSpecial));
          break;
        }
        case 4:
          if (!s.empty()) {
            const size_t at = in.Below(s.size());
            s.erase(at, 1 + in.Below(4));
          }
          break;
        default:
          s = Text(in, Length(in, spec.limit));  // at the decoder's limit: allowed, or one too many
      }
      break;
    }
  }
}

// ----------------------------------------------------------- invariants

// Messages carry user strings through Label(): bounded and printable.
void CheckMessage(const std::string& text, size_t limit) {
  FUZZ_CHECK(!text.empty());
  FUZZ_CHECK(text.size() <= limit, "a message of " + std::to_string(text.size()) + " bytes: " + Escape(text));
  for (unsigned char c : text) FUZZ_CHECK(c >= 0x20 && c != 0x7f, "a control byte in: " + Escape(text));
}

// Every clique non-empty and at most kMaxPeers, every id below kMaxDevices
// and named once: the runtime indexes per-device slots by these ids.
void CheckCliques(const std::vector<std::vector<int32_t>>& cliques) {
  FUZZ_CHECK(!cliques.empty());
  std::array<bool, jmf::kMaxDevices> seen{};
  for (const std::vector<int32_t>& clique : cliques) {
    FUZZ_CHECK(!clique.empty());
    FUZZ_CHECK(clique.size() <= static_cast<size_t>(jmf::kMaxPeers));
    for (int32_t id : clique) {
      FUZZ_CHECK(id >= 0 && id < jmf::kMaxDevices, "device id " + std::to_string(id));
      FUZZ_CHECK(!seen[id], "device id " + std::to_string(id) + " twice");
      seen[id] = true;
    }
  }
}

void CheckMessage(const std::string& text, size_t limit);
// A program's text: at most 256 values of code, each a few dozen characters.
constexpr size_t kMaxProgramText = 256 * 48;

// What csrc/runtime/call_site.cc relies on once ValidateLaunch has said yes, and that the
// spec says what the attributes said.
void CheckSpec(const jmf::LaunchAttributes& a, bool collective, const jmf::LaunchSpec& s) {
  FUZZ_CHECK(a.kernel_hash.size() == jmf::kKernelHashBytes);  // memcpy'd into a fixed-size key
  FUZZ_CHECK(!a.use_custom_barrier);
  FUZZ_CHECK(a.uses_xla_collective_metadata == collective);

  FUZZ_CHECK(a.grid.size() == 3 && a.block.size() == 3 && a.cluster.size() == 3);
  for (int i = 0; i < 3; ++i) {
    FUZZ_CHECK(s.grid[i] >= 1 && s.grid[i] <= jmf::kMaxGrid[i] && s.grid[i] == a.grid[i]);
    FUZZ_CHECK(s.block[i] >= 1 && s.block[i] <= jmf::kMaxBlock[i] && s.block[i] == a.block[i]);
    FUZZ_CHECK(s.cluster[i] >= 1 && s.cluster[i] <= jmf::kMaxClusterBlocks && s.cluster[i] == a.cluster[i]);
    FUZZ_CHECK(s.grid[i] % s.cluster[i] == 0);
  }
  const uint64_t threads = uint64_t{s.block[0]} * s.block[1] * s.block[2];
  FUZZ_CHECK(threads <= static_cast<uint64_t>(jmf::kMaxThreadsPerBlock));
  const uint64_t cluster_blocks = uint64_t{s.cluster[0]} * s.cluster[1] * s.cluster[2];
  FUZZ_CHECK(cluster_blocks <= static_cast<uint64_t>(jmf::kMaxClusterBlocks));
  FUZZ_CHECK(s.has_cluster == (cluster_blocks > 1));
  FUZZ_CHECK(s.non_portable_cluster == (cluster_blocks > static_cast<uint64_t>(jmf::kPortableClusterBlocks)));
  FUZZ_CHECK(s.smem_bytes <= jmf::kMaxSmemBytes && s.smem_bytes == a.smem_bytes);
  FUZZ_CHECK(s.uses_pdl == a.uses_pdl);

  // Buffers::ptrs has kMaxBuffers + 1 slots (the last for the metadata).
  FUZZ_CHECK(s.num_inputs >= 0 && s.num_inputs <= s.num_buffers && s.num_buffers <= jmf::kMaxBuffers);
  FUZZ_CHECK(s.num_inputs == a.num_inputs);
  if (a.num_outputs.has_value()) FUZZ_CHECK(s.num_buffers == a.num_inputs + *a.num_outputs);

  FUZZ_CHECK(s.scalar_sizes.size() == a.scalar_sizes.size() && s.scalars.size() == s.scalar_sizes.size());
  FUZZ_CHECK(a.scalar_data.size() == 8 * s.scalars.size());
  for (size_t k = 0; k < s.scalars.size(); ++k) {
    FUZZ_CHECK(s.scalar_sizes[k] >= 1 && s.scalar_sizes[k] <= jmf::kMaxScalarBytes);
    uint64_t value;
    std::memcpy(&value, a.scalar_data.data() + 8 * k, 8);  // little-endian host
    FUZZ_CHECK(s.scalars[k] == value, "scalar " + std::to_string(k));
  }

  // Launch arguments live in arrays of kMaxParams.
  FUZZ_CHECK(s.params.size() <= static_cast<size_t>(jmf::kMaxParams));
  FUZZ_CHECK(s.params.size() == a.param_order.size());
  FUZZ_CHECK(s.param_sizes.size() == s.params.size() + (collective ? 1 : 0));
  FUZZ_CHECK(s.param_sizes.size() <= static_cast<size_t>(jmf::kMaxParams));
  std::vector<bool> scalar_used(s.scalars.size());
  for (size_t i = 0; i < s.params.size(); ++i) {
    const jmf::Param& p = s.params[i];
    auto where = [i] { return "param " + std::to_string(i); };  // built only for a message
    if (p.kind == jmf::Param::kBuffer) {
      FUZZ_CHECK(p.index < s.num_buffers, where());
      FUZZ_CHECK(a.param_order[i] == p.index, where());
      FUZZ_CHECK(s.param_sizes[i] == 8, where());
    } else if (p.kind == jmf::Param::kTensorMap) {
      // Execute and record index the device's encoded maps by p.index.
      FUZZ_CHECK(p.index < s.tensor_maps.size(), where());
      FUZZ_CHECK(s.tensor_maps[p.index].param == i, where());
      FUZZ_CHECK(a.param_order[i] == jmf::kTensorMapCode + p.index, where());
      FUZZ_CHECK(s.param_sizes[i] == static_cast<size_t>(jmf::kTensorMapBytes), where());
    } else {
      FUZZ_CHECK(p.kind == jmf::Param::kScalar, where());
      FUZZ_CHECK(p.index < s.scalars.size(), where());
      FUZZ_CHECK(!scalar_used[p.index], where() + " names a scalar twice");
      scalar_used[p.index] = true;
      FUZZ_CHECK(a.param_order[i] == -(int64_t{p.index} + 1), where());
      FUZZ_CHECK(s.param_sizes[i] == s.scalar_sizes[p.index], where());
    }
  }
  if (collective) FUZZ_CHECK(s.param_sizes.back() == 8);  // the metadata pointer

  // Poisoning writes output buffers only.
  FUZZ_CHECK(s.poison_buffers.size() == a.poison_outputs.size());
  for (size_t i = 0; i < s.poison_buffers.size(); ++i) {
    FUZZ_CHECK(s.poison_buffers[i] >= s.num_inputs && s.poison_buffers[i] < s.num_buffers);
    FUZZ_CHECK(s.poison_buffers[i] == a.num_inputs + a.poison_outputs[i]);
  }

  // Zeroing writes output buffers only.
  FUZZ_CHECK(s.zero_buffers.size() == a.zero_outputs.size());
  for (size_t i = 0; i < s.zero_buffers.size(); ++i) {
    FUZZ_CHECK(s.zero_buffers[i] >= s.num_inputs && s.zero_buffers[i] < s.num_buffers);
    FUZZ_CHECK(s.zero_buffers[i] == a.num_inputs + a.zero_outputs[i]);
  }

  // Tensor maps: cuTensorMapEncodeTiled gets arrays of `rank` entries and
  // buffers.ptrs[buffer]; every driver rule the contract states holds.
  FUZZ_CHECK(s.tensor_maps.size() * jmf::kTensorMapFields == a.tensor_maps.size());
  FUZZ_CHECK(s.tensor_maps.size() <= static_cast<size_t>(jmf::kMaxTensorMaps));
  // Under vmap, a descriptor per element and map (call_site.h: TensorMapIndex).
  FUZZ_CHECK(s.tensor_maps.size() * s.batch_size <= static_cast<size_t>(jmf::kMaxBatchedTensorMaps) ||
             s.tensor_maps.empty());
  for (const jmf::TensorMapSpec& t : s.tensor_maps) {
    FUZZ_CHECK(t.buffer < s.num_buffers);
    FUZZ_CHECK(t.data_type <= jmf::kMaxTensorMapDataType && t.rank >= 1 && t.rank <= jmf::kMaxTensorRank);
    FUZZ_CHECK(t.interleave <= 2 && t.swizzle <= 3 && t.l2_promotion <= 3 && t.oob_fill <= 1);
    FUZZ_CHECK(t.param < s.params.size() && s.params[t.param].kind == jmf::Param::kTensorMap);
    FUZZ_CHECK(t.alignment == 16 || t.alignment == 32);
    FUZZ_CHECK(t.extent_bytes >= t.element_bytes && t.extent_bytes <= (uint64_t{1} << 62));
    for (int d = 0; d < t.rank; ++d) {
      FUZZ_CHECK(t.dims[d] >= 1 && t.dims[d] <= (uint64_t{1} << 32));
      FUZZ_CHECK(t.box[d] >= 1 && t.box[d] <= 256 && t.element_strides[d] >= 1 && t.element_strides[d] <= 8);
      if (d > 0) FUZZ_CHECK(t.strides[d - 1] % t.alignment == 0 && t.strides[d - 1] < (uint64_t{1} << 40));
    }
    if (t.interleave == 0) FUZZ_CHECK(t.box[0] * t.element_bytes % 16 == 0);
    if (t.interleave == 0) FUZZ_CHECK(t.element_strides[0] == 1);  // the driver would ignore any other
    // No stride within the dimension below it (no overlapping rows or planes).
    unsigned __int128 below = static_cast<unsigned __int128>(t.dims[0]) * t.element_bytes;
    for (int d = 1; d < t.rank; ++d) {
      FUZZ_CHECK(t.strides[d - 1] >= below);
      below = static_cast<unsigned __int128>(t.strides[d - 1]) * t.dims[d];
    }
    if (t.interleave == 0 && t.swizzle != 0) FUZZ_CHECK(t.box[0] * t.element_bytes <= (16u << t.swizzle));
  }

  // vmap moves every buffer pointer by its stride, batch_size - 1 times.
  FUZZ_CHECK(s.batch_size >= 1 && s.batch_size <= jmf::kMaxBatch && s.batch_size == a.batch_size);
  if (s.batch_size == 1) {
    FUZZ_CHECK(s.batch_strides.empty() && a.batch_strides.empty());
  } else {
    FUZZ_CHECK(!collective);
    FUZZ_CHECK(s.batch_strides.size() == static_cast<size_t>(s.num_buffers));
    for (size_t b = 0; b < s.batch_strides.size(); ++b) {
      FUZZ_CHECK(s.batch_strides[b] == static_cast<uint64_t>(a.batch_strides[b]));
      FUZZ_CHECK(s.batch_strides[b] <= static_cast<uint64_t>(jmf::kMaxBatchStride));
      // The last element's offset, (batch_size - 1) * stride, cannot wrap.
      FUZZ_CHECK(s.batch_strides[b] <= (uint64_t{1} << 63) / s.batch_size);
      if (static_cast<int>(b) >= s.num_inputs) FUZZ_CHECK(s.batch_strides[b] >= 1, "output elements overlap");
    }
    for (const jmf::TensorMapSpec& t : s.tensor_maps) FUZZ_CHECK(s.batch_strides[t.buffer] % t.alignment == 0);
  }

  // Launch programs: what EvaluateLaunchPrograms indexes without checking again.
  FUZZ_CHECK((s.programs != nullptr) == !a.launch_programs.empty());
  if (s.programs != nullptr) {
    FUZZ_CHECK(!collective && s.batch_size == 1);
    for (const jmf::LaunchProgram& p : s.programs->programs) {
      FUZZ_CHECK(p.target >= jmf::kProgramGrid && p.target <= jmf::kProgramUnsignedScalar);
      FUZZ_CHECK(p.index >= 0 &&
                 (p.target == jmf::kProgramGrid ? p.index < 3 : static_cast<size_t>(p.index) < s.scalar_sizes.size()));
      FUZZ_CHECK(!p.code.empty() && p.code.size() <= static_cast<size_t>(jmf::kMaxLaunchProgramCode));
      CheckMessage(jmf::LaunchProgramText(p.code, s.num_inputs), kMaxProgramText);
    }
    for (const jmf::DimRef& ref : s.programs->dims) {
      FUZZ_CHECK(ref.buffer >= 0 && ref.buffer < s.num_buffers && ref.axis >= 0 && ref.axis < jmf::kMaxBufferRank);
    }
  }

  // A host launch (the CuTe target): LaunchHost fills kMaxParams slots, reading buffers.ptrs[buffer] and, for
  // a dimension, buffers.dims[buffer][dimension] once it has checked the buffer's rank.
  FUZZ_CHECK(s.host_launch == !a.host_args.empty());
  FUZZ_CHECK(s.host_args.size() * jmf::kHostArgFields == (s.host_launch ? a.host_args.size() : 0));
  if (s.host_launch) {
    FUZZ_CHECK(!collective && !s.nvshmem && s.params.empty() && s.tensor_maps.empty() && s.programs == nullptr);
    FUZZ_CHECK(s.grid == (std::array<uint32_t, 3>{1, 1, 1}) && s.block == s.grid && s.cluster == s.grid);
    FUZZ_CHECK(s.smem_bytes == 0 && !s.uses_pdl);
    FUZZ_CHECK(s.host_args.size() <= static_cast<size_t>(jmf::kMaxParams));
    for (size_t i = 0; i < s.host_args.size(); ++i) {
      const jmf::HostArg& h = s.host_args[i];
      auto where = [i] { return "host_args entry " + std::to_string(i); };  // built only for a message
      FUZZ_CHECK(h.kind == jmf::kHostArgAddress || h.kind == jmf::kHostArgDimension, where());
      FUZZ_CHECK(h.buffer < s.num_buffers && h.dimension <= jmf::kMaxHostArgDimension, where());
      FUZZ_CHECK(h.kind == jmf::kHostArgDimension || h.dimension == 0, where());
      const int64_t* written = a.host_args.data() + jmf::kHostArgFields * i;
      FUZZ_CHECK(written[0] == h.kind && written[1] == h.buffer && written[2] == h.dimension, where());
    }
  }

  FUZZ_CHECK(s.collective == collective);
  // An NVSHMEM call: plain target, one launch, one flag per buffer as written.
  FUZZ_CHECK(s.nvshmem == !a.nvshmem_symmetric.empty());
  if (s.nvshmem) {
    FUZZ_CHECK(!collective && s.batch_size == 1 && s.nvshmem_symmetric.size() == static_cast<size_t>(s.num_buffers));
    size_t nvshmem_flag = 0;
    for (char c : a.nvshmem_symmetric) {
      if (c == '0' || c == '1') {
        FUZZ_CHECK(nvshmem_flag < s.nvshmem_symmetric.size() && s.nvshmem_symmetric[nvshmem_flag] == (c == '1'));
        ++nvshmem_flag;
      }
    }
    FUZZ_CHECK(nvshmem_flag == s.nvshmem_symmetric.size());
  } else {
    FUZZ_CHECK(s.nvshmem_symmetric.empty());
  }
  if (!collective) {
    FUZZ_CHECK(s.cliques.empty() && s.symmetric.empty() && !s.skip_device_barrier);
    return;
  }
  CheckCliques(s.cliques);
  FUZZ_CHECK(s.symmetric.size() == static_cast<size_t>(s.num_buffers));
  size_t flag = 0;
  for (char c : a.symmetric_memory_parameters) {
    if (c == '0' || c == '1') {
      FUZZ_CHECK(flag < s.symmetric.size() && s.symmetric[flag] == (c == '1'));
      ++flag;
    }
  }
  FUZZ_CHECK(flag == 0 || flag == s.symmetric.size());
  if (flag == 0) FUZZ_CHECK(std::none_of(s.symmetric.begin(), s.symmetric.end(), [](bool b) { return b; }));
  FUZZ_CHECK(s.skip_device_barrier == a.skip_device_barrier);
}

// ------------------------------------------------------------- targets

// The parsers get exactly the input's bytes in an allocation of their own:
// ASAN flags a read past the end of an allocation, not past a std::string's
// size into its spare capacity.
class Exact {
 public:
  explicit Exact(std::string_view bytes) : data_(new char[bytes.size()]), size_(bytes.size()) {
    if (size_ != 0) std::memcpy(data_.get(), bytes.data(), size_);
  }
  std::string_view view() const { return std::string_view(data_.get(), size_); }

 private:
  std::unique_ptr<char[]> data_;
  size_t size_;
};

constexpr size_t kMaxWho = 2 * (jmf::kMaxLabelBytes + 3) + 32;
constexpr size_t kMaxError = 4096;

// Runs an accepted launch's programs on buffer shapes from the input (dims
// from 0 to 2^62, ranks 0..4): any outcome but a result outside the launch's
// limits, a changed spec on failure, or a sanitizer report is fine.
void CheckEvaluation(Input& in, const jmf::LaunchSpec& spec) {
  std::vector<std::vector<int64_t>> dims(spec.num_buffers);
  jmf::BufferShapes shapes;
  shapes.count = spec.num_buffers;
  for (int b = 0; b < spec.num_buffers; ++b) {
    dims[b].resize(in.Below(5));
    for (int64_t& d : dims[b]) d = in.Bool() ? static_cast<int64_t>(in.Below(4096)) : int64_t{1} << in.Below(63);
    shapes.dims[b] = dims[b].data();
    shapes.rank[b] = static_cast<int64_t>(dims[b].size());
  }
  jmf::LaunchSpec evaluated = spec;
  std::string error;
  if (!jmf::EvaluateLaunchPrograms(*spec.programs, shapes, &evaluated, &error)) {
    CheckMessage(error, kMaxProgramText + kMaxError);
    FUZZ_CHECK(evaluated.grid == spec.grid && evaluated.scalars == spec.scalars,
               "a failed evaluation changed the spec");
    return;
  }
  for (int i = 0; i < 3; ++i) {
    FUZZ_CHECK(evaluated.grid[i] >= 1 && evaluated.grid[i] <= jmf::kMaxGrid[i]);
    FUZZ_CHECK(evaluated.grid[i] % evaluated.cluster[i] == 0);
  }
  // A computed scalar fits its width; the others keep scalar_data's 8 bytes (the launch passes the low ones).
  FUZZ_CHECK(evaluated.scalars.size() == spec.scalars.size());
  std::vector<bool> computed(spec.scalars.size(), false);
  for (const jmf::LaunchProgram& p : spec.programs->programs) {
    if (p.target != jmf::kProgramGrid) computed[p.index] = true;
  }
  for (size_t k = 0; k < evaluated.scalars.size(); ++k) {
    const int bits = 8 * evaluated.scalar_sizes[k];
    if (computed[k]) FUZZ_CHECK(bits == 64 || evaluated.scalars[k] >> bits == 0, "a scalar wider than its size");
    if (!computed[k]) FUZZ_CHECK(evaluated.scalars[k] == spec.scalars[k], "a scalar no program computes changed");
  }
}

// Coherent launches, then up to a few mutations. An unmutated launch must be
// accepted for its own target and refused for the other.
bool FuzzValidator(Input& in, Input& edits) {
  int mutations = static_cast<int>(edits.Below(4));
  if (mutations == 3) mutations += static_cast<int>(edits.Below(6));
  const bool collective = in.Bool();
  Attributes attrs;
  BuildLaunch(in, collective, &attrs);
  for (int m = 0; m < mutations; ++m) Mutate(edits, &attrs);

  FuzzSource source(attrs);
  jmf::LaunchAttributes a;
  std::string error;
  const bool decoded = jmf::DecodeLaunchAttributes(source, &a, &error);
  g_attrs = &a;
  if (!decoded) CheckMessage(error, kMaxError);
  if (mutations == 0) FUZZ_CHECK(decoded, "an unmutated launch failed to decode: " + error);

  // Decoding fills what it could before failing; the validator must be safe
  // on any LaunchAttributes, so it runs either way.
  bool accepted = false;
  for (bool target : {false, true}) {
    jmf::LaunchSpec spec;
    std::string verror;
    const bool ok = jmf::ValidateLaunch(a, target, &spec, &verror);
    FUZZ_CHECK(spec.who == jmf::Who(a));
    CheckMessage(spec.who, kMaxWho);
    if (ok) {
      CheckSpec(a, target, spec);
      if (spec.programs != nullptr) CheckEvaluation(in, spec);
      accepted |= decoded;
    } else {
      CheckMessage(verror, kMaxError);
    }
    if (mutations == 0) {
      FUZZ_CHECK(ok == (target == collective), std::string("an unmutated ") + (collective ? "collective" : "plain") +
                                                   " launch, validated as " + (target ? "collective" : "plain") + ": " +
                                                   verror);
    }
  }
  g_attrs = nullptr;
  return accepted;
}

// Module images and the serialized layout, with where each field sits.
struct Layout {
  std::string bytes;
  std::vector<size_t> u32_fields;  // version, flags, counts, each image's kind/arch/suffix/encoding, CuTe fields
  std::vector<size_t> u64_fields;  // each image's size, and a compressed one's inflated size
};

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

// A zlib stream (RFC 1950) of stored deflate blocks: valid for any zlib, and
// one encoding per input, so that parse-then-serialize can be compared byte
// for byte.
std::string StoredZlib(std::string_view data) {
  std::string out = "\x78\x01";  // deflate, 32K window; no preset dictionary; header % 31 == 0
  size_t at = 0;
  do {
    const size_t length = std::min<size_t>(data.size() - at, 65535);
    out.push_back(at + length == data.size() ? 1 : 0);  // BFINAL, BTYPE 00 (stored)
    for (uint32_t v : {static_cast<uint32_t>(length), static_cast<uint32_t>(~length & 0xffff)}) {
      out.push_back(static_cast<char>(v & 0xff));
      out.push_back(static_cast<char>((v >> 8) & 0xff));
    }
    out.append(data.substr(at, length));
    at += length;
  } while (at < data.size());
  uint32_t a = 1, b = 0;
  for (unsigned char c : data) {
    a = (a + c) % 65521;
    b = (b + a) % 65521;
  }
  const uint32_t adler = (b << 16) | a;
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((adler >> shift) & 0xff));
  return out;
}

// Where an ELF object's u64 fields that locate things sit: the section table's offset, each section's offset
// and size (mutation targets, set to values around their bounds).
std::vector<size_t> ElfU64Fields(std::string_view elf) {
  std::vector<size_t> out;
  if (elf.size() < 64) return out;
  uint64_t shoff = 0;
  for (int i = 0; i < 8; ++i) shoff |= uint64_t{static_cast<unsigned char>(elf[40 + i])} << (8 * i);
  const size_t shnum = static_cast<unsigned char>(elf[60]) | static_cast<size_t>(static_cast<unsigned char>(elf[61]))
                                                                 << 8;
  out.push_back(40);
  for (size_t i = 0; i < shnum && shoff <= elf.size() && (elf.size() - shoff) / 64 > i; ++i) {
    out.push_back(shoff + 64 * i + 24);
    out.push_back(shoff + 64 * i + 32);
  }
  return out;
}

Layout Serialize(const jmf::ParsedModule& module) {
  Layout out;
  out.bytes = "JMFFIMOD";
  for (uint32_t v : {module.version, module.flags, static_cast<uint32_t>(module.images.size()),
                     static_cast<uint32_t>(module.symbol.size())}) {
    out.u32_fields.push_back(out.bytes.size());
    PutU32(&out.bytes, v);
  }
  out.bytes += module.symbol;
  for (const jmf::Image& image : module.images) {
    for (uint32_t v : {static_cast<uint32_t>(image.kind), image.arch, image.suffix, image.encoding}) {
      out.u32_fields.push_back(out.bytes.size());
      PutU32(&out.bytes, v);
    }
    // The payload, with where its fields sit relative to its start.
    Layout payload;
    if (image.kind != jmf::ImageKind::kCuteObject) {
      payload.bytes = image.data;
    } else {
      // A CuTe DSL object's payload: its release, its host function's argument kinds, the object.
      payload.u32_fields.push_back(payload.bytes.size());
      PutU32(&payload.bytes, static_cast<uint32_t>(image.dsl_version.size()));
      payload.bytes += image.dsl_version;
      payload.u32_fields.push_back(payload.bytes.size());
      PutU32(&payload.bytes, static_cast<uint32_t>(image.host_arg_kinds.size()));
      for (uint32_t kind : image.host_arg_kinds) {
        payload.u32_fields.push_back(payload.bytes.size());
        PutU32(&payload.bytes, kind);
      }
      for (size_t at : ElfU64Fields(image.data)) payload.u64_fields.push_back(payload.bytes.size() + at);
      payload.bytes += image.data;
    }
    if (image.encoding == jmf::kEncodingZlib) {  // u64 inflated size | the stream; its fields are inside it
      std::string packed;
      PutU64(&packed, payload.bytes.size());
      packed += StoredZlib(payload.bytes);
      payload = Layout{std::move(packed), {}, {0}};
    }
    out.u64_fields.push_back(out.bytes.size());
    PutU64(&out.bytes, payload.bytes.size());
    for (size_t at : payload.u32_fields) out.u32_fields.push_back(out.bytes.size() + at);
    for (size_t at : payload.u64_fields) out.u64_fields.push_back(out.bytes.size() + at);
    out.bytes += payload.bytes;
  }
  return out;
}

constexpr std::string_view kElfMagic = "\177ELF";

// A CuTe DSL object as small as the parser takes (contract/cute_object.h): an x86-64 relocatable of a code
// section (the entry points and the host function, `ret` each), a data section (the strings the runtime reads),
// a relocation section, the symbol table and its strings; the section table last.
std::string CuteObject(Input& in) {
  const std::string p = jmf::kCutePrefix;
  const std::string host = "_mlir_" + p + "__mlir_ciface_" + (in.Bool() ? "entry" : "cutlass_host_entry_0x0");
  const std::vector<std::string> functions = {"_mlir_" + p + "_cuda_init", p + "_cuda_init",
                                              "_mlir_" + p + "_cuda_load_to_device", p + "_cuda_load_to_device", host};
  std::string info = "{";
  for (size_t k = 0, kernels = in.Below(3); k < kernels; ++k) {
    info += std::string(k ? ", " : "") + "\"kernel_" + std::to_string(k) + "\": {";
    for (size_t a = 0, attrs = in.Below(3); a < attrs; ++a) {
      info += std::string(a ? ", " : "") + "\"" + std::to_string(in.Below(100)) +
              "\": " + std::to_string(static_cast<int64_t>(in.Below(200)) - 100);
    }
    info += "}";
  }
  info += "}";
  const std::vector<std::pair<std::string, std::string>> data = {
      {p + "_function_name", host}, {p + "_kernel_info", info}, {p + "_version", in.Bool() ? "1.1" : "1.0"}};
  std::string code(16 * functions.size(), '\xc3'), strings(1, '\0'), bytes, symbols(24, '\0');
  auto name = [&](const std::string& n) {
    const uint32_t at = static_cast<uint32_t>(strings.size());
    strings += n + '\0';
    return at;
  };
  auto symbol = [&](uint32_t n, uint8_t type, uint16_t section, uint64_t value, uint64_t size) {
    PutU32(&symbols, n);
    symbols.push_back(static_cast<char>(0x10 | type));  // global
    symbols.push_back(0);
    symbols.push_back(static_cast<char>(section & 0xff));
    symbols.push_back(static_cast<char>(section >> 8));
    PutU64(&symbols, value);
    PutU64(&symbols, size);
  };
  for (size_t i = 0; i < functions.size(); ++i) symbol(name(functions[i]), 2, 1, 16 * i, 16);
  for (const auto& [n, text] : data) {
    symbol(name(n), 1, 2, bytes.size(), text.size() + 1);
    bytes += text + '\0';
  }
  std::string rela;  // two relocations of the code against the first symbols
  for (uint64_t r = 0; r < 2; ++r) {
    PutU64(&rela, 4 + 16 * r);
    PutU64(&rela, ((r + 1) << 32) | 2);  // R_X86_64_PC32
    PutU64(&rela, 0);
  }
  std::string object(64, '\0');
  struct Part {
    uint32_t type;
    uint64_t flags;
    std::string bytes;
    uint32_t link, info, entsize;
  };
  const std::vector<Part> parts = {{1, 6, code, 0, 0, 0},
                                   {1, 3, bytes, 0, 0, 0},
                                   {4, 0x40, rela, 4, 1, 24},
                                   {2, 0, symbols, 5, 1, 24},
                                   {3, 0, strings, 0, 0, 0}};
  std::vector<uint64_t> offsets;
  for (const Part& part : parts) {
    offsets.push_back(object.size());
    object += part.bytes;
    object.append((8 - object.size() % 8) % 8, '\0');
  }
  const uint64_t shoff = object.size();
  object.append(64, '\0');  // section 0: null
  for (size_t i = 0; i < parts.size(); ++i) {
    const Part& part = parts[i];
    std::string header;
    PutU32(&header, 0);
    PutU32(&header, part.type);
    PutU64(&header, part.flags);
    PutU64(&header, 0);
    PutU64(&header, offsets[i]);
    PutU64(&header, part.bytes.size());
    PutU32(&header, part.link);
    PutU32(&header, part.info);
    PutU64(&header, 8);
    PutU64(&header, part.entsize);
    object += header;
  }
  std::string elf = "\177ELF";
  elf += std::string("\2\1\1", 3) + std::string(9, '\0');
  for (uint32_t v : {1u, 62u}) elf.append({static_cast<char>(v), 0});  // e_type REL, e_machine x86-64
  PutU32(&elf, 1);
  PutU64(&elf, 0);
  PutU64(&elf, 0);
  PutU64(&elf, shoff);
  PutU32(&elf, 0);
  const uint16_t shnum = static_cast<uint16_t>(parts.size() + 1);
  for (uint16_t v : {uint16_t{64}, uint16_t{0}, uint16_t{0}, uint16_t{64}, shnum, uint16_t{5}}) {
    elf.append({static_cast<char>(v & 0xff), static_cast<char>(v >> 8)});
  }
  object.replace(0, 64, elf);
  if (in.OneIn(4)) object += in.Pattern(in.Below(64));  // bytes after the section table: taken
  return object;
}

// A module, well-formed but for its symbol length or image count, which are
// sometimes one past their limit.
jmf::ParsedModule BuildModule(Input& in) {
  jmf::ParsedModule module;
  module.version = in.OneIn(4) ? jmf::kOldestModuleFormatVersion : jmf::kModuleFormatVersion;
  module.flags = in.Bool() ? jmf::kKnownFlags : 0;
  static constexpr char kSymbolChars[] = "_Z3fooPfaddkernel0123456789$.";
  const size_t symbol_length =
      in.OneIn(16) ? jmf::kMaxSymbolLength - 1 + in.Below(3) : 1 + in.Below(in.Bool() ? 8 : 64);
  for (size_t i = 0; i < symbol_length; ++i) module.symbol += kSymbolChars[in.Below(sizeof(kSymbolChars) - 1)];
  const size_t num_images = in.OneIn(16) ? jmf::kMaxImages - 1 + in.Below(3) : 1 + in.Below(4);
  static constexpr uint32_t kArchs[] = {90, 80, 100, 120, 89, jmf::kMinArch, jmf::kMaxArch, 75, 86, 103};
  const bool cute = in.OneIn(3);  // a module of CuTe DSL objects (flagless), else cubins and PTX
  if (cute) module.flags = 0;
  if (cute && !in.OneIn(4)) module.symbol = jmf::kCutePrefix;  // ours, so the parser goes on to the objects
  for (size_t i = 0; i < num_images; ++i) {
    jmf::Image image;
    if (cute) {
      image.kind = jmf::ImageKind::kCuteObject;
      image.arch = Pick(in, kArchs);
      image.suffix = static_cast<uint32_t>(in.Below(std::size(jmf::kArchSuffixes)));
      static constexpr std::string_view kVersions[] = {"4.8.1", "4.8.0", "10.20.300rc1", "x"};
      image.dsl_version = std::string(Pick(in, kVersions));
      const size_t args = in.OneIn(16) ? jmf::kMaxHostArgs : in.Below(8);
      for (size_t k = 0; k < args; ++k)
        image.host_arg_kinds.push_back(in.Bool() ? jmf::kHostArgPointer : jmf::kHostArgInt64);
      image.data =
          module.symbol == jmf::kCutePrefix ? CuteObject(in) : std::string(kElfMagic) + in.Pattern(in.Below(64));
      if (module.version > 1 && in.Bool()) image.encoding = jmf::kEncodingZlib;
      module.images.push_back(std::move(image));
      continue;
    }
    image.kind = in.Bool() ? jmf::ImageKind::kPtx : jmf::ImageKind::kCubin;
    image.arch = in.Bool() ? static_cast<uint32_t>(jmf::kMinArch + in.Below(jmf::kMaxArch - jmf::kMinArch + 1))
                           : Pick(in, kArchs);
    image.suffix = static_cast<uint32_t>(in.Below(std::size(jmf::kArchSuffixes)));
    const size_t size = in.OneIn(32) ? 4096 + in.Below(1 << 16) : in.Below(64);
    if (image.kind == jmf::ImageKind::kCubin) {
      image.data = std::string(kElfMagic) + in.Pattern(size);
    } else {
      image.data = ".version 8.0\n" + std::string(size, ' ');
      for (char& c : image.data) c = c == ' ' ? static_cast<char>(0x20 + in.Below(0x5f)) : c;
    }
    if (module.version > 1 && in.Bool()) image.encoding = jmf::kEncodingZlib;
    module.images.push_back(std::move(image));
  }
  return module;
}

// Edits of the bytes that keep most of the structure: flips, sets, cuts,
// inserts, and length or count fields set to values around their bounds.
void MutateModule(Input& in, Layout* layout) {
  std::string& b = layout->bytes;
  static constexpr uint8_t kBytes[] = {0, 1, 2, 0x7f, 0x80, 0xff, 'E', 'J', '\n'};
  switch (in.Below(8)) {
    case 0:
      if (!b.empty()) b[in.Below(b.size())] ^= static_cast<char>(1 << in.Below(8));
      break;
    case 1:
      if (!b.empty()) b[in.Below(b.size())] = static_cast<char>(in.Bool() ? Pick(in, kBytes) : in.U8());
      break;
    case 2:
      b.resize(in.Below(b.size() + 1));
      break;
    case 3: {
      const size_t at = in.Below(b.size() + 1);
      b.insert(at, in.Raw(1 + in.Below(16)));
      break;
    }
    case 4:
      if (!b.empty()) {
        const size_t at = in.Below(b.size());
        b.erase(at, 1 + in.Below(32));
      }
      break;
    case 5: {
      const size_t at = layout->u32_fields[in.Below(layout->u32_fields.size())];
      const uint32_t remaining = static_cast<uint32_t>(b.size() - std::min(b.size(), at + 4));
      // clang-format off
      const uint32_t kValues[] = {0, 1, 2, 3, 63, 64, 65, jmf::kMinArch - 1, jmf::kMaxArch + 1,
                                  jmf::kMaxSymbolLength, jmf::kMaxSymbolLength + 1,
                                  0x7fffffffu, 0x80000000u, 0xfffffffeu, 0xffffffffu,
                                  remaining - 1, remaining, remaining + 1};
      // clang-format on
      if (at + 4 <= b.size()) {
        std::string field;
        PutU32(&field, Pick(in, kValues));
        b.replace(at, 4, field);
      }
      break;
    }
    case 6: {
      const size_t at = layout->u64_fields[in.Below(layout->u64_fields.size())];
      if (at + 8 > b.size()) break;
      const uint64_t remaining = b.size() - (at + 8);
      // clang-format off
      const uint64_t kValues[] = {0, 1, remaining, remaining + 1, remaining - 1, uint64_t{1} << 32,
                                  uint64_t{1} << 63, ~uint64_t{0}, ~uint64_t{0} - 23, b.size(), in.U64()};
      // clang-format on
      std::string field;
      PutU64(&field, Pick(in, kValues));
      b.replace(at, 8, field);
      break;
    }
    default:
      b += in.Raw(1 + in.Below(8));  // trailing bytes
  }
}

void CheckModule(const jmf::ParsedModule& module, std::string_view bytes) {
  FUZZ_CHECK(module.version >= jmf::kOldestModuleFormatVersion && module.version <= jmf::kModuleFormatVersion);
  FUZZ_CHECK((module.flags & ~jmf::kKnownFlags) == 0);
  FUZZ_CHECK(!module.images.empty() && module.images.size() <= jmf::kMaxImages);
  FUZZ_CHECK(!module.symbol.empty() && module.symbol.size() <= jmf::kMaxSymbolLength);
  FUZZ_CHECK(module.symbol.find('\0') == std::string::npos);
  for (const jmf::Image& image : module.images) {
    FUZZ_CHECK(!image.data.empty());
    FUZZ_CHECK(image.encoding == jmf::kEncodingStored || (image.encoding == jmf::kEncodingZlib && module.version > 1));
    FUZZ_CHECK(image.arch >= jmf::kMinArch && image.arch <= jmf::kMaxArch);
    FUZZ_CHECK(image.suffix < std::size(jmf::kArchSuffixes));
    FUZZ_CHECK((image.kind == jmf::ImageKind::kCuteObject) == module.cute);  // one kind of module or the other
    if (image.kind == jmf::ImageKind::kCubin || image.kind == jmf::ImageKind::kCuteObject) {
      FUZZ_CHECK(image.data.starts_with(kElfMagic));  // the driver (or the CuTe runtime) reads an ELF header
    }
    if (image.kind == jmf::ImageKind::kCuteObject) {
      FUZZ_CHECK(!image.dsl_version.empty() && image.dsl_version.size() <= jmf::kMaxCuteVersionLength);
      FUZZ_CHECK(image.host_arg_kinds.size() <= jmf::kMaxHostArgs);
      for (uint32_t kind : image.host_arg_kinds) FUZZ_CHECK(kind == jmf::kHostArgPointer || kind == jmf::kHostArgInt64);
    } else if (image.kind != jmf::ImageKind::kCubin) {
      FUZZ_CHECK(image.kind == jmf::ImageKind::kPtx);
      FUZZ_CHECK(image.data.find('\0') == std::string::npos);  // the driver reads a C string
    }
    FUZZ_CHECK(!jmf::ArchName(image).empty());
  }
  FUZZ_CHECK(!jmf::DescribeImages(module).empty());
  // The format has one encoding of a module, but for its zlib streams (zlib
  // ignores a stored block's padding bits and the header's FLEVEL): what parses
  // must be exactly the bytes it would serialize to, where nothing is compressed.
  const std::string again = Serialize(module).bytes;
  if (std::none_of(module.images.begin(), module.images.end(),
                   [](const jmf::Image& image) { return image.encoding == jmf::kEncodingZlib; })) {
    FUZZ_CHECK(again == bytes, "parse then serialize changed the bytes");
  } else {  // the same module, read back from our own encoding of it
    jmf::ParsedModule reread;
    std::string error;
    FUZZ_CHECK(jmf::ParseModule(again, &jmf::InflateZlib, &reread, &error), "re-encoded module refused: " + error);
    FUZZ_CHECK(reread.version == module.version && reread.flags == module.flags && reread.symbol == module.symbol &&
               reread.images.size() == module.images.size());
    for (size_t i = 0; i < module.images.size(); ++i) {
      const jmf::Image &a = module.images[i], &b = reread.images[i];
      FUZZ_CHECK(a.kind == b.kind && a.arch == b.arch && a.suffix == b.suffix && a.encoding == b.encoding &&
                 a.data == b.data && a.dsl_version == b.dsl_version && a.host_arg_kinds == b.host_arg_kinds);
    }
  }
}

bool FuzzParser(Input& in, Input& edits) {
  std::string bytes;
  bool must_parse = false, must_refuse = false;
  jmf::ParsedModule built;
  switch (in.Below(4)) {
    case 0:
    case 1: {
      built = BuildModule(in);
      Layout layout = Serialize(built);
      int mutations = static_cast<int>(edits.Below(4));
      if (mutations == 3) mutations += static_cast<int>(edits.Below(6));
      for (int m = 0; m < mutations; ++m) MutateModule(edits, &layout);
      const bool within_limits = built.symbol.size() <= jmf::kMaxSymbolLength && built.images.size() <= jmf::kMaxImages;
      const bool foreign_cute = !built.images.empty() && built.images[0].kind == jmf::ImageKind::kCuteObject &&
                                built.symbol != jmf::kCutePrefix;  // refused: CuTe DSL modules are ours
      must_parse = mutations == 0 && within_limits && !foreign_cute;
      must_refuse = mutations == 0 && (!within_limits || foreign_cute);
      bytes = std::move(layout.bytes);
      break;
    }
    case 2: {
      // Past the magic, so that random bytes reach the header checks.
      bytes = "JMFFIMOD";
      PutU32(&bytes, in.Bool() ? jmf::kModuleFormatVersion - in.Below(2) : in.U32());
      PutU32(&bytes, in.Bool() ? 0 : in.U32());
      bytes += in.Rest();
      break;
    }
    default:
      bytes = in.Rest();
  }
  jmf::ParsedModule module;
  std::string error;
  const bool ok = jmf::ParseModule(Exact(bytes).view(), &jmf::InflateZlib, &module, &error);
  if (ok) {
    CheckModule(module, bytes);
  } else {
    CheckMessage(error, kMaxError);
  }
  FUZZ_CHECK(!(must_refuse && ok), "a module past the limits was accepted");
  if (must_parse) {
    FUZZ_CHECK(ok, "an unmutated module failed to parse: " + error);
    FUZZ_CHECK(module.flags == built.flags && module.symbol == built.symbol &&
               module.images.size() == built.images.size());
    for (size_t i = 0; i < built.images.size(); ++i) {
      FUZZ_CHECK(module.images[i].kind == built.images[i].kind && module.images[i].arch == built.images[i].arch &&
                 module.images[i].suffix == built.images[i].suffix && module.images[i].data == built.images[i].data &&
                 module.images[i].encoding == built.images[i].encoding &&
                 module.images[i].dsl_version == built.images[i].dsl_version &&
                 module.images[i].host_arg_kinds == built.images[i].host_arg_kinds);
    }
  }
  return ok;
}

// An independent reading of the same grammar, for text of digits, ',' and
// ';' only (ParseCliques also skips spaces).
bool ReferenceCliques(std::string_view text, std::vector<std::vector<int32_t>>* cliques) {
  cliques->clear();
  if (text.empty() || text.size() > jmf::kMaxReplicaIdsBytes) return false;
  std::array<bool, jmf::kMaxDevices> seen{};
  cliques->emplace_back();
  std::string token;
  for (size_t i = 0; i <= text.size(); ++i) {
    const char c = i < text.size() ? text[i] : ';';
    if (c != ',' && c != ';') {
      token += c;
      continue;
    }
    const size_t first = token.find_first_not_of('0');
    const std::string digits = first == std::string::npos ? "0" : token.substr(first);
    if (token.empty() || digits.size() > 2) return false;
    const int id = std::stoi(digits);
    if (id >= jmf::kMaxDevices || seen[id]) return false;
    seen[id] = true;
    cliques->back().push_back(id);
    token.clear();
    if (c == ';' && i < text.size()) cliques->emplace_back();
  }
  return true;
}

bool FuzzCliques(Input& in, Input& edits) {
  std::string text;
  bool must_parse = false;
  std::vector<std::vector<int32_t>> built;
  switch (in.Below(16)) {
    case 13: {
      // Valid cliques padded with spaces to around the length limit.
      text = CliqueText(in, &built);
      const size_t length = jmf::kMaxReplicaIdsBytes - 1 + in.Below(3);
      if (text.size() < length) text.insert(in.Bool() ? 0 : text.size(), length - text.size(), ' ');
      must_parse = text.size() <= jmf::kMaxReplicaIdsBytes;
      break;
    }
    case 14:
      text = Text(in, Length(in, jmf::kMaxReplicaIdsBytes));
      break;
    case 15:
      text = in.Rest();
      break;
    default: {  // valid cliques, then a few edits
      text = CliqueText(in, &built);
      int mutations = static_cast<int>(edits.Below(3));
      must_parse = mutations == 0;
      for (int m = 0; m < mutations; ++m) {
        // clang-format off
        static constexpr std::string_view kPieces[] = {",", ";", " ", "0", "63", "64", "00000000000000000000001",
                                                       "99999999999999999999999", "4294967296", "-1", "",
                                                       std::string_view("\0", 1)};
        // clang-format on
        const std::string piece = edits.Bool() ? std::string(Pick(edits, kPieces)) : Text(edits, 1 + edits.Below(4));
        const size_t at = edits.Below(text.size() + 1);
        if (edits.Bool()) {
          text.insert(at, piece);
        } else {
          text.replace(at, edits.Below(4), piece);
        }
      }
      break;
    }
  }
  std::vector<std::vector<int32_t>> cliques;
  std::string error;
  const bool ok = jmf::ParseCliques(Exact(text).view(), &cliques, &error);
  if (ok) {
    CheckCliques(cliques);
  } else {
    CheckMessage(error, kMaxError);
  }
  if (must_parse) {
    FUZZ_CHECK(ok, "valid cliques '" + Escape(text) + "' were refused: " + error);
    FUZZ_CHECK(cliques == built, "cliques '" + Escape(text) + "' parsed differently");
  }
  if (text.find_first_not_of("0123456789,;") == std::string::npos) {
    std::vector<std::vector<int32_t>> expected;
    const bool expected_ok = ReferenceCliques(text, &expected);
    FUZZ_CHECK(ok == expected_ok, "'" + Escape(text) + "': ParseCliques says " + (ok ? "valid" : "invalid: " + error));
    if (ok) FUZZ_CHECK(cliques == expected, "'" + Escape(text) + "' parsed differently from the reference");
  }
  return ok;
}

constexpr int kTargets = 3;
constexpr const char* kTargetNames[kTargets] = {"validator", "parser", "cliques"};

// Runs one input; says which target ran and whether it accepted.
bool RunCase(const uint8_t* data, size_t size, int* target) {
  *target = size == 0 ? 0 : data[0] % kTargets;
  const uint8_t* rest = size == 0 ? data : data + 1;
  const size_t rest_size = size == 0 ? 0 : size - 1;
  Input in(rest, rest_size);
  Input edits(rest, rest_size, /*backwards=*/true);
  switch (*target) {
    case 0:
      return FuzzValidator(in, edits);
    case 1:
      return FuzzParser(in, edits);
    default:
      return FuzzCliques(in, edits);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int target;
  RunCase(data, size, &target);
  return 0;
}

#ifndef JMF_LIBFUZZER

namespace {

// The input being run, so that a failure in the built-in loop leaves a file
// to replay, whatever ends the process: a violated invariant or a library
// assertion (SIGABRT), or a sanitizer report (its death callback).
const std::vector<uint8_t>* g_current = nullptr;
std::string g_artifact_path;

// Plain system calls: this may run in a signal handler.
void WriteArtifact() {
  static bool written = false;
  if (g_current == nullptr || g_artifact_path.empty() || written) return;
  written = true;
  const int fd = open(g_artifact_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  const bool ok = write(fd, g_current->data(), g_current->size()) == static_cast<ssize_t>(g_current->size());
  close(fd);
  if (!ok) return;
  const char* parts[] = {"contract_fuzz: the failing input is in ", g_artifact_path.c_str(), "\n"};
  for (const char* part : parts) {
    if (write(STDERR_FILENO, part, std::strlen(part)) < 0) return;
  }
}

// xoshiro256**: fast, and the same sequence from the same seed everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& s : s_) {  // splitmix64
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      s = z ^ (z >> 31);
    }
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0], s_[3] ^= s_[1], s_[1] ^= s_[2], s_[0] ^= s_[3], s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : Next() % n; }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// Byte-level mutations of an input (its first byte, the target, is kept).
void MutateBytes(Rng& rng, const std::vector<std::vector<uint8_t>>& pool, std::vector<uint8_t>* input) {
  std::vector<uint8_t>& b = *input;
  const int edits = 1 + static_cast<int>(rng.Below(4));
  for (int e = 0; e < edits; ++e) {
    const size_t at = 1 + rng.Below(b.size());  // in [1, size]
    switch (rng.Below(6)) {
      case 0:
        if (at < b.size()) b[at] ^= static_cast<uint8_t>(1 << rng.Below(8));
        break;
      case 1:
        if (at < b.size()) b[at] = static_cast<uint8_t>(rng.Next());
        break;
      case 2:
        b.insert(b.begin() + static_cast<ptrdiff_t>(at), static_cast<uint8_t>(rng.Next()));
        break;
      case 3:
        if (at < b.size()) b.erase(b.begin() + static_cast<ptrdiff_t>(at));
        break;
      case 4:
        b.resize(at);
        break;
      default: {
        // Splice in the tail of another accepted input of the same target.
        const std::vector<uint8_t>& other = pool[rng.Below(pool.size())];
        const size_t from = 1 + rng.Below(other.size());
        b.resize(at);
        b.insert(b.end(), other.begin() + static_cast<ptrdiff_t>(std::min(from, other.size())), other.end());
      }
    }
  }
}

struct Counts {
  uint64_t cases[kTargets] = {};
  uint64_t accepted[kTargets] = {};
  std::string Text() const {
    std::string out;
    for (int t = 0; t < kTargets; ++t) {
      out += std::string(t ? ", " : "") + kTargetNames[t] + ": " + std::to_string(cases[t]) + " cases (" +
             std::to_string(accepted[t]) + " accepted)";
    }
    return out;
  }
};

// Fresh random inputs, and mutations of inputs that were accepted (those
// reach the invariant checks, and small edits of them probe the bounds).
int FuzzLoop(double seconds, uint64_t max_cases, uint64_t seed, const std::string& artifacts) {
  std::printf("contract_fuzz: seed %llu, %g s\n", static_cast<unsigned long long>(seed), seconds);
  std::fflush(stdout);
  Rng rng(seed);
  std::vector<std::vector<uint8_t>> pools[kTargets];
  constexpr size_t kPoolSize = 512;
  Counts counts;
  std::vector<uint8_t> input;
  g_current = &input;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (uint64_t n = 0; n < max_cases; ++n) {
    if (n % 64 == 0 && std::chrono::steady_clock::now() >= deadline) break;
    const int target = static_cast<int>(n % kTargets);
    std::vector<std::vector<uint8_t>>& pool = pools[target];
    if (!pool.empty() && rng.Below(2) == 0) {
      input = pool[rng.Below(pool.size())];
      MutateBytes(rng, pool, &input);
    } else {
      const uint64_t kind = rng.Below(16);
      input.resize(1 + (kind < 12 ? rng.Below(64) : kind < 15 ? rng.Below(512) : rng.Below(4096)));
      for (uint8_t& byte : input) byte = static_cast<uint8_t>(rng.Next());
    }
    input[0] = static_cast<uint8_t>(target);
    g_artifact_path = artifacts + "/crash-" + std::to_string(seed) + "-" + std::to_string(n);
    int ran;
    const bool accepted = RunCase(input.data(), input.size(), &ran);
    ++counts.cases[ran];
    if (accepted) {
      ++counts.accepted[ran];
      if (pool.size() < kPoolSize) {
        pool.push_back(input);
      } else if (rng.Below(8) == 0) {
        pool[rng.Below(pool.size())] = input;
      }
    }
  }
  g_current = nullptr;
  std::printf("%s\n", counts.Text().c_str());
  return 0;
}

int Replay(const std::vector<std::string>& paths) {
  std::vector<std::filesystem::path> files;
  for (const std::string& path : paths) {
    if (std::filesystem::is_directory(path)) {
      for (const auto& entry : std::filesystem::directory_iterator(path)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
    } else {
      files.emplace_back(path);
    }
  }
  std::sort(files.begin(), files.end());
  Counts counts;
  for (const std::filesystem::path& file : files) {
    std::ifstream stream(file, std::ios::binary);
    if (!stream) {
      std::fprintf(stderr, "contract_fuzz: cannot read %s\n", file.c_str());
      return 2;
    }
    const std::vector<uint8_t> input((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "contract_fuzz: %s\n", file.c_str());  // names the input a crash comes from
    int target;
    const bool accepted = RunCase(input.data(), input.size(), &target);
    ++counts.cases[target];
    counts.accepted[target] += accepted;
  }
  std::printf("replayed %zu inputs: %s\n", files.size(), counts.Text().c_str());
  return 0;
}

int Usage() {
  std::fprintf(stderr,
               "usage: contract_fuzz --seconds N [--seed S] [--cases N] [--artifacts DIR]\n"
               "       contract_fuzz FILE_OR_DIR...   (replay)\n");
  return 2;
}

}  // namespace

// With g++, UBSAN is a runtime of its own that never calls ASAN's death
// callback: have it abort, so that OnAbort saves the input. UBSAN_OPTIONS
// still overrides this.
extern "C" const char* __ubsan_default_options() { return "abort_on_error=1:print_stacktrace=1"; }

extern "C" void OnAbort(int) {
  WriteArtifact();
  std::signal(SIGABRT, SIG_DFL);
  std::raise(SIGABRT);
}

int main(int argc, char** argv) {
  if (__sanitizer_set_death_callback != nullptr) __sanitizer_set_death_callback(WriteArtifact);
  std::signal(SIGABRT, OnAbort);
  double seconds = -1;
  uint64_t max_cases = std::numeric_limits<uint64_t>::max();
  uint64_t seed = std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007;
  std::string artifacts = ".";
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--seconds" && has_value) {
      seconds = std::strtod(argv[++i], nullptr);
    } else if (arg == "--seed" && has_value) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--cases" && has_value) {
      max_cases = std::strtoull(argv[++i], nullptr, 10);
      if (seconds < 0) seconds = 1e9;
    } else if (arg == "--artifacts" && has_value) {
      artifacts = argv[++i];
    } else if (arg.starts_with("--")) {
      return Usage();
    } else {
      files.push_back(arg);
    }
  }
  if (seconds >= 0 && files.empty()) return FuzzLoop(seconds, max_cases, seed, artifacts);
  if (seconds < 0 && !files.empty()) return Replay(files);
  return Usage();
}

#endif  // JMF_LIBFUZZER
