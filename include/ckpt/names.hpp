#pragma once
/// @file names.hpp
/// The rules for tensor names and tags. Names end up in metadata and messages, tags end up in
/// paths and object keys, so both are checked before anything touches storage.

#include <cstdint>
#include <string>
#include <string_view>

#include "error.hpp"

#include "impl/decl.hpp"

namespace ckpt {

/// Longest tensor or value name accepted, in bytes.
inline constexpr std::size_t max_name_length = 4096;
/// Longest tag accepted, in bytes (a tag is one path component).
inline constexpr std::size_t max_tag_length = 200;

namespace detail {
/// A printable rendering of a user-supplied string for error messages: control bytes are
/// escaped and very long strings shortened, so a hostile name cannot flood or garble a log.
CKPT_DECL std::string printable(std::string_view s);
}  // namespace detail

namespace detail {
/// True when `s` is well-formed UTF-8 (no overlong forms, no surrogates, nothing past U+10FFFF).
CKPT_DECL bool valid_utf8(std::string_view s) noexcept;
}  // namespace detail

/// Why `name` is not a valid tensor or value name, or an empty string when it is.
///
/// Names are hierarchical, segments joined by '.': `layers.3.attn.qkv.weight`. No segment may
/// be empty (so no leading, trailing or doubled dot, which also rules out ".."), and no byte may
/// be '/', '\\', a control character or DEL, and the name must be UTF-8 (it is written into
/// metadata.json). Names starting with "__ckpt" are reserved.
CKPT_DECL std::string name_problem(std::string_view name);

/// Throws `invalid_argument` naming the problem when `name` is not a valid name.
CKPT_DECL void validate_name(std::string_view name);

/// Why `tag` is not a valid tag, or an empty string when it is.
///
/// A tag names one directory (or key prefix) under the checkpoint root, so it is restricted to
/// `[A-Za-z0-9_.-]`, must not start with '.', and must not be "latest".
CKPT_DECL std::string tag_problem(std::string_view tag);

/// Throws `invalid_argument` naming the problem when `tag` is not a valid tag.
CKPT_DECL void validate_tag(std::string_view tag);

/// The default tag of an iteration: "global_step{N}", as GPT-NeoX and DeepSpeed name them.
inline std::string default_tag(std::uint64_t iteration) { return "global_step" + std::to_string(iteration); }

}  // namespace ckpt

#if !defined(CKPT_SEPARATE_COMPILATION)
#include "impl/names_detail.ipp"
#endif

#if !defined(CKPT_SEPARATE_COMPILATION)
#include "impl/names.ipp"
#endif
