#pragma once
// Layer numbers in Megatron-style tensor names, shared by reshard (which stage a layer goes
// to), import (making a pipeline stage's layer numbers global) and export (back again).

#include <cctype>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace ckpt_tool {

/// Where the layer number of a name sits ("...layers.12.attn..." gives the span of "12"): the
/// first "layers.N" segment whose N is all digits and ends the name or a segment.
inline std::optional<std::pair<std::size_t, std::size_t>> layer_digits(const std::string& name) {
  for (std::size_t at = name.find("layers."); at != std::string::npos; at = name.find("layers.", at + 1)) {
    if (at != 0 && name[at - 1] != '.') continue;
    std::size_t i = at + 7, j = i;
    while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
    if (j > i && j - i < 10 && (j == name.size() || name[j] == '.')) return std::pair{i, j};
  }
  return std::nullopt;
}

/// The layer number in a name ("...layers.12.attn..." gives 12), if any.
inline std::optional<std::uint64_t> layer_of(const std::string& name) {
  const auto d = layer_digits(name);
  if (!d) return std::nullopt;
  return std::stoull(name.substr(d->first, d->second - d->first));
}

/// The name with its layer number moved by `delta` (pipeline stages number layers from 0);
/// unchanged when it has none, or when the move would go below 0.
inline std::string shift_layer(const std::string& name, std::int64_t delta) {
  const auto d = layer_digits(name);
  if (!d || delta == 0) return name;
  const auto n = static_cast<std::int64_t>(std::stoull(name.substr(d->first, d->second - d->first))) + delta;
  if (n < 0) return name;
  return name.substr(0, d->first) + std::to_string(n) + name.substr(d->second);
}

}  // namespace ckpt_tool
