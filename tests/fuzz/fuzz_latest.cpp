// libFuzzer target: the `latest` file. The input is read as it is, and also as a tag line
// given its true checksum, so the fuzzer gets past the checksum to the tag checks.

#include <ckpt/detail/hash.hpp>
#include <ckpt/detail/metadata.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace d = ckpt::detail;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  try {
    (void)d::decode_latest(in, "fuzz/latest");
  } catch (const ckpt::error&) {
  }
  std::string with_checksum(in.substr(0, in.find('\n')));
  with_checksum += '\n';
  with_checksum += d::to_hex(d::xxh3(std::string_view(with_checksum).substr(0, with_checksum.size() - 1)));
  with_checksum += '\n';
  try {
    (void)d::decode_latest(with_checksum, "fuzz/latest");
  } catch (const ckpt::error&) {
  }
  return 0;
}
