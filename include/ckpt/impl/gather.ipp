#pragma once
// The definitions of detail/gather.hpp: what rank 0 unpacks of another rank's gathered state.
// Header-only builds include this at the end of detail/gather.hpp; CKPT_SEPARATE_COMPILATION builds
// compile it once, in the translation unit that includes ckpt/impl/src.hpp.


namespace ckpt::detail {

CKPT_DECL void unpack_at_root(std::span<const std::byte> bytes, int from, gathered& into, bool with_bytes) {
  const std::string where = "the tensors sent by rank " + std::to_string(from);
  bounded_reader r(bytes, where, error_kind::communication);
  const auto n = r.count(16, "tensor");
  for (std::uint64_t i = 0; i < n; ++i) {
    auto name = r.string();
    const auto dt_id = r.u8();
    const auto dt = dtype_from_id(dt_id & 0x7fu);
    if (!dt) r.fail("unknown dtype id " + std::to_string(static_cast<unsigned>(dt_id)) + " of tensor " + printable(name));
    auto shape = r.shape();
    auto global = r.shape();
    auto offset = r.shape();
    std::uint64_t size;
    std::byte* data = nullptr;
    if (with_bytes) {
      size = r.count(1, "tensor byte");
      auto& b = into.buffers.emplace_back(size);
      r.copy(b.data(), size);
      data = b.data();
    } else {
      size = r.u64();
      const auto what = where + ", tensor " + printable(name);
      if (checked_mul(element_count(shape, what), size_of(*dt), what) != size) r.fail("tensor size does not match its shape");
    }
    tensor_ref ref(*dt, std::move(shape), data);
    if (ref.nbytes() != size) r.fail("tensor size does not match its shape");
    ref.sharded(shard_spec{.global_shape = std::move(global), .offset = std::move(offset)});
    ref.laid_out(layout_of_byte(dt_id));
    into.tensors.push_back({std::move(name), std::move(ref)});
    into.from.push_back(from);
  }
  const auto m = r.count(12, "value");
  for (std::uint64_t i = 0; i < m; ++i) {
    stored_value v;
    v.name = r.string();
    v.rank = r.u32();
    v.bytes.resize(r.count(1, "value byte"));
    r.copy(v.bytes.data(), v.bytes.size());
    into.values.push_back(std::move(v));
  }
  if (r.remaining() != 0) r.fail("stray bytes at its end");
}

}  // namespace ckpt::detail
