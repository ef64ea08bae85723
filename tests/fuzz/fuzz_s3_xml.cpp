// libFuzzer target: S3's XML answers, as ckpt::s3 reads them (a listing's keys, prefixes and
// continuation token; an error's code and message; an upload id). A server, or anything between
// it and ckpt, can send any bytes; reading them must never crash or read out of bounds.

#include <ckpt/s3/xml.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace d = ckpt::detail;
  const std::string_view doc(reinterpret_cast<const char*>(data), size);
  std::size_t total = 0;
  for (auto block : d::xml_blocks(doc, "Contents")) total += d::xml_text(block, "Key").value_or("").size();
  for (auto block : d::xml_blocks(doc, "CommonPrefixes")) total += d::xml_text(block, "Prefix").value_or("").size();
  for (const char* tag : {"IsTruncated", "NextContinuationToken", "Code", "Message", "UploadId", "ETag"})
    total += d::xml_text(doc, tag).value_or("").size();
  total += d::xml_escape(d::xml_unescape(doc)).size();
  return total == static_cast<std::size_t>(-1);  // keep the work observable
}
