#pragma once
// The digests S3 requests carry: MD5 (Content-MD5, base64; compared with the ETag, hex) and
// SHA-256 (x-amz-content-sha256, hex), from OpenSSL's libcrypto.

#include <openssl/evp.h>

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "../error.hpp"

namespace ckpt::detail {

template <std::size_t N>
using digest_bytes = std::array<unsigned char, N>;

template <std::size_t N>
digest_bytes<N> evp_digest(const EVP_MD* md, std::span<const std::byte> data) {
  digest_bytes<N> out{};
  unsigned len = 0;
  if (EVP_Digest(data.data(), data.size(), out.data(), &len, md, nullptr) != 1 || len != N)
    throw error(error_kind::io, "OpenSSL could not compute a digest");
  return out;
}

inline digest_bytes<16> md5(std::span<const std::byte> data) { return evp_digest<16>(EVP_md5(), data); }
inline digest_bytes<32> sha256(std::span<const std::byte> data) { return evp_digest<32>(EVP_sha256(), data); }

template <std::size_t N>
std::string to_hex(const digest_bytes<N>& d) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  for (auto b : d) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

template <std::size_t N>
std::string to_base64(const digest_bytes<N>& d) {
  static constexpr char table[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string s;
  for (std::size_t i = 0; i < N; i += 3) {
    const unsigned v = (unsigned{d[i]} << 16) | ((i + 1 < N ? unsigned{d[i + 1]} : 0u) << 8) | (i + 2 < N ? unsigned{d[i + 2]} : 0u);
    s += table[(v >> 18) & 63];
    s += table[(v >> 12) & 63];
    s += i + 1 < N ? table[(v >> 6) & 63] : '=';
    s += i + 2 < N ? table[v & 63] : '=';
  }
  return s;
}

/// The SHA-256 of an empty body, which every body-less request signs.
inline constexpr std::string_view empty_sha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

}  // namespace ckpt::detail
