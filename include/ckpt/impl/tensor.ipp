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

namespace ckpt {

CKPT_DECL tensor_ref::tensor_ref(dtype type, shape_t shape, void* data, device where)
    : type_(type), shape_(std::move(shape)), data_(static_cast<std::byte*>(data)), where_(where) {
  const auto bytes = detail::checked_size(shape_, size_of(type_));
  if (!bytes)
    throw error(error_kind::invalid_argument, "tensor of shape " + detail::to_string(shape_) + ": element count overflows 64 bits");
  bytes_ = *bytes;
}

CKPT_DECL tensor_ref tensor_ref::checked_later(dtype type, shape_t shape, std::byte* data, bool writable, device where) {
  std::string problem = detail::negative_entry(shape);
  if (problem.empty()) {
    std::uint64_t n = 1;
    for (const auto d : shape) {
      if (d != 0 && n > std::numeric_limits<std::uint64_t>::max() / d) problem = "its element count overflows 64 bits";
      n *= d;
    }
    if (problem.empty() && n > std::numeric_limits<std::uint64_t>::max() / (size_of(type) ? size_of(type) : 1))
      problem = "its size in bytes overflows 64 bits";
  }
  if (problem.empty()) {
    tensor_ref t(type, std::move(shape), static_cast<void*>(data), where);
    t.writable_ = writable;
    return t;
  }
  tensor_ref t(type, shape_t{0}, static_cast<void*>(data), where);
  t.shape_ = std::move(shape);
  t.writable_ = writable;
  t.problem_ = "shape " + detail::to_string(t.shape_) + ": " + problem;
  return t;
}

}  // namespace ckpt
