#pragma once
// XXH3-64, the checksum of every chunk, value, index and metadata file (libxxhash).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <xxhash.h>

// On x86-64, libxxhash's runtime dispatch picks the widest vector unit the CPU has (AVX2 or
// AVX-512); its plain XXH3_64bits is built for the baseline SSE2. Same hash, 3-3.5x faster on
// data in cache: 0.027 against 0.08-0.10 s per GiB on this project's machine (AVX2), which is
// most of what verifying a chunk costs on load. Debian's libxxhash (0.8.1) exports the
// dispatch functions; define CKPT_XXH3_DISPATCH=0 for a libxxhash built without them (Meson
// does so when it cannot link them).
#ifndef CKPT_XXH3_DISPATCH
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#define CKPT_XXH3_DISPATCH 1
#else
#define CKPT_XXH3_DISPATCH 0
#endif
#endif
#if CKPT_XXH3_DISPATCH
#define XXH_DISPATCH_DISABLE_REPLACE  // name the dispatch functions below; leave XXH3_* as they are
#include <xxh_x86dispatch.h>
#endif

namespace ckpt::detail {

inline std::uint64_t xxh3(const void* data, std::size_t size) noexcept {
#if CKPT_XXH3_DISPATCH
  return XXH3_64bits_dispatch(data, size);
#else
  return XXH3_64bits(data, size);
#endif
}
inline std::uint64_t xxh3(std::span<const std::byte> bytes) noexcept { return xxh3(bytes.data(), bytes.size()); }
inline std::uint64_t xxh3(std::string_view s) noexcept { return xxh3(s.data(), s.size()); }

/// Streaming XXH3-64 for data that arrives in pieces.
class xxh3_stream {
 public:
  xxh3_stream() : state_(XXH3_createState()) {
    if (!state_) throw std::bad_alloc();
    XXH3_64bits_reset(state_);
  }
  xxh3_stream(const xxh3_stream&) = delete;
  xxh3_stream& operator=(const xxh3_stream&) = delete;
  ~xxh3_stream() { XXH3_freeState(state_); }
  void update(std::span<const std::byte> b) noexcept {
#if CKPT_XXH3_DISPATCH
    XXH3_64bits_update_dispatch(state_, b.data(), b.size());
#else
    XXH3_64bits_update(state_, b.data(), b.size());
#endif
  }
  std::uint64_t digest() const noexcept { return XXH3_64bits_digest(state_); }

 private:
  XXH3_state_t* state_;
};

/// 16 lowercase hex digits, as checksums appear in metadata.json and `latest`.
inline std::string to_hex(std::uint64_t h) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) s[static_cast<std::size_t>(i)] = digits[h & 15];
  return s;
}
/// Parses exactly 16 lowercase hex digits; false on anything else.
inline bool from_hex(std::string_view s, std::uint64_t& out) noexcept {
  if (s.size() != 16) return false;
  std::uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return false;
    v = (v << 4) | static_cast<std::uint64_t>(d);
  }
  out = v;
  return true;
}

}  // namespace ckpt::detail
