#pragma once
// The definitions of detail/save_plan.hpp: the checks every saved tensor passes.
// Header-only builds include this at the end of detail/save_plan.hpp; CKPT_SEPARATE_COMPILATION builds
// compile it once, in the translation unit that includes ckpt/impl/src.hpp.


namespace ckpt::detail {

CKPT_DECL void check_tensor(const std::string& name, const tensor_ref& t) {
  if (t.data() == nullptr && t.nbytes() != 0)
    throw error(error_kind::invalid_argument, "tensor " + printable(name) + " has no data pointer");
  if (t.shape().size() > max_dims)
    throw error(error_kind::invalid_argument, "tensor " + printable(name) + " has more than 64 dimensions");
  if (const auto& s = t.shard(); s && !s->replicated) {
    const auto n = t.shape().size();
    if (s->global_shape.size() != n || s->offset.size() != n)
      throw error(error_kind::invalid_argument, "tensor " + printable(name) + ": shard spec has " +
                                                    std::to_string(s->global_shape.size()) + "-d global shape and " +
                                                    std::to_string(s->offset.size()) + "-d offset for a " + std::to_string(n) +
                                                    "-d tensor");
    if (!checked_size(s->global_shape))
      throw error(error_kind::invalid_argument, "tensor " + std::string(name) + ": element count overflows 64 bits");
    for (std::size_t d = 0; d < n; ++d)
      if (s->offset[d] > s->global_shape[d] || t.shape()[d] > s->global_shape[d] - s->offset[d])
        throw error(error_kind::invalid_argument, "tensor " + printable(name) + ": local shape " + to_string(t.shape()) +
                                                      " at offset " + to_string(s->offset) + " exceeds the global shape " +
                                                      to_string(s->global_shape));
  }
}

}  // namespace ckpt::detail
