#pragma once
// A read-only std::streambuf over a byte span, so cereal can parse bytes ckpt already holds
// without copying them into a std::string first. Reads past the end fail; they never wrap.

#include <cstddef>
#include <span>
#include <streambuf>

namespace ckpt::detail {

class span_streambuf : public std::streambuf {
 public:
  explicit span_streambuf(std::span<const std::byte> bytes) {
    auto* b = const_cast<char*>(reinterpret_cast<const char*>(bytes.data()));
    setg(b, b, b + bytes.size());
  }
  /// Bytes not yet consumed.
  std::size_t remaining() const { return static_cast<std::size_t>(egptr() - gptr()); }
  /// The next `n` bytes, consumed without copying (n must not exceed remaining()).
  std::span<const std::byte> take(std::size_t n) {
    const auto* p = reinterpret_cast<const std::byte*>(gptr());
    gbump(static_cast<int>(n));
    return {p, n};
  }
};

}  // namespace ckpt::detail
