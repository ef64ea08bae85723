// expect: ckpt: a Codec needs `static constexpr std::uint8_t id` (user codecs: 128 and up)
// A Codec without its on-disk id.
#include <ckpt/ckpt.hpp>

#include <cstddef>
#include <span>

struct my_codec {
  std::size_t max_encoded_size(std::size_t n) const { return n; }
  std::size_t encode(std::span<const std::byte> in, ckpt::dtype, std::span<std::byte>) const { return in.size(); }
  void decode(std::span<const std::byte>, ckpt::dtype, std::span<std::byte>) const {}
};

ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage, my_codec> cp{{}, ckpt::memory_storage{}};
