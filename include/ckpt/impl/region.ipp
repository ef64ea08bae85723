#pragma once
// The definitions of detail/region.hpp: how a tensor is cut into chunks.
// Header-only builds include this at the end of detail/region.hpp; CKPT_SEPARATE_COMPILATION builds
// compile it once, in the translation unit that includes ckpt/impl/src.hpp.


namespace ckpt::detail {

CKPT_DECL std::vector<chunk_slice> split_into_chunks(const shape_t& shape, std::uint64_t elem, std::uint64_t target) {
  const std::size_t n = shape.size();
  std::uint64_t total = elem;
  for (auto e : shape) total *= e;  // overflow was ruled out when the tensor_ref was made
  if (n == 0 || total == 0 || total <= target) return {{shape_t(n, 0), shape, 0, total}};
  shape_t step(n);  // bytes of one index step along each dimension
  step[n - 1] = elem;
  for (std::size_t d = n - 1; d > 0; --d) step[d - 1] = step[d] * shape[d];
  std::size_t split = 0;
  while (split + 1 < n && step[split] > target) ++split;
  const std::uint64_t per = std::max<std::uint64_t>(1, target / step[split]);
  std::vector<chunk_slice> out;
  shape_t outer(split, 0);
  for (;;) {
    for (std::uint64_t i = 0; i < shape[split]; i += per) {
      chunk_slice c;
      c.offset = shape_t(n, 0);
      c.shape = shape;
      for (std::size_t d = 0; d < split; ++d) {
        c.offset[d] = outer[d];
        c.shape[d] = 1;
      }
      c.offset[split] = i;
      c.shape[split] = std::min(per, shape[split] - i);
      c.byte_offset = 0;
      for (std::size_t d = 0; d <= split; ++d) c.byte_offset += c.offset[d] * step[d];
      c.bytes = c.shape[split] * step[split];
      out.push_back(std::move(c));
    }
    std::size_t d = split;
    while (d > 0) {
      --d;
      if (++outer[d] < shape[d]) break;
      outer[d] = 0;
      if (d == 0) return out;
    }
    if (split == 0) return out;
  }
}

}  // namespace ckpt::detail
