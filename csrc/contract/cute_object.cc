#include "contract/cute_object.h"

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "contract/contract.h"

namespace jmf {
namespace {

// ELF64 (the System V ABI, x86-64 supplement): the sizes and values read here.
constexpr size_t kHeaderBytes = 64, kSectionBytes = 64, kSymbolBytes = 24, kRelaBytes = 24;
constexpr uint16_t kRelocatable = 1, kX86_64 = 62;
constexpr uint32_t kProgbits = 1, kSymtab = 2, kStrtab = 3, kRela = 4, kNobits = 8, kRel = 9, kDynsym = 11;
constexpr uint64_t kAlloc = 2, kExecinstr = 4;
constexpr uint16_t kUndef = 0, kLoReserve = 0xff00, kAbs = 0xfff1, kCommon = 0xfff2;
constexpr uint8_t kGlobal = 1, kObject = 1, kFunc = 2;

template <typename T>
T Read(std::string_view bytes, uint64_t offset) {  // the caller bounded offset + sizeof(T)
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    value |= static_cast<T>(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
  }
  return value;
}

// [offset, offset + size) lies within `limit` bytes, without overflow.
bool Within(uint64_t offset, uint64_t size, uint64_t limit) { return offset <= limit && size <= limit - offset; }

struct Section {
  uint32_t type;
  uint64_t flags, offset, size;
  uint32_t link, info;
  uint64_t entsize;
};

struct Symbol {
  std::string_view name;
  uint8_t bind, type;
  uint16_t section;
  uint64_t value, size;
};

class ObjectChecker {
 public:
  ObjectChecker(std::string_view object, std::string_view prefix, std::string* error)
      : object_(object), prefix_(prefix), error_(error) {}

  bool Check() { return Header() && Sections() && Symbols() && Relocations() && EntryPoints(); }

 private:
  bool Fail(const std::string& why) {
    *error_ = why;
    return false;
  }

  bool Header() {
    if (object_.size() < kHeaderBytes || object_.substr(0, 4) != std::string_view("\x7f"
                                                                                  "ELF",
                                                                                  4)) {
      return Fail("it is not an ELF file");
    }
    if (object_[4] != 2 || object_[5] != 1 || object_[6] != 1) {
      return Fail("it is not a 64-bit little-endian ELF file of version 1");
    }
    if (Read<uint16_t>(object_, 16) != kRelocatable || Read<uint16_t>(object_, 18) != kX86_64 ||
        Read<uint32_t>(object_, 20) != 1) {
      return Fail("it is not an x86-64 relocatable object (ELF type " + std::to_string(Read<uint16_t>(object_, 16)) +
                  ", machine " + std::to_string(Read<uint16_t>(object_, 18)) + ")");
    }
    const uint64_t program_headers = Read<uint64_t>(object_, 32);
    shoff_ = Read<uint64_t>(object_, 40);
    const uint16_t header_size = Read<uint16_t>(object_, 52), phnum = Read<uint16_t>(object_, 56);
    const uint16_t shentsize = Read<uint16_t>(object_, 58);
    shnum_ = Read<uint16_t>(object_, 60);
    shstrndx_ = Read<uint16_t>(object_, 62);
    if (header_size != kHeaderBytes || program_headers != 0 || phnum != 0 || shentsize != kSectionBytes) {
      return Fail("its ELF header is not a relocatable object's (header size " + std::to_string(header_size) + ", " +
                  std::to_string(phnum) + " program headers, section header size " + std::to_string(shentsize) + ")");
    }
    if (shnum_ == 0 || shnum_ > kMaxElfSections || shstrndx_ >= shnum_ ||
        !Within(shoff_, uint64_t{shnum_} * kSectionBytes, object_.size())) {
      return Fail("its section table (" + std::to_string(shnum_) + " sections at offset " + std::to_string(shoff_) +
                  ", names in section " + std::to_string(shstrndx_) + ") is not within its " +
                  std::to_string(object_.size()) + " bytes (1.." + std::to_string(kMaxElfSections) + " sections)");
    }
    return true;
  }

  bool Sections() {
    sections_.resize(shnum_);
    int symtabs = 0;
    for (uint32_t i = 0; i < shnum_; ++i) {
      const uint64_t at = shoff_ + uint64_t{i} * kSectionBytes;
      Section& s = sections_[i];
      s.type = Read<uint32_t>(object_, at + 4);
      s.flags = Read<uint64_t>(object_, at + 8);
      s.offset = Read<uint64_t>(object_, at + 24);
      s.size = Read<uint64_t>(object_, at + 32);
      s.link = Read<uint32_t>(object_, at + 40);
      s.info = Read<uint32_t>(object_, at + 44);
      s.entsize = Read<uint64_t>(object_, at + 56);
      if (s.type != kNobits && !Within(s.offset, s.size, object_.size())) {
        return Fail("section " + std::to_string(i) + " (" + std::to_string(s.size) + " bytes at offset " +
                    std::to_string(s.offset) + ") is not within the file");
      }
      if (s.type == kDynsym || s.type == kRel) {
        return Fail("section " + std::to_string(i) + " is of type " + std::to_string(s.type) +
                    ", which an x86-64 relocatable object does not have");
      }
      if (s.type == kSymtab) {
        ++symtabs;
        symtab_ = i;
      }
    }
    if (symtabs != 1) return Fail("it has " + std::to_string(symtabs) + " symbol tables, not one");
    const Section& table = sections_[symtab_];
    if (table.entsize != kSymbolBytes || table.size % kSymbolBytes != 0 || table.size / kSymbolBytes > kMaxElfSymbols ||
        table.link >= shnum_ || table.link == symtab_ || sections_[table.link].type != kStrtab) {
      return Fail("its symbol table (section " + std::to_string(symtab_) + ") is malformed: entries of " +
                  std::to_string(table.entsize) + " bytes, " + std::to_string(table.size) +
                  " bytes, names in section " + std::to_string(table.link));
    }
    return true;
  }

  bool Symbols() {
    const Section& table = sections_[symtab_];
    const Section& names = sections_[table.link];
    const std::string_view strings = object_.substr(names.offset, names.size);
    const uint64_t count = table.size / kSymbolBytes;
    symbols_.reserve(count);
    for (uint64_t k = 0; k < count; ++k) {
      const uint64_t at = table.offset + k * kSymbolBytes;
      const uint32_t name = Read<uint32_t>(object_, at);
      const uint8_t info = static_cast<uint8_t>(object_[at + 4]);
      Symbol s{{},
               static_cast<uint8_t>(info >> 4),
               static_cast<uint8_t>(info & 0xf),
               Read<uint16_t>(object_, at + 6),
               Read<uint64_t>(object_, at + 8),
               Read<uint64_t>(object_, at + 16)};
      const size_t end = name < strings.size() ? strings.find('\0', name) : std::string_view::npos;
      if (end == std::string_view::npos) {
        return Fail("symbol " + std::to_string(k) + "'s name is not a string within its string table");
      }
      s.name = strings.substr(name, end - name);
      if (s.section != kUndef && s.section != kAbs && s.section != kCommon) {
        if (s.section >= kLoReserve || s.section >= shnum_) {
          return Fail("symbol '" + Label(s.name) + "' is in section " + std::to_string(s.section) +
                      ", which the object does not have");
        }
        if (!Within(s.value, s.size, sections_[s.section].size)) {
          return Fail("symbol '" + Label(s.name) + "' (" + std::to_string(s.size) + " bytes at " +
                      std::to_string(s.value) + ") is not within its section");
        }
      }
      if (!s.name.empty() && s.bind == kGlobal && s.section != kUndef && !by_name_.emplace(s.name, k).second) {
        return Fail("symbol '" + Label(s.name) + "' is defined twice");
      }
      symbols_.push_back(s);
    }
    return true;
  }

  bool Relocations() {
    for (uint32_t i = 0; i < shnum_; ++i) {
      const Section& s = sections_[i];
      if (s.type != kRela) continue;
      if (s.entsize != kRelaBytes || s.size % kRelaBytes != 0 || s.link != symtab_ || s.info == 0 || s.info >= shnum_) {
        return Fail("relocation section " + std::to_string(i) + " is malformed (entries of " +
                    std::to_string(s.entsize) + " bytes, symbols of section " + std::to_string(s.link) +
                    ", for section " + std::to_string(s.info) + ")");
      }
      const uint64_t target = sections_[s.info].size;
      for (uint64_t at = s.offset; at < s.offset + s.size; at += kRelaBytes) {
        const uint64_t offset = Read<uint64_t>(object_, at), info = Read<uint64_t>(object_, at + 8);
        if (offset >= target || (info >> 32) >= symbols_.size()) {
          return Fail("a relocation of section " + std::to_string(s.info) + " (at " + std::to_string(offset) +
                      ", symbol " + std::to_string(info >> 32) + ") is not within it or its symbol table");
        }
      }
    }
    return true;
  }

  // The defined symbol `name` of `type`, in a section whose flags include `flags`; nullptr after Fail.
  const Symbol* Entry(const std::string& name, uint8_t type, uint64_t flags) {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) {
      Fail("it does not define '" + Label(name) + "', which NVIDIA's runtime looks up (without it the runtime aborts " +
           "the process)");
      return nullptr;
    }
    const Symbol& s = symbols_[it->second];
    if (s.type != type || s.section == kAbs || s.section == kCommon || s.size == 0 ||
        (sections_[s.section].flags & flags) != flags || (type == kObject && sections_[s.section].type != kProgbits)) {
      Fail("its '" + Label(name) + "' is not a " + (type == kFunc ? "function" : "constant") + " of its code or data");
      return nullptr;
    }
    return &s;
  }

  // The NUL-terminated string the data symbol `name` holds; false after Fail.
  bool String(const std::string& name, std::string_view* out) {
    const Symbol* s = Entry(name, kObject, kAlloc);
    if (s == nullptr) return false;
    const Section& section = sections_[s->section];
    const std::string_view bytes = object_.substr(section.offset + s->value, s->size);
    const size_t end = bytes.find('\0');
    if (end == std::string_view::npos) return Fail("its '" + Label(name) + "' is not a NUL-terminated string");
    *out = bytes.substr(0, end);
    return true;
  }

  bool EntryPoints() {
    const std::string p(prefix_);
    for (const std::string& name : {"_mlir_" + p + "_cuda_init", p + "_cuda_init",
                                    "_mlir_" + p + "_cuda_load_to_device", p + "_cuda_load_to_device"}) {
      if (Entry(name, kFunc, kAlloc | kExecinstr) == nullptr) return false;
    }
    std::string_view version, host, kernels;
    if (!String(p + "_version", &version) || !String(p + "_function_name", &host) ||
        !String(p + "_kernel_info", &kernels)) {
      return false;
    }
    if (version != "1.0" && version != "1.1") {
      return Fail("its object format version is '" + Label(version.substr(0, 16)) + "'; the runtime reads 1.0 and 1.1");
    }
    const std::string host_prefix = "_mlir_" + p + "__mlir_ciface_";
    if (host.size() <= host_prefix.size() || host.substr(0, host_prefix.size()) != host_prefix) {
      return Fail("its host function's name '" + Label(host.substr(0, 256)) + "' does not start with " + host_prefix);
    }
    if (Entry(std::string(host), kFunc, kAlloc | kExecinstr) == nullptr) return false;
    if (kernels.size() > kMaxCuteKernelInfoBytes || !KernelInfo(kernels)) {
      return Fail("its kernel table " + p +
                  "_kernel_info is not what the runtime reads: a JSON object of kernel "
                  "names, each an object of attribute numbers mapped to integers");
    }
    return true;
  }

  // {"name": {"9": 50, ...}, ...}: what the runtime's reader takes (it converts each attribute with stoi, which
  // throws, aborting the process, on anything but a number of an int).
  static bool KernelInfo(std::string_view text) {
    size_t i = 0;
    auto space = [&] {
      while (i < text.size() && (text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == '\r')) ++i;
    };
    auto take = [&](char c) {
      space();
      if (i >= text.size() || text[i] != c) return false;
      ++i;
      return true;
    };
    auto name = [&](bool digits) {  // a string without escapes; of 1 to 9 digits where `digits`
      if (!take('"')) return false;
      const size_t start = i;
      while (i < text.size() && text[i] != '"') {
        const char c = text[i++];
        if (c < 0x20 || c > 0x7e || c == '\\' || (digits && (c < '0' || c > '9'))) return false;
      }
      const size_t length = i - start;
      return i < text.size() && text[i++] == '"' && length > 0 && (!digits || length <= 9);
    };
    auto integer = [&] {
      space();
      if (i < text.size() && text[i] == '-') ++i;
      const size_t start = i;
      while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
      return i > start && i - start <= 9;
    };
    auto members = [&](auto&& member) {  // '{' member (',' member)* '}', or '{' '}'
      if (!take('{')) return false;
      space();
      if (i < text.size() && text[i] == '}') return ++i, true;
      do {
        if (!member()) return false;
      } while (take(','));
      return take('}');
    };
    const bool ok = members(
        [&] { return name(false) && take(':') && members([&] { return name(true) && take(':') && integer(); }); });
    space();
    return ok && i == text.size();
  }

  std::string_view object_, prefix_;
  std::string* error_;
  uint64_t shoff_ = 0;
  uint32_t shnum_ = 0, shstrndx_ = 0, symtab_ = 0;
  std::vector<Section> sections_;
  std::vector<Symbol> symbols_;
  std::map<std::string_view, uint64_t> by_name_;
};

}  // namespace

bool CheckCuteObject(std::string_view object, std::string_view prefix, std::string* error) {
  return ObjectChecker(object, prefix, error).Check();
}

}  // namespace jmf
