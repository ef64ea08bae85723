// Shapes and shard specs in the user's own integer types (ckpt::extents): no narrowing
// warnings for int, int64_t or size_t sizes, and a negative or overflowing size refused by
// v.tensor naming the tensor.

#include "helpers.hpp"
#include "on_ranks.hpp"

#include <ckpt/in_process.hpp>
#include <ckpt/reader.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

namespace {

using test::mentions;

struct int_sized {
  int rows = 3, cols = 4;
  std::int64_t r = 1;
  std::size_t global_rows = 6;
  std::vector<float> w = std::vector<float>(12), b = std::vector<float>(4);
  template <class V>
  void checkpoint(V& v) {
    // The calls a user writes with their own integer types. Here a conversion that narrows or
    // changes sign is an error, so these lines prove none happens in the user's code.
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wconversion"
#pragma GCC diagnostic error "-Wsign-conversion"
#pragma GCC diagnostic error "-Wnarrowing"
    v.tensor("w", ckpt::view(w.data(), {rows, cols}).sharded({.global_shape = {global_rows, cols}, .offset = {r * rows, 0}}));
    v.tensor("b", ckpt::view(b, {static_cast<std::int64_t>(cols)}));
#pragma GCC diagnostic pop
  }
};

std::string visit_error(auto&& f) {
  try {
    ckpt::visitor v;
    f(v);
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::error_kind::invalid_argument);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("extents: shapes in int, int64_t, size_t, mixed, and ranges of them") {
  std::vector<float> w(12);
  const int i = 3;
  const std::int64_t l = 4;
  const std::size_t z = 3;
  CHECK(ckpt::view(w.data(), {i, 4}).shape() == ckpt::shape_t{3, 4});
  CHECK(ckpt::view(w.data(), {l, i}).shape() == ckpt::shape_t{4, 3});  // mixed types
  CHECK(ckpt::view(w.data(), {z, l}).shape() == ckpt::shape_t{3, 4});
  CHECK(ckpt::view(w, std::vector<int>{2, 6}).shape() == ckpt::shape_t{2, 6});
  CHECK(ckpt::view(w, std::array<std::int64_t, 3>{2, 3, 2}).shape() == ckpt::shape_t{2, 3, 2});
  CHECK(ckpt::view(w.data(), ckpt::shape_t{12}).shape() == ckpt::shape_t{12});
  CHECK(ckpt::view(w.data(), {}).shape().empty());  // a scalar
  const ckpt::shard_spec s{.global_shape = {i * 2, l}, .offset = {i, 0}};
  CHECK(s.global_shape == ckpt::shape_t{6, 4});
  CHECK(s.offset == ckpt::shape_t{3, 0});
  const std::vector<float> c(12);
  CHECK_FALSE(ckpt::view(c.data(), {i, l}).writable());  // const data stays read-only
}

TEST_CASE("extents: a checkpoint made with int sizes saves and loads at another tp") {
  test::temp_dir dir;
  auto errors = test::on_ranks(2, [&](ckpt::in_process comm, std::uint32_t rank) {
    int_sized s;
    s.r = rank;
    for (std::size_t k = 0; k < s.w.size(); ++k) s.w[k] = static_cast<float>(rank * 100 + k);
    ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::posix> cp{{.tp = 2, .comm = comm}, dir.path()};
    cp.save(1, s);
  });
  for (const auto& e : errors) CHECK(e == "");
  ckpt::reader r{ckpt::posix(dir.path())};
  std::vector<float> whole(24);
  r.read("w", ckpt::view(whole, {6, 4}));
  CHECK(whole[0] == 0.0f);
  CHECK(whole[12] == 100.0f);
  CHECK(whole[23] == 111.0f);
}

TEST_CASE("checked_size overflows exactly where element_count and checked_mul would throw") {
  using ckpt::detail::checked_size;
  const std::uint64_t big = std::uint64_t{1} << 32;
  const std::vector<std::vector<std::uint64_t>> shapes = {
      {}, {0}, {3, 4}, {big, big - 1}, {big, big}, {big, big, 0}, {0, big, big}, {big / 2, big}, {1, 1, 1}};
  for (const auto& shape : shapes)
    for (const std::uint64_t size : {std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{8}}) {
      CAPTURE(ckpt::detail::to_string(shape));
      CAPTURE(size);
      std::optional<std::uint64_t> thrown_free;
      try {
        thrown_free = ckpt::detail::checked_mul(ckpt::detail::element_count(shape, "s"), size, "s");
      } catch (const ckpt::error&) {
      }
      CHECK(checked_size(shape, size) == thrown_free);
    }
  CHECK(checked_size(std::vector<std::uint64_t>{big, big - 1}) == (big * (big - 1)));
  CHECK_FALSE(checked_size(std::vector<std::uint64_t>{big, big}));
  CHECK_FALSE(checked_size(std::vector<std::uint64_t>{big, big, 0}));  // in order, as element_count
  CHECK(checked_size(std::vector<std::uint64_t>{0, big, big}) == 0);
}

TEST_CASE("extents: a negative or overflowing size is refused by v.tensor, naming the tensor") {
  std::vector<float> w(12);
  const int minus = -3;
  auto e = visit_error([&](ckpt::visitor& v) { v.group("layer", [&](auto& g) { g.tensor("w", ckpt::view(w.data(), {4, minus})); }); });
  CHECK(mentions(e, "tensor 'layer.w'"));
  CHECK(mentions(e, "dimension 1 is -3"));
  e = visit_error([&](ckpt::visitor& v) { v.tensor("v", ckpt::view(w, {minus, 4})); });  // the vector view defers it too
  CHECK(mentions(e, "tensor 'v'"));
  CHECK(mentions(e, "dimension 0 is -3"));
  const std::uint64_t huge = std::uint64_t{1} << 40;
  e = visit_error([&](ckpt::visitor& v) { v.tensor("big", ckpt::view(w.data(), {huge, huge})); });
  CHECK(mentions(e, "tensor 'big'"));
  CHECK(mentions(e, "element count overflows 64 bits"));
  e = visit_error([&](ckpt::visitor& v) {
    v.tensor("s", ckpt::view(w.data(), {3, 4}).sharded({.global_shape = {6, 4}, .offset = {minus, 0}}));
  });
  CHECK(mentions(e, "tensor 's'"));
  CHECK(mentions(e, "shard spec's offset"));
  CHECK(mentions(e, "dimension 0 is -3"));
}

TEST_CASE("shape_t: a vector of extents, inline up to its capacity and on the heap beyond") {
  using ckpt::shape_t;
  static_assert(sizeof(shape_t) == sizeof(std::vector<std::uint64_t>), "no larger than the vector it replaced");
  constexpr auto inline_dims = shape_t::inline_capacity;
  // Grows past the inline storage and back, keeping every extent, whatever the size.
  for (std::size_t n = 0; n <= inline_dims + 3; ++n) {
    shape_t s;
    std::vector<std::uint64_t> v;
    for (std::size_t i = 0; i < n; ++i) s.push_back(10 + i), v.push_back(10 + i);
    CHECK(s.size() == n);
    CHECK(std::vector<std::uint64_t>(s) == v);
    CHECK(s == shape_t(v));
    const shape_t copy = s;
    shape_t moved = std::move(s);
    CHECK(moved == copy);
    CHECK(s.empty());  // NOLINT: a moved-from shape is empty, as a vector is here
    s = moved;         // and usable again
    CHECK(s == copy);
    const shape_t& same = s;
    s = same;  // self-assignment keeps it
    CHECK(s == copy);
    shape_t other{7};
    swap(other, s);
    CHECK(other == copy);
    CHECK(s == shape_t{7});
  }
  shape_t s{1, 2};
  CHECK(s.capacity() == inline_dims);
  s.insert(s.begin() + 1, {5, 6, 7});
  CHECK(s == shape_t{1, 5, 6, 7, 2});
  s.insert(s.begin(), s.begin() + 3, s.end());  // a range of itself
  CHECK(s == shape_t{7, 2, 1, 5, 6, 7, 2});
  s.erase(s.begin() + 1, s.begin() + 3);
  CHECK(s == shape_t{7, 5, 6, 7, 2});
  s.resize(2);
  CHECK(s == shape_t{7, 5});
  s.resize(4, 9);
  CHECK(s == shape_t{7, 5, 9, 9});
  s.assign(3, 0);
  CHECK(s == shape_t(3));
  CHECK(shape_t(2, 4) == shape_t{4, 4});
  CHECK(shape_t{0}.size() == 1);  // braces hold extents, as with a vector
  CHECK(shape_t{1, 2} < shape_t{1, 3});
  CHECK(shape_t{1, 2} < shape_t{1, 2, 0});
  CHECK(shape_t{} == std::vector<std::uint64_t>{});
  CHECK(std::span<const std::uint64_t>(shape_t{3, 4}).size() == 2);
  CHECK_THROWS_AS(s.at(3), std::out_of_range);
  // Reuse does not grow it: a shape cleared and refilled to the same size keeps its capacity.
  shape_t reused{1, 2, 3, 4, 5, 6, 7};
  const auto capacity = reused.capacity();
  for (int i = 0; i < 100; ++i) {
    reused.clear();
    reused.resize(7);
    reused.assign(5, 1);
    reused.resize(7, 2);
  }
  CHECK(reused.capacity() == capacity);
  CHECK(reused == shape_t{1, 1, 1, 1, 1, 2, 2});
  std::vector<std::int64_t> signed_dims{2, 3, 4};
  CHECK(shape_t(signed_dims.begin(), signed_dims.end()) == shape_t{2, 3, 4});
}
