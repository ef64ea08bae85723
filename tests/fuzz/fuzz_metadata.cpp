// libFuzzer target: metadata.json and chunk_map.bin, read as a load reads them. The input is
// the JSON document, then a NUL byte, then the chunk map. Checksums would stop almost every
// mutation at the door, so the target wraps the document in a valid envelope and records the
// map's true size and checksum: the fuzzer reaches the JSON reader, the validation, the map
// decoder and the tiling check. The raw input also goes through the envelope check as it is.

#include <ckpt/detail/coverage.hpp>
#include <ckpt/detail/hash.hpp>
#include <ckpt/detail/metadata.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace d = ckpt::detail;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  try {
    (void)d::decode_metadata(in, "fuzz/metadata.json");
  } catch (const ckpt::error&) {
  }
  const auto nul = in.find('\0');
  const auto doc = in.substr(0, nul);
  const auto map = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
  std::string text(d::envelope_head);
  text += d::to_hex(d::xxh3(doc));
  text += d::envelope_mid;
  text += doc;
  text += d::envelope_tail;
  try {
    auto md = d::decode_metadata(text, "fuzz/metadata.json");
    md.chunk_map.size = map.size();
    md.chunk_map.xxh3 = d::xxh3(map);
    d::decode_chunk_map(std::as_bytes(std::span(map.data(), map.size())), md, "fuzz/chunk_map.bin");
    d::validate_metadata(md, md.tag, "fuzz/metadata.json");
    for (const auto& t : md.tensors)
      d::check_tiling(t.name, t.shape, t.chunks, [&](std::size_t i) -> const std::string& { return md.files[t.chunks.file[i]].path; },
                      ckpt::error_kind::corrupt, "fuzz/metadata.json: ");
  } catch (const ckpt::error&) {
  }
  return 0;
}
