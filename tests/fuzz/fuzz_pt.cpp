// libFuzzer target: a whole .pt file (interop/torch.hpp: zip reader, unpickler, tensor views)
// from arbitrary bytes, written to a file first as load_torch reads files. Refusals are
// ckpt::errors; nothing may crash, read past the file or allocate more than it holds.

#include <unistd.h>

#include <ckpt/interop/torch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/tmp/ckpt-fuzz-pt-" + std::to_string(::getpid()) + ".pt";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    (void)ckpt::interop::load_torch(path, {.limits = {.max_depth = 200, .max_objects = 1 << 16, .max_result_bytes = 1 << 24, .max_rank = 64},
                                           .max_pickle_bytes = 1 << 20});
  } catch (const ckpt::error&) {
  }
  return 0;
}
