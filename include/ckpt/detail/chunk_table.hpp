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
#include <array>
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
  template <class, std::size_t>
  friend class column_table;
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/// What chunk_table and region_table share: their columns in one block (`Inline` bytes inside
/// the table, or one heap block), grown like a vector's, copied and moved whole. A table lists
/// its columns once, in `columns(f)`: `f(column, per_dim)` for each, widest type first (so each
/// starts aligned), `per_dim` when it holds 2 × ndim values per chunk (the coordinates).
template <class Table, std::size_t Inline>
class column_table {
 public:
  std::uint32_t ndim = 0;

  std::size_t size() const noexcept { return self().file.size(); }
  std::span<const std::uint64_t> offset(std::size_t i) const noexcept { return {self().coords.data() + 2 * ndim * i, ndim}; }
  std::span<const std::uint64_t> shape(std::size_t i) const noexcept {
    return {self().coords.data() + 2 * ndim * i + ndim, ndim};
  }
  /// Elements in chunk i. Cannot overflow once the chunk is known to lie inside its tensor's
  /// checked global shape (validate_metadata, or a chunk this process made).
  std::uint64_t elements(std::size_t i) const noexcept {
    std::uint64_t n = 1;
    for (const auto e : shape(i)) n *= e;
    return n;
  }

  /// `n` chunks; those added are not zeroed.
  void resize(std::size_t n) {
    if (n > capacity_ || ndim != laid_ndim_) grow(std::max(n, n > capacity_ ? 2 * capacity_ : capacity_));
    set_size(n);
  }
  /// Room for `n` chunks without another allocation.
  void reserve(std::size_t n) {
    if (n > capacity_ || ndim != laid_ndim_) grow(std::max(n, size()));
  }
  /// Empties every column, keeping their memory for the next use.
  void clear() noexcept { set_size(0); }

  /// Appends every chunk of `other` (same ndim), recording them as being in file `f`.
  void append(const Table& other, std::uint32_t f) {
    const auto at = size(), n = other.size();
    resize(at + n);  // `other` may be this table: read it only after
    const auto from = other.places();
    std::size_t k = 0;
    self().columns([&](auto& c, bool per_dim) {
      const auto each = per_dim ? 2 * std::size_t{ndim} : 1;
      std::memmove(c.p_ + at * each, from[k++].first, n * each * sizeof(*c.p_));
    });
    std::fill_n(self().file.data() + at, n, f);
  }

 protected:
  column_table() = default;
  // The columns are the table's members, made after this base: the table's own copy and move
  // construct them first, then call copy_from and take.
  column_table(const column_table&) noexcept {}
  column_table& operator=(const column_table&) = delete;

  void copy_from(const Table& o) {
    if (&o == &self()) return;
    set_size(0);
    ndim = o.ndim;
    if (o.size() == 0) return;
    reserve(o.size());
    set_size(o.size());
    const auto from = o.places();
    std::size_t k = 0;
    self().columns([&](auto& c, bool) {
      const auto [p, bytes] = from[k++];
      std::memcpy(c.p_, p, std::min(bytes, c.n_ * sizeof(*c.p_)));
    });
  }
  void take(Table& o) noexcept {
    if (&o == &self()) return;
    ndim = o.ndim;
    const auto n = o.size();
    if (o.heap_) {
      heap_ = std::move(o.heap_);
    } else {
      heap_.reset();
      std::memcpy(local_, o.local_, Inline);
    }
    bind(base(), o.capacity_, o.laid_ndim_);
    set_size(n);
    o.capacity_ = 0;
    o.laid_ndim_ = 0;
    o.set_size(0);
  }

 private:
  static constexpr std::size_t most_columns = 8;
  using places_t = std::array<std::pair<const void*, std::size_t>, most_columns>;  // each column's values and bytes

  Table& self() noexcept { return static_cast<Table&>(*this); }
  const Table& self() const noexcept { return static_cast<const Table&>(*this); }
  std::byte* base() noexcept { return heap_ ? reinterpret_cast<std::byte*>(heap_.get()) : local_; }

  places_t places() const noexcept {
    places_t out{};
    std::size_t k = 0;
    const_cast<Table&>(self()).columns([&](auto& c, bool) { out[k++] = {c.p_, c.n_ * sizeof(*c.p_)}; });
    return out;
  }
  /// Points the columns at a block laid out for `cap` chunks of `nd` dimensions.
  void bind(std::byte* b, std::size_t cap, std::uint32_t nd) noexcept {
    std::size_t at = 0;
    self().columns([&](auto& c, bool per_dim) {
      c.p_ = reinterpret_cast<std::remove_reference_t<decltype(*c.p_)>*>(b + at);
      at += cap * (per_dim ? 2 * std::size_t{nd} : 1) * sizeof(*c.p_);
    });
    capacity_ = cap;
    laid_ndim_ = nd;
  }
  std::size_t bytes_for(std::size_t cap, std::uint32_t nd) noexcept {
    std::size_t bytes = 0;
    self().columns([&](auto& c, bool per_dim) { bytes += cap * (per_dim ? 2 * std::size_t{nd} : 1) * sizeof(*c.p_); });
    return bytes;
  }
  void set_size(std::size_t n) noexcept {
    self().columns([&](auto& c, bool per_dim) { c.n_ = per_dim ? n * 2 * ndim : n; });
  }
  /// Moves the columns to a block for `cap` chunks of `ndim` dimensions: the inline bytes while
  /// the table has none in use and they are enough, else a new heap block. The old block goes
  /// only once its values are copied.
  void grow(std::size_t cap) {
    const auto n = std::min(size(), cap);
    const auto from = places();
    const auto bytes = bytes_for(cap, ndim);
    std::unique_ptr<std::uint64_t[]> fresh;
    std::byte* b = local_;
    if (size() != 0 || heap_ || bytes > Inline) {
      fresh.reset(new std::uint64_t[(bytes + 7) / 8]);
      b = reinterpret_cast<std::byte*>(fresh.get());
    }
    bind(b, cap, ndim);
    std::size_t k = 0;
    self().columns([&](auto& c, bool per_dim) {
      const auto [p, had] = from[k++];
      if (const auto keep = std::min(had, cap * (per_dim ? 2 * std::size_t{ndim} : 1) * sizeof(*c.p_)); keep)
        std::memcpy(c.p_, p, keep);
    });
    if (fresh) heap_ = std::move(fresh);
    set_size(n);
  }

  std::unique_ptr<std::uint64_t[]> heap_;  // null while the columns are in local_
  std::size_t capacity_ = 0;
  std::uint32_t laid_ndim_ = 0;
  alignas(8) std::byte local_[Inline];
};

struct chunk_table : column_table<chunk_table, 64> {  // one chunk of up to two dimensions inline: 61 bytes
  column<std::uint32_t> file;         // index into metadata::files (0 in a footer index)
  column<std::uint64_t> coords;       // per chunk: offset[ndim], then shape[ndim]
  column<std::uint8_t> codec;
  column<std::uint64_t> file_offset;  // where the stored bytes start in the file
  column<std::uint64_t> stored_size;
  column<std::uint64_t> xxh3;         // of the stored bytes
  // No raw (decoded) size: it is the elements of the chunk's shape times the element size.

  chunk_table() = default;
  chunk_table(const chunk_table& o) : column_table(o) { copy_from(o); }
  chunk_table(chunk_table&& o) noexcept : column_table(o) { take(o); }
  chunk_table& operator=(const chunk_table& o) {
    copy_from(o);
    return *this;
  }
  chunk_table& operator=(chunk_table&& o) noexcept {
    take(o);
    return *this;
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

 private:
  friend class column_table<chunk_table, 64>;
  template <class F>
  void columns(F&& f) {
    f(xxh3, false), f(file_offset, false), f(stored_size, false), f(coords, true), f(file, false), f(codec, false);
  }
};

/// The regions of a layout's chunks and the file of each (chunk_layout): the two columns of a
/// chunk_table that chunk_map.bin keeps, and no others. Every tensor's layout has one (its grid
/// cell's pieces, or its listed chunks); with the four columns only a footer index fills, a
/// commit or load of 100,000 tensors made 400,000 allocations more for nothing.
struct region_table : column_table<region_table, 40> {  // one region of up to two dimensions inline: 36 bytes
  column<std::uint32_t> file;    // index into metadata::files (unused, 0, for a grid's pieces)
  column<std::uint64_t> coords;  // per chunk: offset[ndim], then shape[ndim]

  region_table() = default;
  region_table(const region_table& o) : column_table(o) { copy_from(o); }
  region_table(region_table&& o) noexcept : column_table(o) { take(o); }
  region_table& operator=(const region_table& o) {
    copy_from(o);
    return *this;
  }
  region_table& operator=(region_table&& o) noexcept {
    take(o);
    return *this;
  }

  void push(std::uint32_t f, std::span<const std::uint64_t> off, std::span<const std::uint64_t> shp) {
    const auto i = size();
    resize(i + 1);
    file[i] = f;
    std::copy(off.begin(), off.end(), coords.data() + 2 * ndim * i);
    std::copy(shp.begin(), shp.end(), coords.data() + 2 * ndim * i + ndim);
  }

 private:
  friend class column_table<region_table, 40>;
  template <class F>
  void columns(F&& f) {
    f(coords, true), f(file, false);
  }
};

}  // namespace ckpt::detail
