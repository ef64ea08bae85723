// libFuzzer target: metadata.json and chunk_map.bin, read as a load reads them. The input is
// the JSON document, then a NUL byte, then the chunk map. Checksums would stop almost every
// mutation at the door, so the target wraps the document in a valid envelope and records the
// map's true size and checksum: the fuzzer reaches the JSON reader, the validation, the map
// decoder (both versions: a version-2 map's layouts are checked as they are decoded) and the
// tiling check, and for version 2 the walks a load makes over a layout (the chunks overlapping
// a region, the chunks of one file). The raw input also goes through the envelope check as it is.

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
    for (const auto& t : md.tensors) {
      if (!t.placement) {
        d::check_tiling(t.name, t.shape, t.chunks,
                        [&](std::size_t i) -> const std::string& { return md.files[t.chunks.file[i]].path; },
                        ckpt::error_kind::corrupt, "fuzz/metadata.json: ");
        continue;
      }
      // A load's walks: the chunks overlapping the tensor's first element, and (where the
      // file's recorded size is one a real file could have here) the chunks of file 0, which a
      // reader compares with that file's footer after checking the size.
      const ckpt::shape_t first(t.shape.size(), 0), one(t.shape.size(), 1);
      std::uint64_t seen = 0;
      d::for_each_chunk(*t.placement, t.shape, {first, one}, [&](std::uint32_t, auto, auto) { ++seen; });
      (void)seen;
      // (A reader builds them only when the footer holds as many: the fuzzer's stand-in bound.)
      if (!md.files.empty() && d::chunks_in_file_count(*t.placement, 0) <= 4096) {
        d::chunk_table in_file;
        d::chunks_in_file(*t.placement, t.shape, 0, in_file);
      }
    }
  } catch (const ckpt::error&) {
  }
  return 0;
}
