#pragma once
// Finds an element of a sequence by its name: the stored tensors a load looks up at every stage
// (while the state is visited, when names are matched, for each entry of a footer index). A
// std::unordered_map<std::string_view, ...> over 100,000 tensors made a node per name (an
// allocation, and a free when the load ended) and was built twice per load. Here one array of
// slots holds each element's position and a part of its name's hash, so that a probe touches
// the element itself only when the hashes agree.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>
#include <vector>

#include "../error.hpp"

namespace ckpt::detail {

class name_index {
 public:
  static constexpr std::size_t npos = ~std::size_t{0};

  name_index() = default;

  /// An empty index with room for `capacity` names, filled by try_add.
  explicit name_index(std::size_t capacity) : capacity_(capacity) {
    if (capacity >= empty) throw error(error_kind::invalid_argument, "more than 2^32 - 1 names in one index");
    std::size_t n = 64;
    while (n < 2 * capacity) n *= 2;  // at most half full
    slots_.assign(n, slot{empty, 0});
  }

  /// Indexes `items` by `name_of(items[i])`. The names must stay where they are while the
  /// index is used. A name listed twice is found at its first position.
  template <class Items, class NameOf>
  name_index(const Items& items, NameOf name_of) : name_index(items.size()) {
    for (std::size_t k = 0; k < items.size(); ++k) try_add(name_of(items[k]), k, items, name_of);
  }

  /// Where `name` is already, and false; or, if it is not there, records it at `position` (the
  /// caller then puts it there in `items`) and returns that, and true.
  template <class Items, class NameOf>
  std::pair<std::size_t, bool> try_add(std::string_view name, std::size_t position, const Items& items, NameOf name_of) {
    if (slots_.empty()) throw error(error_kind::invalid_argument, "name_index: try_add on an index made without a capacity");
    const std::size_t hash = std::hash<std::string_view>{}(name);
    auto& s = slots_[probe(name, hash, items, name_of)];
    if (s.at != empty) return {s.at, false};
    if (added_ == capacity_ || position >= empty) throw error(error_kind::invalid_argument, "name_index: more names than its capacity");
    ++added_;
    s = {static_cast<std::uint32_t>(position), tag_of(hash)};
    return {position, true};
  }

  /// The position of `name` in the items indexed, or npos.
  template <class Items, class NameOf>
  std::size_t find(std::string_view name, const Items& items, NameOf name_of) const {
    if (slots_.empty()) return npos;
    const auto at = slots_[probe(name, std::hash<std::string_view>{}(name), items, name_of)].at;
    return at == empty ? npos : at;
  }

 private:
  static constexpr std::uint32_t empty = ~std::uint32_t{0};
  struct slot {
    std::uint32_t at;   // the element's position, or `empty`
    std::uint32_t tag;  // the high half of its name's hash (the low bits chose the slot)
  };
  static std::uint32_t tag_of(std::size_t hash) noexcept { return static_cast<std::uint32_t>(std::uint64_t{hash} >> 32); }

  /// The slot holding `name`, or the empty one where it would go (one always exists: the
  /// table is at most half full).
  template <class Items, class NameOf>
  std::size_t probe(std::string_view name, std::size_t hash, const Items& items, NameOf name_of) const {
    const std::size_t mask = slots_.size() - 1;
    std::size_t i = hash & mask;
    while (slots_[i].at != empty && !(slots_[i].tag == tag_of(hash) && name_of(items[slots_[i].at]) == name)) i = (i + 1) & mask;
    return i;
  }

  std::vector<slot> slots_;  // a power of two long
  std::size_t capacity_ = 0, added_ = 0;  // names it has room for, and holds
};

}  // namespace ckpt::detail
