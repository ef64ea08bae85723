#pragma once
// The chunks of one tensor, stored column by column. A checkpoint of thousands of ranks holds
// millions of chunks; keeping each field in one flat array (no allocation per chunk) is what
// lets rank 0 merge, check and write them, and every rank read and plan them, in about a
// second. The same columns are what the footer index and chunk_map.bin store.
//
// A table's columns share one block of memory, and a table of one chunk of a tensor of up to
// two dimensions (most tensors of a model of many small ones: an expert's matrix is one chunk)
// keeps them inside the table itself. With a vector per column, a save of 100,000 such tensors
// made six allocations per tensor for its footer index alone, and a load three more for the
// chunks it read (docs/performance.md).
//
// Columns grow like vectors but, like the big arrays of a commit at scale, are not zeroed: a
// column is filled right after it is sized (from an index, or chunk by chunk), and zeroing
// hundreds of MB first costs about as much as the copy itself.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

namespace ckpt::detail {

/// One column of a table: its values, in memory the table owns. Not copyable on its own (a
/// copy of a column alone would be a view of the table's memory); copy the table.
template <class T>
class column {
  static_assert(std::is_trivially_copyable_v<T>, "a column holds plain data only");

 public:
  using value_type = T;
  using iterator = T*;
  using const_iterator = const T*;

  column() = default;
  column(const column&) = delete;
  column& operator=(const column&) = delete;

  T* data() noexcept { return p_; }
  const T* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  bool empty() const noexcept { return n_ == 0; }
  T& operator[](std::size_t i) noexcept { return p_[i]; }
  const T& operator[](std::size_t i) const noexcept { return p_[i]; }
  T* begin() noexcept { return p_; }
  T* end() noexcept { return p_ + n_; }
  const T* begin() const noexcept { return p_; }
  const T* end() const noexcept { return p_ + n_; }
  operator std::span<const T>() const noexcept { return {p_, n_}; }
  operator std::span<T>() noexcept { return {p_, n_}; }

  friend bool operator==(const column& a, const column& b) noexcept {
    return a.n_ == b.n_ && (a.n_ == 0 || std::memcmp(a.p_, b.p_, a.n_ * sizeof(T)) == 0);
  }

 private:
  template <std::size_t>
  friend class column_block;
  friend struct chunk_table;
  friend struct region_table;
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/// The memory of a table's columns: `Inline` bytes inside the table, or one heap block. Knows
/// nothing of the columns; the tables lay them out (u64 columns first, for alignment).
template <std::size_t Inline>
class column_block {
 public:
  column_block() = default;
  column_block(const column_block&) = delete;
  column_block& operator=(const column_block&) = delete;
  ~column_block() { release(); }

  std::byte* base() noexcept { return heap_ ? reinterpret_cast<std::byte*>(heap_.get()) : local_; }
  bool on_heap() const noexcept { return heap_ != nullptr; }

  /// Room for `bytes` bytes that do not overlap the current block, whose columns the caller
  /// copies out before it calls `adopt`: the inline bytes while the table has none in use and
  /// they are enough, else a new heap block (null for the inline bytes).
  std::unique_ptr<std::uint64_t[]> fresh(std::size_t bytes, bool empty, std::byte*& at) {
    if (empty && !heap_ && bytes <= Inline) {
      at = local_;
      return nullptr;
    }
    std::unique_ptr<std::uint64_t[]> block(new std::uint64_t[(bytes + 7) / 8]);
    at = reinterpret_cast<std::byte*>(block.get());
    return block;
  }
  /// Makes what `fresh` returned the table's block.
  void adopt(std::unique_ptr<std::uint64_t[]> block) noexcept {
    if (block) heap_ = std::move(block);
  }
  /// Takes `other`'s heap block (the caller rebinds its columns).
  void steal(column_block& other) noexcept { heap_ = std::move(other.heap_); }
  /// Copies `other`'s inline bytes.
  void copy_local(const column_block& other) noexcept { std::memcpy(local_, other.local_, Inline); }
  void release() noexcept { heap_.reset(); }

 private:
  std::unique_ptr<std::uint64_t[]> heap_;
  alignas(8) std::byte local_[Inline];
};

struct chunk_table {
  std::uint32_t ndim = 0;
  column<std::uint32_t> file;         // index into metadata::files (0 in a footer index)
  column<std::uint64_t> coords;       // per chunk: offset[ndim], then shape[ndim]
  column<std::uint8_t> codec;
  column<std::uint64_t> file_offset;  // where the stored bytes start in the file
  column<std::uint64_t> stored_size;
  column<std::uint64_t> xxh3;         // of the stored bytes
  // No raw (decoded) size: it is the elements of the chunk's shape times the element size.

  chunk_table() = default;
  chunk_table(const chunk_table& o) : ndim(o.ndim) { copy_from(o); }
  chunk_table(chunk_table&& o) noexcept : ndim(o.ndim) { take(o); }
  chunk_table& operator=(const chunk_table& o) {
    if (this != &o) {
      resize(0);
      ndim = o.ndim;
      copy_from(o);
    }
    return *this;
  }
  chunk_table& operator=(chunk_table&& o) noexcept {
    if (this != &o) {
      ndim = o.ndim;
      take(o);
    }
    return *this;
  }

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
    const auto i = size();
    resize(i + 1);
    file[i] = f;
    std::copy(off.begin(), off.end(), coords.data() + 2 * ndim * i);
    std::copy(shp.begin(), shp.end(), coords.data() + 2 * ndim * i + ndim);
    codec[i] = c;
    file_offset[i] = at;
    stored_size[i] = stored;
    xxh3[i] = hash;
  }

  /// Appends every chunk of `other` (same ndim), recording them as being in file `f`.
  void append(const chunk_table& other, std::uint32_t f) {
    const auto at = size(), n = other.size();
    resize(at + n);  // `other` may be this table: read it only after
    std::fill_n(file.data() + at, n, f);
    std::memmove(coords.data() + 2 * ndim * at, other.coords.data(), 2 * ndim * n * 8);
    std::memmove(codec.data() + at, other.codec.data(), n);
    std::memmove(file_offset.data() + at, other.file_offset.data(), n * 8);
    std::memmove(stored_size.data() + at, other.stored_size.data(), n * 8);
    std::memmove(xxh3.data() + at, other.xxh3.data(), n * 8);
  }

  /// Room for `n` chunks without another allocation.
  void reserve(std::size_t n) {
    if (n > capacity_ || ndim != laid_ndim_) grow(std::max(n, size()));
  }

  /// Empties every column, keeping their memory for the next use.
  void clear() noexcept { set_size(0); }

  /// `n` chunks; those added are not zeroed.
  void resize(std::size_t n) {
    if (n > capacity_ || ndim != laid_ndim_) grow(std::max(n, n > capacity_ ? 2 * capacity_ : capacity_));
    set_size(n);
  }

 private:
  // One chunk of up to two dimensions: 8 (xxh3) + 8 + 8 + 32 (coords) + 4 (file) + 1 (codec).
  static constexpr std::size_t inline_bytes = 64;
  static std::size_t bytes_for(std::size_t cap, std::size_t nd) noexcept { return cap * (29 + 16 * nd); }

  /// Points the columns at a block laid out for `cap` chunks of `nd` dimensions.
  void bind(std::byte* b, std::size_t cap, std::uint32_t nd) noexcept {
    auto* u = reinterpret_cast<std::uint64_t*>(b);
    xxh3.p_ = u;
    file_offset.p_ = u + cap;
    stored_size.p_ = u + 2 * cap;
    coords.p_ = u + 3 * cap;
    file.p_ = reinterpret_cast<std::uint32_t*>(u + (3 + 2 * std::size_t{nd}) * cap);
    codec.p_ = reinterpret_cast<std::uint8_t*>(file.p_ + cap);
    capacity_ = cap;
    laid_ndim_ = nd;
  }
  void set_size(std::size_t n) noexcept {
    file.n_ = codec.n_ = file_offset.n_ = stored_size.n_ = xxh3.n_ = n;
    coords.n_ = n * 2 * ndim;
  }
  /// Moves the columns to a block for `cap` chunks of `ndim` dimensions.
  void grow(std::size_t cap) {
    const auto n = std::min(size(), cap);
    const auto keep = std::min(coords.size(), cap * 2 * ndim);
    std::byte* b = nullptr;
    auto fresh = block_.fresh(bytes_for(cap, ndim), size() == 0, b);
    chunk_table to;  // only its columns' pointers: the bytes are copied before this block is dropped
    to.ndim = ndim;
    to.bind(b, cap, ndim);
    if (n) {
      std::memcpy(to.file.p_, file.p_, n * 4);
      std::memcpy(to.codec.p_, codec.p_, n);
      std::memcpy(to.file_offset.p_, file_offset.p_, n * 8);
      std::memcpy(to.stored_size.p_, stored_size.p_, n * 8);
      std::memcpy(to.xxh3.p_, xxh3.p_, n * 8);
    }
    if (keep) std::memcpy(to.coords.p_, coords.p_, keep * 8);
    block_.adopt(std::move(fresh));
    bind(b, cap, ndim);
    set_size(n);
  }
  void copy_from(const chunk_table& o) {
    if (o.size() == 0) return;
    grow(o.size());
    set_size(o.size());
    std::memcpy(file.p_, o.file.p_, size() * 4);
    std::memcpy(coords.p_, o.coords.p_, std::min(o.coords.size(), coords.size()) * 8);
    std::memcpy(codec.p_, o.codec.p_, size());
    std::memcpy(file_offset.p_, o.file_offset.p_, size() * 8);
    std::memcpy(stored_size.p_, o.stored_size.p_, size() * 8);
    std::memcpy(xxh3.p_, o.xxh3.p_, size() * 8);
  }
  void take(chunk_table& o) noexcept {
    const auto n = o.size();
    if (o.block_.on_heap()) {
      block_.steal(o.block_);
    } else {
      block_.release();
      block_.copy_local(o.block_);
    }
    bind(block_.base(), o.capacity_, o.laid_ndim_);
    set_size(n);
    o.capacity_ = 0;
    o.laid_ndim_ = 0;
    o.set_size(0);
  }

  column_block<inline_bytes> block_;
  std::size_t capacity_ = 0;
  std::uint32_t laid_ndim_ = 0;
};

/// The regions of a layout's chunks and the file of each (chunk_layout): the two columns of a
/// chunk_table that chunk_map.bin keeps, and no others. Every tensor's layout has one (its grid
/// cell's pieces, or its listed chunks); with the four columns only a footer index fills, a
/// commit or load of 100,000 tensors made 400,000 allocations more for nothing.
struct region_table {
  std::uint32_t ndim = 0;
  column<std::uint32_t> file;    // index into metadata::files (unused, 0, for a grid's pieces)
  column<std::uint64_t> coords;  // per chunk: offset[ndim], then shape[ndim]

  region_table() = default;
  region_table(const region_table& o) : ndim(o.ndim) { copy_from(o); }
  region_table(region_table&& o) noexcept : ndim(o.ndim) { take(o); }
  region_table& operator=(const region_table& o) {
    if (this != &o) {
      resize(0);
      ndim = o.ndim;
      copy_from(o);
    }
    return *this;
  }
  region_table& operator=(region_table&& o) noexcept {
    if (this != &o) {
      ndim = o.ndim;
      take(o);
    }
    return *this;
  }

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
    const auto i = size();
    resize(i + 1);
    file[i] = f;
    std::copy(off.begin(), off.end(), coords.data() + 2 * ndim * i);
    std::copy(shp.begin(), shp.end(), coords.data() + 2 * ndim * i + ndim);
  }
  /// Appends every region of `other` (same ndim), recording them as being in file `f`.
  void append(const region_table& other, std::uint32_t f) {
    const auto at = size(), n = other.size();
    resize(at + n);  // `other` may be this table: read it only after
    std::fill_n(file.data() + at, n, f);
    std::memmove(coords.data() + 2 * ndim * at, other.coords.data(), 2 * ndim * n * 8);
  }
  /// `n` regions; those added are not zeroed.
  void resize(std::size_t n) {
    if (n > capacity_ || ndim != laid_ndim_) grow(std::max(n, n > capacity_ ? 2 * capacity_ : capacity_));
    set_size(n);
  }
  void clear() noexcept { set_size(0); }

 private:
  // One region of up to two dimensions: 32 (coords) + 4 (file).
  static constexpr std::size_t inline_bytes = 40;
  static std::size_t bytes_for(std::size_t cap, std::size_t nd) noexcept { return cap * (4 + 16 * nd); }

  void bind(std::byte* b, std::size_t cap, std::uint32_t nd) noexcept {
    coords.p_ = reinterpret_cast<std::uint64_t*>(b);
    file.p_ = reinterpret_cast<std::uint32_t*>(coords.p_ + 2 * std::size_t{nd} * cap);
    capacity_ = cap;
    laid_ndim_ = nd;
  }
  void set_size(std::size_t n) noexcept {
    file.n_ = n;
    coords.n_ = n * 2 * ndim;
  }
  void grow(std::size_t cap) {
    const auto n = std::min(size(), cap);
    const auto keep = std::min(coords.size(), cap * 2 * ndim);
    std::byte* b = nullptr;
    auto fresh = block_.fresh(bytes_for(cap, ndim), size() == 0, b);
    region_table to;
    to.bind(b, cap, ndim);
    if (n) std::memcpy(to.file.p_, file.p_, n * 4);
    if (keep) std::memcpy(to.coords.p_, coords.p_, keep * 8);
    block_.adopt(std::move(fresh));
    bind(b, cap, ndim);
    set_size(n);
  }
  void copy_from(const region_table& o) {
    if (o.size() == 0) return;
    grow(o.size());
    set_size(o.size());
    std::memcpy(file.p_, o.file.p_, size() * 4);
    std::memcpy(coords.p_, o.coords.p_, std::min(o.coords.size(), coords.size()) * 8);
  }
  void take(region_table& o) noexcept {
    const auto n = o.size();
    if (o.block_.on_heap()) {
      block_.steal(o.block_);
    } else {
      block_.release();
      block_.copy_local(o.block_);
    }
    bind(block_.base(), o.capacity_, o.laid_ndim_);
    set_size(n);
    o.capacity_ = 0;
    o.laid_ndim_ = 0;
    o.set_size(0);
  }

  column_block<inline_bytes> block_;
  std::size_t capacity_ = 0;
  std::uint32_t laid_ndim_ = 0;
};

}  // namespace ckpt::detail
