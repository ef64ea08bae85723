#pragma once
// Just enough XML for S3's answers: the text of named elements, and the blocks of repeated
// elements (<Contents>, <CommonPrefixes>), with the five entities and numeric references
// decoded. S3's documents are flat and machine-written; a full parser would buy nothing.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt::detail {

/// Decodes &amp; &lt; &gt; &quot; &apos; and &#N; / &#xN; (as UTF-8). Unknown entities stay.
inline std::string xml_unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    // Entities are short: look for the ';' only nearby, so a run of bare '&' stays linear.
    const auto near = s.substr(i, 12).find(';');
    const auto semi = near == std::string_view::npos ? near : i + near;
    if (semi == std::string_view::npos) {
      out += s[i];
      continue;
    }
    const auto name = s.substr(i + 1, semi - i - 1);
    std::uint32_t cp = 0;
    bool known = true;
    if (name == "amp") cp = '&';
    else if (name == "lt") cp = '<';
    else if (name == "gt") cp = '>';
    else if (name == "quot") cp = '"';
    else if (name == "apos") cp = '\'';
    else if (name.size() > 1 && name[0] == '#') {
      const bool hex = name[1] == 'x' || name[1] == 'X';
      for (char c : name.substr(hex ? 2 : 1)) {
        const int d = c >= '0' && c <= '9' ? c - '0'
                      : hex && c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : hex && c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                    : -1;
        if (d < 0 || cp > 0x10FFFF) {
          known = false;
          break;
        }
        cp = cp * (hex ? 16 : 10) + static_cast<std::uint32_t>(d);
      }
      known = known && cp <= 0x10FFFF && name.size() > (hex ? 2u : 1u);
    } else {
      known = false;
    }
    if (!known) {
      out += s[i];
      continue;
    }
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
    i = semi;
  }
  return out;
}

/// The raw contents of every <tag ...>…</tag> in `doc`, in order (`<tag/>` gives ""). Elements
/// of the same name nested in one another do not occur in S3's answers.
inline std::vector<std::string_view> xml_blocks(std::string_view doc, std::string_view tag) {
  std::vector<std::string_view> out;
  const std::string open = "<" + std::string(tag), close = "</" + std::string(tag) + ">";
  std::size_t at = 0;
  while ((at = doc.find(open, at)) != std::string_view::npos) {
    const auto after = at + open.size();
    if (after >= doc.size()) break;
    const char c = doc[after];
    if (c != '>' && c != '/' && c != ' ' && c != '\t' && c != '\r' && c != '\n') {  // <KeyCount> is not <Key>
      at = after;
      continue;
    }
    const auto gt = doc.find('>', after);
    if (gt == std::string_view::npos) break;
    if (doc[gt - 1] == '/') {
      out.emplace_back();
      at = gt + 1;
      continue;
    }
    const auto end = doc.find(close, gt + 1);
    if (end == std::string_view::npos) break;
    out.push_back(doc.substr(gt + 1, end - gt - 1));
    at = end + close.size();
  }
  return out;
}

/// The decoded text of every <tag> in `doc`.
inline std::vector<std::string> xml_texts(std::string_view doc, std::string_view tag) {
  std::vector<std::string> out;
  for (auto b : xml_blocks(doc, tag)) out.push_back(xml_unescape(b));
  return out;
}

/// The decoded text of the first <tag> in `doc`, if any.
inline std::optional<std::string> xml_text(std::string_view doc, std::string_view tag) {
  auto b = xml_blocks(doc, tag);
  if (b.empty()) return std::nullopt;
  return xml_unescape(b.front());
}

/// Escapes text for an XML element (the keys and ETags of a CompleteMultipartUpload body).
inline std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace ckpt::detail
