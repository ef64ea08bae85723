#pragma once
// The definitions of names.hpp: what makes a tensor, value or tag name valid.
// Header-only builds include this at the end of names.hpp; CKPT_SEPARATE_COMPILATION builds
// compile it once, in the translation unit that includes ckpt/impl/src.hpp.


namespace ckpt {

namespace detail {
/// Whether `name` is valid in the way nearly every name is: printable ASCII, no path separator,
/// no empty segment, checked in one pass. A save or load of 100,000 tensors checks every name;
/// the checks below took five passes over each. False says only "look closer".
inline bool plainly_valid_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > max_name_length || name.front() == '.' || name.back() == '.') return false;
  char prev = 0;
  for (const char ch : name) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c >= 0x7f || c == '/' || c == '\\' || (c == '.' && prev == '.')) return false;
    prev = ch;
  }
  return !name.starts_with("__ckpt");
}
}  // namespace detail

CKPT_DECL std::string name_problem(std::string_view name) {
  if (detail::plainly_valid_name(name)) return {};
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

CKPT_DECL void validate_name(std::string_view name) {
  if (auto p = name_problem(name); !p.empty())
    throw error(error_kind::invalid_argument, "invalid name " + detail::printable(name) + ": " + p);
}

CKPT_DECL std::string tag_problem(std::string_view tag) {
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

CKPT_DECL void validate_tag(std::string_view tag) {
  if (auto p = tag_problem(tag); !p.empty())
    throw error(error_kind::invalid_argument, "invalid tag " + detail::printable(tag) + ": " + p);
}

}  // namespace ckpt
