#pragma once
// The names a visit has recorded, so that one recorded twice is refused. A model of 100,000
// tensors is visited at every save and every load; a std::unordered_set<std::string> spent two
// allocations per name there (its node and its own copy of the name) and as many frees. Here
// the names' bytes follow one another in one buffer and an open-addressing table holds their
// positions: a name costs no allocation of its own.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "../error.hpp"
#include "table_memory.hpp"

namespace ckpt::detail {

class name_set {
 public:
  /// Adds `name`. False when it is there already (nothing changes then).
  bool insert(std::string_view name) {
    if (2 * (entries_.size() + 1) > slots_.size()) grow();
    const std::size_t hash = std::hash<std::string_view>{}(name);
    for (std::size_t i = hash & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i] == empty) {
        if (entries_.size() >= empty) throw error(error_kind::invalid_argument, "more than 2^32 names in one state");
        slots_[i] = static_cast<std::uint32_t>(entries_.size());
        entries_.push_back({bytes_.size(), name.size(), hash});
        bytes_.append(name);
        return true;
      }
      const auto& e = entries_[slots_[i]];
      if (e.hash == hash && name == std::string_view(bytes_).substr(e.at, e.size)) return false;
    }
  }
  std::size_t size() const noexcept { return entries_.size(); }

  /// Makes room for `names` names of `bytes` bytes in all, so that adding them grows nothing.
  void reserve(std::size_t names, std::size_t bytes) {
    entries_.reserve(names);
    bytes_.reserve(bytes);
    std::size_t slots = std::max<std::size_t>(64, slots_.size());
    while (slots < 2 * names) slots *= 2;
    if (slots > slots_.size()) place_in(slots);
  }

 private:
  static constexpr std::uint32_t empty = ~std::uint32_t{0};
  struct entry {
    std::size_t at, size, hash;  // where its bytes are in bytes_, and its hash
  };

  /// Doubles the table (at most half full after) and places every entry again.
  void grow() { place_in(std::max<std::size_t>(64, 2 * slots_.size())); }

  /// Makes the table `slots` long (a power of two) and places every entry again.
  void place_in(std::size_t slots) {
    slots_.assign(slots, empty);
    for (std::size_t k = 0; k < entries_.size(); ++k) {
      std::size_t i = entries_[k].hash & (slots_.size() - 1);
      while (slots_[i] != empty) i = (i + 1) & (slots_.size() - 1);
      slots_[i] = static_cast<std::uint32_t>(k);
    }
  }

  // In memory kept for tables (table_memory.hpp): a visit of 100,000 names fills megabytes.
  table_string bytes_;
  table_vector<entry> entries_;
  table_vector<std::uint32_t> slots_;  // an entry's index, or `empty`; a power of two long
};

}  // namespace ckpt::detail
