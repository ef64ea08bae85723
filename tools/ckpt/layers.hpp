#pragma once
// Layer numbers in Megatron-style tensor names, shared by reshard (which stage a layer goes
// to) and import (renumbering the layers of a pipeline stage).

#include <cctype>
#include <cstdint>
#include <optional>
#include <string>

namespace ckpt_tool {

/// The layer number in a name ("...layers.12.attn..." gives 12), if any.
inline std::optional<std::uint64_t> layer_of(const std::string& name) {
  for (std::size_t at = name.find("layers."); at != std::string::npos; at = name.find("layers.", at + 1)) {
    if (at != 0 && name[at - 1] != '.') continue;
    std::size_t i = at + 7, j = i;
    while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
    if (j > i && j - i < 10 && (j == name.size() || name[j] == '.')) return std::stoull(name.substr(i, j - i));
  }
  return std::nullopt;
}

/// The name with its layer number moved up by `first` (pipeline stages number layers from 0).
inline std::string renumber_layer(const std::string& name, std::uint64_t first) {
  if (first == 0) return name;
  for (std::size_t at = name.find("layers."); at != std::string::npos; at = name.find("layers.", at + 1)) {
    if (at != 0 && name[at - 1] != '.') continue;
    std::size_t i = at + 7, j = i;
    while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
    if (j > i && j - i < 10 && (j == name.size() || name[j] == '.'))
      return name.substr(0, i) + std::to_string(std::stoull(name.substr(i, j - i)) + first) + name.substr(j);
  }
  return name;
}

/// The name with its layer number moved down by `first` (back to a stage's own numbering).
inline std::string renumber_layer_down(const std::string& name, std::uint64_t first) {
  const auto L = layer_of(name);
  if (!L || *L < first || first == 0) return name;
  for (std::size_t at = name.find("layers."); at != std::string::npos; at = name.find("layers.", at + 1)) {
    if (at != 0 && name[at - 1] != '.') continue;
    std::size_t i = at + 7, j = i;
    while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
    if (j > i && j - i < 10 && (j == name.size() || name[j] == '.'))
      return name.substr(0, i) + std::to_string(std::stoull(name.substr(i, j - i)) - first) + name.substr(j);
  }
  return name;
}

}  // namespace ckpt_tool
