// libFuzzer target: a safetensors file (interop/safetensors.hpp) from arbitrary bytes: the
// header is validated in full, then every tensor it lists is read. Refusals are ckpt::errors;
// nothing may crash, read past the file or allocate more than the file holds.

#include <unistd.h>

#include <ckpt/interop/safetensors.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/tmp/ckpt-fuzz-st-" + std::to_string(::getpid()) + ".safetensors";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    ckpt::interop::safetensors_file st(path);
    std::vector<std::byte> buf;
    for (const auto& t : st.tensors()) {
      if (t.nbytes() > size) __builtin_trap();  // validated ranges lie inside the file
      buf.resize(t.nbytes());
      st.read(t.name, buf);
    }
  } catch (const ckpt::error&) {
  }
  return 0;
}
