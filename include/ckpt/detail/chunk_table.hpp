#pragma once
// The chunks of one tensor, stored column by column. A checkpoint of thousands of ranks holds
// millions of chunks; keeping each field in one flat array (no allocation per chunk) is what
// lets rank 0 merge, check and write them, and every rank read and plan them, in about a
// second. The same columns are what the footer index and chunk_map.bin store.

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "big_alloc.hpp"

namespace ckpt::detail {

struct chunk_table {
  std::uint32_t ndim = 0;
  big_vector<std::uint32_t> file;         // index into metadata::files (0 in a footer index)
  big_vector<std::uint64_t> coords;       // per chunk: offset[ndim], then shape[ndim]
  big_vector<std::uint8_t> codec;
  big_vector<std::uint64_t> file_offset;  // where the stored bytes start in the file
  big_vector<std::uint64_t> stored_size;
  big_vector<std::uint64_t> xxh3;         // of the stored bytes
  // No raw (decoded) size: it is the elements of the chunk's shape times the element size.

  std::size_t size() const noexcept { return codec.size(); }
  std::span<const std::uint64_t> offset(std::size_t i) const noexcept { return {coords.data() + 2 * ndim * i, ndim}; }
  std::span<const std::uint64_t> shape(std::size_t i) const noexcept {
    return {coords.data() + 2 * ndim * i + ndim, ndim};
  }
  /// Elements in chunk i. Cannot overflow once the chunk is known to lie inside its tensor's
  /// checked global shape (validate_metadata, or a chunk this process made).
  std::uint64_t elements(std::size_t i) const noexcept {
    std::uint64_t n = 1;
    for (const auto e : shape(i)) n *= e;
    return n;
  }

  void push(std::uint32_t f, std::span<const std::uint64_t> off, std::span<const std::uint64_t> shp, std::uint8_t c,
            std::uint64_t at, std::uint64_t stored, std::uint64_t hash) {
    file.push_back(f);
    coords.insert(coords.end(), off.begin(), off.end());
    coords.insert(coords.end(), shp.begin(), shp.end());
    codec.push_back(c);
    file_offset.push_back(at);
    stored_size.push_back(stored);
    xxh3.push_back(hash);
  }

  /// Appends every chunk of `other` (same ndim), recording them as being in file `f`.
  void append(const chunk_table& other, std::uint32_t f) {
    file.insert(file.end(), other.size(), f);
    coords.insert(coords.end(), other.coords.begin(), other.coords.end());
    codec.insert(codec.end(), other.codec.begin(), other.codec.end());
    file_offset.insert(file_offset.end(), other.file_offset.begin(), other.file_offset.end());
    stored_size.insert(stored_size.end(), other.stored_size.begin(), other.stored_size.end());
    xxh3.insert(xxh3.end(), other.xxh3.begin(), other.xxh3.end());
  }

  void reserve(std::size_t n) {
    file.reserve(n);
    coords.reserve(n * 2 * ndim);
    codec.reserve(n);
    file_offset.reserve(n);
    stored_size.reserve(n);
    xxh3.reserve(n);
  }

  /// Empties every column, keeping their memory for the next use.
  void clear() noexcept { resize(0); }

  void resize(std::size_t n) {
    file.resize(n);
    coords.resize(n * 2 * ndim);
    codec.resize(n);
    file_offset.resize(n);
    stored_size.resize(n);
    xxh3.resize(n);
  }
};

/// The regions of a layout's chunks and the file of each (chunk_layout): the two columns of a
/// chunk_table that chunk_map.bin keeps, and no others. Every tensor's layout has one (its grid
/// cell's pieces, or its listed chunks); with the four columns only a footer index fills, a
/// commit or load of 100,000 tensors made 400,000 allocations more for nothing.
struct region_table {
  std::uint32_t ndim = 0;
  big_vector<std::uint32_t> file;    // index into metadata::files (unused, 0, for a grid's pieces)
  big_vector<std::uint64_t> coords;  // per chunk: offset[ndim], then shape[ndim]

  std::size_t size() const noexcept { return file.size(); }
  std::span<const std::uint64_t> offset(std::size_t i) const noexcept { return {coords.data() + 2 * ndim * i, ndim}; }
  std::span<const std::uint64_t> shape(std::size_t i) const noexcept {
    return {coords.data() + 2 * ndim * i + ndim, ndim};
  }
  /// Elements in chunk i; cannot overflow once the region is known to lie inside a checked shape.
  std::uint64_t elements(std::size_t i) const noexcept {
    std::uint64_t n = 1;
    for (const auto e : shape(i)) n *= e;
    return n;
  }
  void push(std::uint32_t f, std::span<const std::uint64_t> off, std::span<const std::uint64_t> shp) {
    file.push_back(f);
    coords.insert(coords.end(), off.begin(), off.end());
    coords.insert(coords.end(), shp.begin(), shp.end());
  }
  /// Appends every region of `other` (same ndim), recording them as being in file `f`.
  void append(const region_table& other, std::uint32_t f) {
    const auto n = other.size();
    const auto at = coords.size();
    file.insert(file.end(), n, f);
    coords.resize(at + other.coords.size());  // `other` may be this table
    std::copy_n(other.coords.begin(), coords.size() - at, coords.begin() + static_cast<std::ptrdiff_t>(at));
  }
  void resize(std::size_t n) {
    file.resize(n);
    coords.resize(n * 2 * ndim);
  }
  void clear() noexcept { resize(0); }
};

}  // namespace ckpt::detail
