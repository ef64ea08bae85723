#pragma once
// The definitions of tensor.hpp's shape helpers.
// Header-only builds include this at the end of tensor.hpp; CKPT_SEPARATE_COMPILATION builds
// compile it once, in the translation unit that includes ckpt/impl/src.hpp.


namespace ckpt::detail {

CKPT_DECL std::string negative_entry(std::span<const std::uint64_t> dims) {
  for (std::size_t i = 0; i < dims.size(); ++i)
    if (dims[i] >= first_negative) return "dimension " + std::to_string(i) + " is " + std::to_string(static_cast<std::int64_t>(dims[i]));
  return {};
}

CKPT_DECL std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, const std::string& what) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a)
    throw error(error_kind::invalid_argument, what + ": element count overflows 64 bits");
  return a * b;
}

CKPT_DECL std::uint64_t element_count(std::span<const std::uint64_t> shape, const std::string& what) {
  std::uint64_t n = 1;
  for (auto e : shape) n = checked_mul(n, e, what);
  return n;
}

CKPT_DECL std::string to_string(std::span<const std::uint64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace ckpt::detail
