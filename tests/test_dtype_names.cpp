// dtypes, 16-bit float conversions, and the rules for names, tags and storage keys.

#include "helpers.hpp"

#include <ckpt/detail/keys.hpp>
#include <ckpt/detail/name_index.hpp>
#include <ckpt/detail/name_sort.hpp>
#include <ckpt/detail/name_set.hpp>

#include <bit>
#include <cmath>
#include <limits>
#include <random>

TEST_CASE("dtype ids, names and sizes are stable") {
  using ckpt::dtype;
  const std::pair<dtype, std::pair<const char*, std::size_t>> table[] = {
      {dtype::f64, {"f64", 8}}, {dtype::f32, {"f32", 4}}, {dtype::f16, {"f16", 2}}, {dtype::bf16, {"bf16", 2}},
      {dtype::i64, {"i64", 8}}, {dtype::i32, {"i32", 4}}, {dtype::i16, {"i16", 2}}, {dtype::i8, {"i8", 1}},
      {dtype::u8, {"u8", 1}},   {dtype::boolean, {"bool", 1}}, {dtype::u16, {"u16", 2}}, {dtype::u32, {"u32", 4}},
      {dtype::u64, {"u64", 8}}, {dtype::f8_e4m3, {"f8_e4m3", 1}}, {dtype::f8_e5m2, {"f8_e5m2", 1}}};
  std::uint8_t id = 1;
  for (const auto& [t, info] : table) {
    CHECK(static_cast<std::uint8_t>(t) == id++);  // the on-disk ids of docs/format.md
    CHECK(ckpt::to_string(t) == info.first);
    CHECK(ckpt::size_of(t) == info.second);
    CHECK(ckpt::dtype_from_string(info.first) == t);
    CHECK(ckpt::dtype_from_id(static_cast<std::uint8_t>(t)) == t);
  }
  CHECK(id == ckpt::last_dtype_id + 1);  // the table lists every id
  CHECK_FALSE(ckpt::dtype_from_id(0));
  CHECK_FALSE(ckpt::dtype_from_id(16));
  CHECK_FALSE(ckpt::dtype_from_id(255));
  CHECK_FALSE(ckpt::dtype_from_string("float"));
  CHECK_FALSE(ckpt::dtype_from_string("f8_e4m3fn"));  // torch's name, not ckpt's
  CHECK(ckpt::dtype_of<bool>::value == dtype::boolean);
  CHECK(ckpt::dtype_of<ckpt::bfloat16>::value == dtype::bf16);
  CHECK(ckpt::dtype_of<std::uint16_t>::value == dtype::u16);
  CHECK(ckpt::dtype_of<std::uint32_t>::value == dtype::u32);
  CHECK(ckpt::dtype_of<std::uint64_t>::value == dtype::u64);
  CHECK(ckpt::dtype_of<ckpt::float8_e4m3>::value == dtype::f8_e4m3);
  CHECK(ckpt::dtype_of<ckpt::float8_e5m2>::value == dtype::f8_e5m2);
  // FP8 is floating point (its values compare as numbers) but never converted.
  for (auto t : {dtype::f64, dtype::f32, dtype::f16, dtype::bf16, dtype::f8_e4m3, dtype::f8_e5m2}) CHECK(ckpt::is_floating(t));
  for (auto t : {dtype::i64, dtype::u64, dtype::u32, dtype::u16, dtype::u8, dtype::boolean}) CHECK_FALSE(ckpt::is_floating(t));
  CHECK(ckpt::is_float8(dtype::f8_e4m3));
  CHECK_FALSE(ckpt::is_float8(dtype::bf16));
  const std::uint64_t big = std::numeric_limits<std::uint64_t>::max();
  CHECK(ckpt::element_as_double(reinterpret_cast<const std::byte*>(&big), dtype::u64, 0) == 18446744073709551616.0);
  const std::uint32_t u = 0xffffffffu;
  CHECK(ckpt::element_as_double(reinterpret_cast<const std::byte*>(&u), dtype::u32, 0) == 4294967295.0);
}

TEST_CASE("float16 converts like IEEE binary16 with round to nearest even") {
  CHECK(ckpt::float16(1.0f).bits == 0x3c00);
  CHECK(ckpt::float16(-2.0f).bits == 0xc000);
  CHECK(ckpt::float16(65504.0f).bits == 0x7bff);
  CHECK(ckpt::float16(65520.0f).bits == 0x7c00);  // rounds to infinity
  CHECK(ckpt::float16(1e-8f).bits == 0x0000);
  CHECK(ckpt::float16(5.9604645e-8f).bits == 0x0001);  // smallest subnormal
  CHECK(ckpt::float16(std::numeric_limits<float>::infinity()).bits == 0x7c00);
  CHECK(std::isnan(static_cast<float>(ckpt::float16(std::nanf("")))));
  CHECK(ckpt::float16(1.0f + 1.0f / 2048).bits == 0x3c00);  // tie rounds to even
  CHECK(ckpt::float16(1.0f + 3.0f / 2048).bits == 0x3c02);
  for (std::uint32_t h = 0; h < 0x7c00; ++h) {  // every finite positive half survives a round trip
    const float f = ckpt::float16::to_float(static_cast<std::uint16_t>(h));
    REQUIRE(ckpt::float16(f).bits == h);
  }
}

TEST_CASE("bfloat16 is the top half of binary32, rounded to nearest even") {
  CHECK(ckpt::bfloat16(1.0f).bits == 0x3f80);
  CHECK(ckpt::bfloat16(3.0f).bits == 0x4040);
  CHECK(static_cast<float>(ckpt::bfloat16(3.0f)) == 3.0f);
  CHECK(ckpt::bfloat16(std::bit_cast<float>(0x3f808000u)).bits == 0x3f80);  // tie to even
  CHECK(ckpt::bfloat16(std::bit_cast<float>(0x3f818000u)).bits == 0x3f82);
  CHECK(std::isnan(static_cast<float>(ckpt::bfloat16(std::nanf("")))));
}

TEST_CASE("names: hierarchical, no empty segment, no separators or control characters") {
  // The edges of the one-pass check every plain ASCII name takes, and names it hands on to the
  // full checks (non-ASCII bytes).
  for (const char* ok : {"w", "layers.3.attn.qkv.weight", "optimizer.exp_avg", "a-b_c", "x.0", "caf\xc3\xa9.\xf0\x9f\x98\x80",
                         "a b", " ", "~.!", "x__ckpt", "_ckpt", "__ckp"}) {
    CAPTURE(ok);
    CHECK(ckpt::name_problem(ok).empty());
  }
  for (std::string bad : {std::string(), std::string("a..b"), std::string(".a"), std::string("a."), std::string(".."),
                          std::string("a/b"), std::string("a\\b"), std::string("a\x01"), std::string("a\x7f"),
                          std::string("a\0", 2), std::string(ckpt::max_name_length + 1, 'x'), std::string("__ckpt.v"), std::string("__ckpt"),
                          std::string("a.\xc3\xa9..b"), std::string("\xc3\xa9/x"), std::string(ckpt::max_name_length, '.'),
                          std::string("\xff"), std::string("a\xc3"), std::string("\xc0\xaf"), std::string("\xed\xa0\x80")}) {
    CAPTURE(bad);
    CHECK_FALSE(ckpt::name_problem(bad).empty());
    CHECK_THROWS_AS(ckpt::validate_name(bad), ckpt::error);
  }
  try {
    ckpt::validate_name(std::string("bad\nname"));
  } catch (const ckpt::error& e) {
    CHECK(std::string(e.what()) == "invalid name 'bad\\x0aname': contains a control character");
  }
  try {
    ckpt::validate_name(std::string(1 << 20, 'y'));  // a 1 MiB name is rejected with a short message
  } catch (const ckpt::error& e) {
    CHECK(std::string(e.what()).size() < 400);
  }
}

TEST_CASE("name_set and visitor: room made beforehand keeps every name, and a visit of that many tensors moves none") {
  // Reserved after some names are in: those stay found, and more than reserved still fit.
  ckpt::detail::name_set seen;
  for (int i = 0; i < 100; ++i) REQUIRE(seen.insert("early." + std::to_string(i)));
  seen.reserve(5000, 5000 * 16);
  for (int i = 0; i < 100; ++i) CHECK_FALSE(seen.insert("early." + std::to_string(i)));
  for (int i = 0; i < 6000; ++i) REQUIRE(seen.insert("late." + std::to_string(i)));
  for (int i = 0; i < 6000; i += 13) CHECK_FALSE(seen.insert("late." + std::to_string(i)));
  CHECK(seen.size() == 6100);
  seen.reserve(10, 10);  // less than it holds: nothing changes
  CHECK_FALSE(seen.insert("late.5999"));
  CHECK(seen.size() == 6100);

  // A visitor told how many tensors to expect records them where it first put them.
  std::vector<std::vector<float>> ts(3000, std::vector<float>(2));
  ckpt::visitor v;
  v.reserve(ts.size());
  v.tensor("t0", ts[0]);
  const auto* first = v.tensors().data();
  for (std::size_t i = 1; i < ts.size(); ++i) v.tensor("t" + std::to_string(i), ts[i]);
  CHECK(v.tensors().data() == first);
  CHECK(v.tensors().size() == ts.size());
  CHECK_THROWS_WITH_AS(v.tensor("t17", ts[17]), doctest::Contains("names 't17' twice"), ckpt::error);
}

TEST_CASE("name_set: a name is refused the second time, across the table's growth") {
  ckpt::detail::name_set seen;
  CHECK(seen.insert(""));
  CHECK_FALSE(seen.insert(""));
  // Names that are prefixes of one another, or differ in their last byte, are all distinct.
  for (const char* n : {"a", "a.b", "a.bc", "a.bd", "b"}) CHECK(seen.insert(n));
  for (const char* n : {"a", "a.b", "a.bc", "a.bd", "b"}) CHECK_FALSE(seen.insert(n));
  // 10,000 names make the table grow several times; each stays found afterwards.
  for (int i = 0; i < 10000; ++i) REQUIRE(seen.insert("layers." + std::to_string(i) + ".w"));
  CHECK(seen.size() == 10006);
  for (int i = 0; i < 10000; i += 7) CHECK_FALSE(seen.insert("layers." + std::to_string(i) + ".w"));
  CHECK(seen.insert("layers.10000.w"));
  CHECK(seen.size() == 10007);
  // Through the visitor: the same name twice is refused, naming it.
  ckpt::visitor v;
  float x = 0, y = 0;
  v.tensor("w", x);
  CHECK_THROWS_WITH_AS(v.tensor("w", y), "the state names 'w' twice", ckpt::error);
}

TEST_CASE("name_index: finds each name at its first position; absent names, empty and full indexes") {
  using ckpt::detail::name_index;
  const auto name_of = [](const std::string& s) -> std::string_view { return s; };
  std::vector<std::string> names;
  for (int i = 0; i < 5000; ++i) names.push_back("layers." + std::to_string(i / 3) + ".w" + std::to_string(i % 3));
  names.push_back("");
  names.push_back("layers.7.w1");  // listed twice: found where it first is (position 22)
  const name_index index(names, name_of);
  for (std::size_t k = 0; k + 1 < names.size(); ++k) REQUIRE(index.find(names[k], names, name_of) == k);
  CHECK(index.find("layers.7.w1", names, name_of) == 22);
  CHECK(index.find("", names, name_of) == 5000);
  for (const char* absent : {"layers.7.w", "layers.7.w10", "layers", "w", "layers.1667.w0"})
    CHECK(index.find(absent, names, name_of) == name_index::npos);
  CHECK(name_index().find("x", names, name_of) == name_index::npos);
  CHECK(name_index(std::vector<std::string>{}, name_of).find("", names, name_of) == name_index::npos);

  // Filled as it goes (the commit's merge): a name seen before answers where it was put.
  std::vector<std::string> seen;
  name_index growing(4);
  for (const char* n : {"a", "b", "a", "c", "b", "d"}) {
    const auto [at, fresh] = growing.try_add(n, seen.size(), seen, name_of);
    if (fresh) seen.push_back(n);
    CHECK(seen.at(at) == n);
  }
  CHECK(seen == std::vector<std::string>{"a", "b", "c", "d"});
  // Its capacity is what the caller promised: one more name is an error, not an overrun.
  CHECK_THROWS_AS(growing.try_add("e", seen.size(), seen, name_of), ckpt::error);
  CHECK(growing.try_add("d", seen.size(), seen, name_of) == std::pair<std::size_t, bool>{3, false});
  name_index without_capacity;
  CHECK_THROWS_AS(without_capacity.try_add("a", 0, seen, name_of), ckpt::error);
}

TEST_CASE("sort_by_name: the order std::sort gives (name, position) pairs, whatever the names") {
  using ckpt::detail::named_position;
  const auto agrees = [](std::vector<named_position> items) {
    auto expected = items;
    std::sort(expected.begin(), expected.end());
    ckpt::detail::sort_by_name(items);
    return items == expected;
  };
  CHECK(agrees({}));
  CHECK(agrees({{"only", 0}}));
  // Names that are prefixes of one another, the empty name, bytes above 0x7f (which sort after
  // ASCII, as unsigned bytes), and the same name at several positions.
  std::vector<std::string> pool = {"", "a", "a.b", "a.b.c", "a.bc", "ab", "b", "\xc3\xa9", "\xff", "a\x01", "layers.10.w",
                                   "layers.1.w", "layers.1", "layers.2.w", "layers.100.w", "layers.1.w"};
  std::vector<named_position> mixed;
  for (std::size_t i = 0; i < pool.size(); ++i) mixed.emplace_back(pool[i], 100 - i);
  CHECK(agrees(mixed));
  // Many names sharing long prefixes (a mixture-of-experts model), shuffled, with repeats; and
  // thousands of copies of one name (the equal part ends with the names).
  std::mt19937_64 g(7);
  std::vector<std::string> names;
  for (int i = 0; i < 20000; ++i) names.push_back("layers." + std::to_string(g() % 61) + ".experts." + std::to_string(g() % 256) + ".w" + std::to_string(g() % 3));
  for (int i = 0; i < 3000; ++i) names.push_back(std::string(1 + g() % 40, static_cast<char>('a' + g() % 3)));
  for (int i = 0; i < 5000; ++i) names.push_back("same.name");
  std::shuffle(names.begin(), names.end(), g);
  std::vector<named_position> many;
  for (std::size_t i = 0; i < names.size(); ++i) many.emplace_back(names[i], g() % 1000);
  CHECK(agrees(many));
}

TEST_CASE("tags are single safe path components") {
  for (const char* ok : {"global_step200", "best", "v1.2-final"}) CHECK(ckpt::tag_problem(ok).empty());
  for (const char* bad : {"", "..", ".x", "a/b", "/abs", "latest", "a b", "a\\b"}) {
    CAPTURE(bad);
    CHECK_FALSE(ckpt::tag_problem(bad).empty());
  }
  CHECK(ckpt::default_tag(200) == "global_step200");
}

TEST_CASE("storage keys never leave the root") {
  using ckpt::detail::check_key;
  CHECK_NOTHROW(check_key("global_step1/mp_rank_00/model_optim_rng.ckpt"));
  for (const char* bad : {"", "/etc/passwd", "a/../b", "..", "a//b", "a/./b", "a/", "a\\b"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(check_key(bad), ckpt::error);
  }
  CHECK_NOTHROW(check_key("", true));
}

TEST_CASE("tensor_ref checks element counts and views check sizes") {
  std::vector<float> v(6);
  CHECK(ckpt::view(v, {2, 3}).nbytes() == 24);
  CHECK_THROWS_AS(ckpt::view(v, {4, 2}), ckpt::error);
  float x = 0;
  // The constructor refuses an overflowing shape at once; view keeps it with its problem, for
  // v.tensor to refuse naming the tensor (test_shapes.cpp).
  const ckpt::shape_t too_many{std::uint64_t{1} << 40, std::uint64_t{1} << 40}, too_large{std::uint64_t{1} << 62, 2};
  const auto e = test::catch_error([&] { ckpt::tensor_ref(ckpt::dtype::f32, too_many, &x); });
  CHECK(std::string(e.what()).find("overflows 64 bits") != std::string::npos);
  CHECK_THROWS_AS(ckpt::tensor_ref(ckpt::dtype::f32, too_large, &x), ckpt::error);  // bytes overflow
  CHECK(ckpt::view(&x, too_many).problem().find("element count overflows 64 bits") != std::string::npos);
  CHECK(ckpt::view(&x, too_large).problem().find("size in bytes overflows 64 bits") != std::string::npos);
  CHECK(ckpt::view(&x, too_large).nbytes() == 0);
}
