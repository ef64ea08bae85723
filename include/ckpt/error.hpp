#pragma once
/// @file error.hpp
/// The one exception type ckpt throws.

#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ckpt {

/// What went wrong, coarsely enough to decide what to do about it.
enum class error_kind {
  io,                ///< the operating system or the object store refused an operation
  corrupt,           ///< stored bytes are not what ckpt wrote (checksum, truncation, bad format)
  mismatch,          ///< the checkpoint is sound but does not fit the live state (shape, dtype, config)
  not_found,         ///< the tag, file or tensor asked for does not exist
  invalid_argument,  ///< the caller passed something ckpt cannot accept (bad name, bad option)
  communication,     ///< a collective operation between ranks failed
  busy,              ///< another process (or checkpointer) is saving to the same root
};

/// Name of an error kind as it appears in messages ("corrupt", "io", ...).
constexpr std::string_view to_string(error_kind k) noexcept {
  switch (k) {
    case error_kind::io: return "io";
    case error_kind::corrupt: return "corrupt";
    case error_kind::mismatch: return "mismatch";
    case error_kind::not_found: return "not_found";
    case error_kind::invalid_argument: return "invalid_argument";
    case error_kind::communication: return "communication";
    case error_kind::busy: return "busy";
  }
  return "unknown";
}

/// Every failure in ckpt is a `ckpt::error`. The message names the file, the tensor and the
/// values involved; `kind()` says which class of failure it is.
///
/// @code
/// try {
///   cp.load(state);
/// } catch (const ckpt::error& e) {
///   if (e.kind() == ckpt::error_kind::not_found) start_from_scratch();
///   else throw;
/// }
/// @endcode
class error : public std::runtime_error {
 public:
  error(error_kind kind, const std::string& message)
      : std::runtime_error(message), kind_(kind) {}

  /// The class of failure.
  error_kind kind() const noexcept { return kind_; }

 private:
  error_kind kind_;
};

namespace detail {
/// The `io` error for a failed system call: "`op` `path`: strerror(`err`)".
inline error posix_error(const std::string& op, const std::string& path, int err) {
  return error(error_kind::io, op + " " + path + ": " + std::strerror(err));
}
}  // namespace detail

}  // namespace ckpt
