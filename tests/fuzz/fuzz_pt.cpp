// libFuzzer target: a whole .pt file (interop/torch.hpp: zip reader, unpickler, tensor views)
// from arbitrary bytes, written to a file first as load_torch reads files. Refusals are
// ckpt::errors; nothing may crash, read past the file or allocate more than it holds.

#include <ckpt/interop/torch.hpp>

#include "input_file.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = ckpt_fuzz::write_input(data, size);
  ckpt::interop::torch_load_options options{.limits = {.max_depth = 200, .max_objects = 1 << 16, .max_result_bytes = 1 << 24, .max_rank = 64},
                                             .max_pickle_bytes = 1 << 20};
  try {
    (void)ckpt::interop::load_torch(path, options);
  } catch (const ckpt::error&) {
  }
  // As ckpt import reads: the tree without the tensors' bytes, then each tensor from the file
  // in pieces, in order (the CRC-32 checked at the end) and out of order (checked whole first).
  try {
    options.read_tensors = false;
    auto root = ckpt::interop::load_torch(path, options);
    ckpt::interop::torch_tensor_source src(path);
    std::vector<std::byte> piece;
    std::string where;
    ckpt::interop::detail::for_each_tensor(root, where, 0, [&](ckpt::interop::py_tensor& t, const std::string&) {
      if (!t.value.data.empty() || t.value.numel() == 0) return;  // read by load_torch itself
      const std::uint64_t n = t.value.numel() * ckpt::size_of(t.value.type), half = n / 2;
      if (n > (std::uint64_t{1} << 24)) return;
      piece.resize(static_cast<std::size_t>(n));
      const std::span<std::byte> all(piece);
      src.read(t, 0, all.first(static_cast<std::size_t>(half)));
      src.read(t, half, all.subspan(static_cast<std::size_t>(half)));
      if (half > 0) src.read(t, half, all.subspan(static_cast<std::size_t>(half)));  // out of order
    });
  } catch (const ckpt::error&) {
  }
  return 0;
}
