#pragma once
/// @file names.hpp
/// The rules for tensor names and tags. Names end up in metadata and messages, tags end up in
/// paths and object keys, so both are checked before anything touches storage.

#include <cstdint>
#include <string>
#include <string_view>

#include "error.hpp"

namespace ckpt {

/// Longest tensor or value name accepted, in bytes.
inline constexpr std::size_t max_name_length = 4096;
/// Longest tag accepted, in bytes (a tag is one path component).
inline constexpr std::size_t max_tag_length = 200;

namespace detail {
/// A printable rendering of a user-supplied string for error messages: control bytes are
/// escaped and very long strings shortened, so a hostile name cannot flood or garble a log.
inline std::string printable(std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out = "'";
  const std::size_t shown = s.size() > 120 ? 120 : s.size();
  for (std::size_t i = 0; i < shown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || c == '\'' || c == '\\') {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (shown < s.size()) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out + "'";
}
}  // namespace detail

namespace detail {
/// True when `s` is well-formed UTF-8 (no overlong forms, no surrogates, nothing past U+10FFFF).
inline bool valid_utf8(std::string_view s) noexcept {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n;
    std::uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xe0) == 0xc0) { n = 1; cp = c & 0x1f; }
    else if ((c & 0xf0) == 0xe0) { n = 2; cp = c & 0x0f; }
    else if ((c & 0xf8) == 0xf0) { n = 3; cp = c & 0x07; }
    else return false;
    for (std::size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += n + 1;
  }
  return true;
}
}  // namespace detail

/// Why `name` is not a valid tensor or value name, or an empty string when it is.
///
/// Names are hierarchical, segments joined by '.': `layers.3.attn.qkv.weight`. No segment may
/// be empty (so no leading, trailing or doubled dot, which also rules out ".."), and no byte may
/// be '/', '\\', a control character or DEL, and the name must be UTF-8 (it is written into
/// metadata.json). Names starting with "__ckpt" are reserved.
inline std::string name_problem(std::string_view name) {
  if (name.empty()) return "is empty";
  if (name.size() > max_name_length)
    return "is " + std::to_string(name.size()) + " bytes long (the limit is " + std::to_string(max_name_length) + ")";
  if (name.front() == '.' || name.back() == '.') return "starts or ends with '.'";
  if (name.find("..") != std::string_view::npos) return "has an empty segment ('..')";
  for (char ch : name) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) return "contains a control character";
    if (c == '/' || c == '\\') return "contains a path separator";
  }
  if (!detail::valid_utf8(name)) return "is not valid UTF-8";
  if (name.starts_with("__ckpt")) return "starts with the reserved prefix '__ckpt'";
  return {};
}

/// Throws `invalid_argument` naming the problem when `name` is not a valid name.
inline void validate_name(std::string_view name) {
  if (auto p = name_problem(name); !p.empty())
    throw error(error_kind::invalid_argument, "invalid name " + detail::printable(name) + ": " + p);
}

/// Why `tag` is not a valid tag, or an empty string when it is.
///
/// A tag names one directory (or key prefix) under the checkpoint root, so it is restricted to
/// `[A-Za-z0-9_.-]`, must not start with '.', and must not be "latest".
inline std::string tag_problem(std::string_view tag) {
  if (tag.empty()) return "is empty";
  if (tag.size() > max_tag_length)
    return "is " + std::to_string(tag.size()) + " bytes long (the limit is " + std::to_string(max_tag_length) + ")";
  if (tag.front() == '.') return "starts with '.'";
  if (tag == "latest") return "is reserved";
  for (char c : tag) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '-' || c == '.';
    if (!ok) return "may only contain letters, digits, '_', '-' and '.'";
  }
  return {};
}

/// Throws `invalid_argument` naming the problem when `tag` is not a valid tag.
inline void validate_tag(std::string_view tag) {
  if (auto p = tag_problem(tag); !p.empty())
    throw error(error_kind::invalid_argument, "invalid tag " + detail::printable(tag) + ": " + p);
}

/// The default tag of an iteration: "global_step{N}", as GPT-NeoX and DeepSpeed name them.
inline std::string default_tag(std::uint64_t iteration) { return "global_step" + std::to_string(iteration); }

}  // namespace ckpt
