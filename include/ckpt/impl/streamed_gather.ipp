#pragma once
// The definitions of detail/streamed_gather.hpp: the scatter requests ranks send rank 0.
// Header-only builds include this at the end of detail/streamed_gather.hpp; CKPT_SEPARATE_COMPILATION builds
// compile it once, in the translation unit that includes ckpt/impl/src.hpp.

#include <sstream>

namespace ckpt::detail {

CKPT_DECL std::string encode_request(const scatter_request& req) {
  std::ostringstream os(std::ios::binary);
  {
    cereal::PortableBinaryOutputArchive ar(os);
    ar(static_cast<std::uint64_t>(req.tensors.size()));
    for (const auto& t : req.tensors) {
      ar(t.stored);
      write_shape(ar, t.shape);
      write_shape(ar, t.offset);
    }
    ar(static_cast<std::uint64_t>(req.values.size()));
    for (auto v : req.values) ar(v);
  }
  return std::move(os).str();
}

CKPT_DECL scatter_request decode_request(std::span<const std::byte> bytes, int from, std::size_t stored_tensors,
                                      const std::vector<shape_t>& stored_shapes, std::size_t stored_values) {
  bounded_reader r(bytes, "the load request of rank " + std::to_string(from), error_kind::communication);
  scatter_request req;
  const auto n = r.count(12, "tensor");
  for (std::uint64_t i = 0; i < n; ++i) {
    auto& t = req.tensors.emplace_back();
    t.stored = r.u32();
    if (t.stored >= stored_tensors) r.fail("tensor index " + std::to_string(t.stored) + " out of range");
    t.shape = r.shape();
    t.offset = r.shape();
    const auto& global = stored_shapes[t.stored];
    if (t.shape.size() != global.size() || t.offset.size() != global.size()) r.fail("slice of the wrong rank");
    for (std::size_t d = 0; d < global.size(); ++d)
      if (t.offset[d] > global[d] || t.shape[d] > global[d] - t.offset[d]) r.fail("slice outside its tensor");
  }
  const auto m = r.count(4, "value");
  for (std::uint64_t i = 0; i < m; ++i) {
    req.values.push_back(r.u32());
    if (req.values.back() >= stored_values) r.fail("value index out of range");
  }
  if (r.remaining() != 0) r.fail("stray bytes at its end");
  return req;
}

}  // namespace ckpt::detail
