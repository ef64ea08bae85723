#pragma once
// The definitions of detail/region.hpp: how a tensor is cut into chunks.
// Header-only builds include this at the end of detail/region.hpp; CKPT_SEPARATE_COMPILATION builds
// compile it once, in the translation unit that includes ckpt/impl/src.hpp.


namespace ckpt::detail {

CKPT_DECL void split_into_chunks(const shape_t& shape, std::uint64_t elem, std::uint64_t target, std::vector<chunk_slice>& out) {
  const std::size_t n = shape.size();
  std::uint64_t total = elem;
  for (auto e : shape) total *= e;  // overflow was ruled out when the tensor_ref was made
  if (n == 0 || total == 0 || total <= target) {  // one chunk: made in place (no copies of its shapes)
    auto& one = out.emplace_back();
    one.offset.assign(n, 0);
    one.shape = shape;
    one.bytes = total;
    return;
  }
  shape_t step(n);  // bytes of one index step along each dimension
  step[n - 1] = elem;
  for (std::size_t d = n - 1; d > 0; --d) step[d - 1] = step[d] * shape[d];
  std::size_t split = 0;
  while (split + 1 < n && step[split] > target) ++split;
  const std::uint64_t per = std::max<std::uint64_t>(1, target / step[split]);
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
      if (d == 0) return;
    }
    if (split == 0) return;
  }
}

CKPT_DECL std::vector<chunk_slice> split_into_chunks(const shape_t& shape, std::uint64_t elem, std::uint64_t target) {
  std::vector<chunk_slice> out;
  split_into_chunks(shape, elem, target, out);
  return out;
}

CKPT_DECL void chunks_of(const shape_t& shape, const shape_t& global_shape, std::uint64_t elem, const chunking& how,
                         std::vector<chunk_slice>& out) {
  const std::size_t n = shape.size();
  std::uint64_t total = elem;
  for (auto e : shape) total *= e;
  const auto plain = [&] { split_into_chunks(shape, elem, how.chunk_bytes, out); };
  if (how.reshard_blocks <= 1 || n == 0 || total == 0 || global_shape.size() != n) return plain();
  // The dimensions the slice is split on, among those it holds more than one index of.
  std::vector<std::size_t> dims;
  for (std::size_t d = 0; d < n; ++d)
    if (shape[d] < global_shape[d] && shape[d] > 1) dims.push_back(d);
  if (dims.empty()) return plain();
  if (!how.boxes) {
    // Blocks stay byte ranges only along the outermost dimension of more than one index.
    std::size_t outer = 0;
    while (shape[outer] <= 1) ++outer;
    if (dims.front() != outer) return plain();
    dims.resize(1);
  }
  std::vector<std::uint64_t> count(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i) count[i] = std::min<std::uint64_t>(how.reshard_blocks, shape[dims[i]]);
  for (;;) {  // fewer blocks along the dimension with the most, until a block is large enough
    std::uint64_t cells = 1;
    for (auto c : count) cells *= c;
    if (cells == 1) return plain();
    if (total / cells >= min_reshard_block_bytes) break;
    auto& most = *std::max_element(count.begin(), count.end());
    most = std::max<std::uint64_t>(1, most / 2);
  }
  std::vector<std::uint64_t> width(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i) width[i] = (shape[dims[i]] + count[i] - 1) / count[i];
  shape_t stride(n, elem);  // bytes of one index step along each dimension
  for (std::size_t d = n - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];

  std::vector<std::uint64_t> at(dims.size(), 0);  // the block's first index along each blocked dimension
  for (;;) {
    shape_t cell_offset(n, 0), cell_shape = shape;
    for (std::size_t i = 0; i < dims.size(); ++i) {
      cell_offset[dims[i]] = at[i];
      cell_shape[dims[i]] = std::min(width[i], shape[dims[i]] - at[i]);
    }
    const auto first = out.size();
    split_into_chunks(cell_shape, elem, how.chunk_bytes, out);
    for (auto k = first; k < out.size(); ++k) {
      auto& c = out[k];
      for (std::size_t d = 0; d < n; ++d) c.offset[d] += cell_offset[d];
      c.byte_offset = 0;
      for (std::size_t d = 0; d < n; ++d) c.byte_offset += c.offset[d] * stride[d];
      c.contiguous = box_is_contiguous(c.shape, shape);
    }
    std::size_t i = dims.size();
    for (;;) {
      if (i == 0) return;
      --i;
      at[i] += width[i];
      if (at[i] < shape[dims[i]]) break;
      at[i] = 0;
    }
  }
}

CKPT_DECL std::vector<chunk_slice> chunks_of(const shape_t& shape, const shape_t& global_shape, std::uint64_t elem,
                                             const chunking& how) {
  std::vector<chunk_slice> out;
  chunks_of(shape, global_shape, elem, how, out);
  return out;
}

}  // namespace ckpt::detail
