// libFuzzer target: a safetensors file (interop/safetensors.hpp) from arbitrary bytes: the
// header is validated in full, then every tensor it lists is read. Refusals are ckpt::errors;
// nothing may crash, read past the file or allocate more than the file holds.

#include <ckpt/interop/safetensors.hpp>

#include "input_file.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = ckpt_fuzz::write_input(data, size);
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
