// libFuzzer target: the shard file's footer index and trailer, as the commit parses every
// rank's index and a reader checks a shard file's last 40 bytes. Any input must give either a
// parsed index or a ckpt::error; never a crash, an out-of-bounds read or a huge allocation.

#include <ckpt/detail/coverage.hpp>
#include <ckpt/detail/format.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace d = ckpt::detail;
  const auto bytes = std::as_bytes(std::span(data, size));
  try {
    const auto idx = d::decode_index(bytes, "fuzz/model_optim_rng.ckpt");
    // What the commit does next with every table: check it tiles its tensor.
    for (const auto& g : idx.tensors) {
      static const std::string file = "fuzz/model_optim_rng.ckpt";
      d::check_tiling(g.name, g.global_shape, g.chunks, [](std::size_t) -> const std::string& { return file; },
                      ckpt::error_kind::corrupt, "");
    }
  } catch (const ckpt::error&) {
  }
  if (size >= d::trailer_bytes) try {
      (void)d::check_trailer(std::span<const std::byte, d::trailer_bytes>(bytes.data() + size - d::trailer_bytes, d::trailer_bytes),
                             size, "fuzz/model_optim_rng.ckpt");
    } catch (const ckpt::error&) {
    }
  if (size >= d::header_used) try {
      d::check_header(std::span<const std::byte, d::header_used>(bytes.data(), d::header_used), "fuzz/model_optim_rng.ckpt");
    } catch (const ckpt::error&) {
    }
  return 0;
}
