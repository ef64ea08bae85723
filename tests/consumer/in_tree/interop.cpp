// Links ckpt::interop, the optional target for <ckpt/interop/...>: writes a safetensors file
// and reads it back.
#include <ckpt/interop/safetensors.hpp>

#include <cstdio>
#include <span>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string file = std::string(argv[1]) + "/m.safetensors";
  std::vector<float> w{1.5f, -2.0f, 3.25f};
  const auto bytes = std::as_bytes(std::span(w));
  ckpt::interop::safetensors_writer out(file, {{"w", ckpt::dtype::f32, {3}}}, {{"format", "pt"}});
  out.write("w", bytes);
  out.finish();
  const auto back = ckpt::interop::safetensors_file(file).read("w");
  if (back.data != std::vector<std::byte>(bytes.begin(), bytes.end())) {
    std::fprintf(stderr, "consumer_interop: the tensor came back different\n");
    return 1;
  }
  std::puts("consumer_interop: ok");
  return 0;
}
