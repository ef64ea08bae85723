#pragma once
// Storage keys are '/'-separated paths relative to a storage root. Every Storage checks them
// here, so no key can climb out of the root or smuggle a control character into a path.

#include <string>
#include <string_view>

#include "../error.hpp"
#include "../names.hpp"

namespace ckpt::detail {

inline void check_key(std::string_view key, bool allow_empty = false) {
  auto bad = [&](const char* why) {
    throw error(error_kind::invalid_argument, "invalid storage key " + printable(key) + ": " + why);
  };
  if (key.empty()) {
    if (allow_empty) return;
    bad("is empty");
  }
  if (key.size() > 4096) bad("is too long");
  if (key.front() == '/') bad("is absolute");
  std::size_t start = 0;
  while (start <= key.size()) {
    auto end = key.find('/', start);
    if (end == std::string_view::npos) end = key.size();
    const auto seg = key.substr(start, end - start);
    if (seg.empty()) bad("has an empty path segment");
    if (seg == "." || seg == "..") bad("has a '.' or '..' segment");
    start = end + 1;
  }
  for (char ch : key) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f || c == '\\') bad("contains a control character or backslash");
  }
}

/// "a/b" + "c" -> "a/b/c"; "" + "c" -> "c".
inline std::string join_key(std::string_view a, std::string_view b) {
  if (a.empty()) return std::string(b);
  std::string k(a);
  k += '/';
  k += b;
  return k;
}

}  // namespace ckpt::detail
