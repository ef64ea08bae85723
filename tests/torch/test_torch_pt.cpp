// Unit tests of the PyTorch .pt interop: the zip layer, the pickle layer (round trips, byte
// equality with CPython and torch 1.13, hostile input) and .pt files written and read in C++.
// check_torch.py compares the same code against the real torch.

#include <doctest/doctest.h>

#include <ckpt/interop/torch.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "../helpers.hpp"

namespace {

namespace fs = std::filesystem;
using ckpt::dtype;
using ckpt::interop::host_tensor;
using ckpt::interop::py_kind;
using ckpt::interop::py_object;
using ckpt::interop::py_tensor;
using test::catch_error;

/// Bytes from text in which "\xNN" (backslash, x, two hex digits, as Python prints bytes)
/// stands for one byte; expected pickles are copied from Python in that form.
std::vector<std::byte> py_bytes(std::string_view text) {
  std::vector<std::byte> out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 3 < text.size() && text[i + 1] == 'x') {
      out.push_back(static_cast<std::byte>(std::stoi(std::string(text.substr(i + 2, 2)), nullptr, 16)));
      i += 3;
    } else {
      out.push_back(static_cast<std::byte>(text[i]));
    }
  }
  return out;
}
std::vector<std::byte> bytes_of(std::string_view s) {
  return std::vector<std::byte>(reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size());
}
std::string text_of(std::span<const std::byte> b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); }

std::vector<std::byte> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return bytes_of(s);
}
void write_file(const fs::path& p, std::span<const std::byte> b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
std::uint64_t get_le(const std::vector<std::byte>& b, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<std::uint8_t>(b[at + static_cast<std::size_t>(i)]);
  return v;
}
void set_le(std::vector<std::byte>& b, std::size_t at, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b[at + static_cast<std::size_t>(i)] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

/// A test payload: `n` bytes that differ with `seed`.
std::vector<std::byte> payload(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 31 + seed * 17 + (i >> 8)) & 0xff);
  return v;
}

bool contains(const std::string& haystack, const std::string& needle) { return haystack.find(needle) != std::string::npos; }

std::size_t files_in(const fs::path& dir) {
  return static_cast<std::size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

/// A float32 tensor with values 0, 1, 2, ...
host_tensor iota_f32(ckpt::shape_t shape) {
  host_tensor t{dtype::f32, std::move(shape), {}};
  t.data.resize(t.numel() * 4);
  for (std::uint64_t i = 0; i < t.numel(); ++i) {
    const float v = static_cast<float>(i);
    std::memcpy(t.data.data() + i * 4, &v, 4);
  }
  return t;
}
std::vector<float> floats(const host_tensor& t) {
  REQUIRE(t.type == dtype::f32);
  std::vector<float> v(t.numel());
  REQUIRE(t.data.size() == v.size() * 4);
  std::memcpy(v.data(), t.data.data(), t.data.size());
  return v;
}

// ---- pickle building blocks for hostile input -----------------------------------------

/// A string literal with its embedded NUL bytes (a plain `const char*` would stop at the first).
template <std::size_t N>
std::string raw(const char (&s)[N]) {
  return std::string(s, N - 1);
}
std::string le_bytes(std::uint64_t v, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}
std::string binunicode(std::string_view s) { return "X" + le_bytes(s.size(), 4) + std::string(s); }
std::string long8(std::uint64_t v) { return "\x8a\x08" + le_bytes(v, 8); }
std::string dims(const std::vector<std::uint64_t>& d) {
  std::string s = "(";
  for (auto x : d) s += long8(x);
  return s + "t";
}
/// `{'w': _rebuild_tensor_v2(('storage', torch.<type>, '0', 'cpu', numel), offset, shape, stride, False, OrderedDict())}`
/// written opcode by opcode, so views the pickler would refuse can be built.
std::string tensor_pickle(const std::string& type, std::uint64_t numel, std::uint64_t offset,
                          const std::vector<std::uint64_t>& shape, const std::vector<std::uint64_t>& stride) {
  return "\x80\x02}" + binunicode("w") + "ctorch._utils\n_rebuild_tensor_v2\n((" + binunicode("storage") + "ctorch\n" + type +
         "\n" + binunicode("0") + binunicode("cpu") + long8(numel) + "tQ" + long8(offset) + dims(shape) + dims(stride) +
         "\x89" "ccollections\nOrderedDict\n)Rt" "Rs.";
}

ckpt::error unpickle_error(const std::string& pkl) {
  return catch_error([&] { ckpt::interop::unpickle(bytes_of(pkl), "evil.pkl"); });
}

/// A .pt archive made by hand: `data.pkl` plus raw storage records.
void write_pt(const fs::path& path, const std::string& pkl,
              const std::vector<std::pair<std::string, std::vector<std::byte>>>& records) {
  ckpt::interop::zip_writer z(path);
  z.add("archive/data.pkl", bytes_of(pkl));
  for (const auto& [key, bytes] : records) z.add("archive/data/" + key, bytes);
  z.add("archive/version", bytes_of("3\n"));
  z.finish();
}

}  // namespace

// ======================================= zip ============================================

TEST_CASE("zip: entries round-trip, data is 64-byte aligned, CRC-32 is checked on read") {
  for (bool force64 : {false, true}) {
    CAPTURE(force64);
    test::temp_dir dir;
    const auto path = dir.path() / "a.zip";
    const std::vector<std::pair<std::string, std::size_t>> spec = {
        {"top/empty", 0}, {"top/one", 1}, {"top/odd", 1001}, {"top/big", 300000}, {"top/caf\xc3\xa9", 63}, {"x", 64}};
    {
      ckpt::interop::zip_writer z(path, {.force_zip64 = force64});
      unsigned seed = 0;
      for (const auto& [name, size] : spec) {
        const auto data = payload(size, seed++);
        if (size > 1000) {  // streamed in uneven pieces
          z.begin(name, size);
          for (std::size_t at = 0; at < size; at += 777) z.write(std::span(data).subspan(at, std::min<std::size_t>(777, size - at)));
          z.end();
        } else {
          z.add(name, data);
        }
      }
      CHECK(!fs::exists(path));  // nothing is published before finish()
      z.finish();
    }
    CHECK(files_in(dir.path()) == 1);  // no temporary left behind
    ckpt::interop::zip_reader r(path);
    REQUIRE(r.entries().size() == spec.size());
    unsigned seed = 0;
    for (std::size_t i = 0; i < spec.size(); ++i) {
      const auto& e = r.entries()[i];
      CHECK(e.name == spec[i].first);
      CHECK(e.size == spec[i].second);
      CHECK(e.data_offset % 64 == 0);
      const auto want = payload(spec[i].second, seed++);
      CHECK(r.read(e.name) == want);
      if (e.size > 10) {
        std::vector<std::byte> part(5);
        r.read_at(e, 3, part);
        CHECK(std::equal(part.begin(), part.end(), want.begin() + 3));
      }
    }
    CHECK(r.find("top/missing") == nullptr);
    CHECK(catch_error([&] { r.read("top/missing"); }).kind() == ckpt::error_kind::not_found);
    const auto raw = read_file(path);
    const bool has_zip64_end = raw.size() > 98 && get_le(raw, raw.size() - 22 - 20, 4) == 0x07064b50;
    CHECK(has_zip64_end == force64);
  }
}

TEST_CASE("zip: more than 65535 entries switch to ZIP64 end records") {
  test::temp_dir dir;
  const auto path = dir.path() / "many.zip";
  constexpr std::size_t n = 65600;
  {
    ckpt::interop::zip_writer z(path);
    for (std::size_t i = 0; i < n; ++i) z.add("e/" + std::to_string(i), i % 1000 == 0 ? payload(3, static_cast<unsigned>(i)) : std::vector<std::byte>{});
    z.finish();
  }
  const auto raw = read_file(path);
  CHECK(get_le(raw, raw.size() - 22 + 10, 2) == 0xffff);  // the classic record defers to ZIP64
  ckpt::interop::zip_reader r(path);
  CHECK(r.entries().size() == n);
  CHECK(r.read("e/65000") == payload(3, 65000));
  CHECK(r.at("e/65599").size == 0);
}

TEST_CASE("zip: a flipped data byte fails the CRC-32 check, naming the entry") {
  test::temp_dir dir;
  const auto path = dir.path() / "crc.zip";
  {
    ckpt::interop::zip_writer z(path);
    z.add("a/first", payload(100, 1));
    z.add("a/second", payload(100, 2));
    z.finish();
  }
  auto raw = read_file(path);
  ckpt::interop::zip_reader before(path);
  const auto off = before.at("a/second").data_offset;
  raw[off + 50] ^= std::byte{0x01};
  write_file(path, raw);
  ckpt::interop::zip_reader r(path);
  CHECK(r.read("a/first") == payload(100, 1));
  const auto e = catch_error([&] { r.read("a/second"); });
  CHECK(e.kind() == ckpt::error_kind::corrupt);
  CHECK(contains(e.what(), "'a/second'"));
  CHECK(contains(e.what(), "CRC-32 mismatch"));
  CHECK(contains(e.what(), path.string()));
}

TEST_CASE("zip: hostile archives are refused before anything is read past the file") {
  test::temp_dir dir;
  const auto path = dir.path() / "h.zip";
  {
    ckpt::interop::zip_writer z(path);
    z.add("a/1", payload(100, 1));
    z.add("a/2", payload(200, 2));
    z.finish();
  }
  const auto good = read_file(path);
  const std::size_t eocd = good.size() - 22;
  const std::size_t cd = get_le(good, eocd + 16, 4);
  const std::size_t cd2 = cd + 46 + 3 + get_le(good, cd + 30, 2);  // second central entry
  auto expect = [&](std::vector<std::byte> bytes, std::initializer_list<const char*> needles) {
    write_file(path, bytes);
    const auto e = catch_error([&] { ckpt::interop::zip_reader r(path); });
    CHECK(e.kind() == ckpt::error_kind::corrupt);
    CHECK(contains(e.what(), path.string()));
    for (const char* n : needles) CHECK_MESSAGE(contains(e.what(), n), std::string(e.what()));
  };
  SUBCASE("entry whose local header offset is beyond the file") {
    auto b = good;
    set_le(b, cd2 + 42, 0x7fffffff, 4);
    expect(b, {"'a/2'", "local header offset 2147483647", "file size"});
  }
  SUBCASE("central directory beyond the file") {
    auto b = good;
    set_le(b, eocd + 16, 0x10000000, 4);
    expect(b, {"central directory at offset 268435456"});
  }
  SUBCASE("entry count larger than the central directory") {
    auto b = good;
    set_le(b, eocd + 8, 0xfff0, 2);
    set_le(b, eocd + 10, 0xfff0, 2);
    expect(b, {"claims 65520 entries"});
  }
  SUBCASE("entry data running past the central directory") {
    auto b = good;
    set_le(b, cd2 + 20, 0x100000, 4);
    set_le(b, cd2 + 24, 0x100000, 4);
    expect(b, {"'a/2'", "runs past the central directory"});
  }
  SUBCASE("overlapping entries") {
    auto b = good;
    set_le(b, cd + 20, 150, 4);
    set_le(b, cd + 24, 150, 4);
    expect(b, {"'a/1'", "'a/2'", "overlap"});
  }
  SUBCASE("compressed entry") {
    auto b = good;
    set_le(b, cd + 10, 8, 2);
    expect(b, {"'a/1'", "compression method 8"});
  }
  SUBCASE("duplicate names") {
    auto b = good;
    b[cd2 + 46 + 2] = std::byte{'1'};
    expect(b, {"'a/1'", "appears twice"});
  }
  SUBCASE("truncated archive") {
    auto b = good;
    b.resize(b.size() - 5);
    expect(b, {"no end-of-central-directory record"});
  }
  SUBCASE("not a zip at all") { expect(bytes_of("hello, this is text and no archive at all"), {"not a zip archive"}); }
}

TEST_CASE("zip writer: an abandoned or failed archive leaves nothing behind") {
  test::temp_dir dir;
  const auto path = dir.path() / "w.zip";
  {
    ckpt::interop::zip_writer z(path);
    z.add("a/1", payload(10, 1));
  }  // destroyed without finish()
  CHECK(files_in(dir.path()) == 0);
  {
    ckpt::interop::zip_writer z(path);
    z.begin("a/1", 10);
    z.write(payload(5, 1));
    const auto e = catch_error([&] { z.end(); });
    CHECK(e.kind() == ckpt::error_kind::invalid_argument);
    CHECK(contains(e.what(), "declared 10 bytes, got 5"));
    CHECK(contains(catch_error([&] { z.write(payload(6, 1)); }).what(), "got more"));
    CHECK(contains(catch_error([&] { z.add("a/1", {}); }).what(), "was not ended"));
  }
  CHECK(files_in(dir.path()) == 0);
  {
    ckpt::interop::zip_writer z(path);
    z.add("a/1", {});
    CHECK(contains(catch_error([&] { z.add("a/1", {}); }).what(), "written twice"));
  }
  CHECK(files_in(dir.path()) == 0);
  CHECK(catch_error([&] { ckpt::interop::zip_writer z(dir.path() / "no/such/dir/x.zip"); }).kind() == ckpt::error_kind::io);
}

// ====================================== pickle ==========================================

namespace {
py_object tensor_node(dtype t, ckpt::shape_t shape, std::string key, std::uint64_t numel, std::uint64_t offset,
                      std::vector<std::uint64_t> stride, bool grad = false) {
  py_tensor x;
  x.value.type = t;
  x.value.shape = std::move(shape);
  x.storage = {std::move(key), numel, "cpu", offset, std::move(stride)};
  x.requires_grad = grad;
  return py_object(std::move(x));
}
}  // namespace

TEST_CASE("pickle: every py_object kind round-trips") {
  py_object many = py_object::list();
  for (int i = 0; i < 2345; ++i) many.append(i % 7 == 0 ? py_object("s" + std::to_string(i)) : py_object(static_cast<std::int64_t>(i) * 1000003));
  const py_object root = py_object::dict({
      {"none", nullptr},
      {"bools", py_object::list({true, false})},
      {"ints", py_object::list({0, 1, 255, 256, 65535, 65536, -1, -128, -129, -32768, 2147483647, -2147483648LL,
                                2147483648LL, -2147483649LL, std::int64_t{1} << 40, -(std::int64_t{1} << 40),
                                std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min()})},
      {"floats", py_object::list({0.0, -0.0, 1.5, -1e-300, 1e300, std::numeric_limits<double>::infinity(),
                                  std::numeric_limits<double>::quiet_NaN(), 0.1f})},
      {"strings", py_object::list({"", "ascii", "h\xc3\xa9llo \xe2\x98\x83 \xf0\x9f\x98\x80", std::string(70000, 'z')})},
      {"bytes", py_object::list({py_object::bytes(""), py_object::bytes(std::string_view("\x00\x01\x7f\x80\xff", 5))})},
      {"tuples", py_object::list({py_object::tuple(), py_object::tuple({1}), py_object::tuple({1, 2}),
                                  py_object::tuple({1, 2, 3}), py_object::tuple({1, 2, 3, 4, py_object::tuple({5})})})},
      {"many", many},
      {"keys", py_object::dict({{1, "int"}, {-7, "neg"}, {py_object::tuple({1, "a"}), "tuple"}, {nullptr, "none"},
                                {2.5, "float"}, {py_object::bytes("k"), "bytes"}})},
      {"od", py_object::ordered_dict({{"z", 1}, {"a", 2}})},
      {"tensors", py_object::list({tensor_node(dtype::f32, {2, 3}, "0", 6, 0, {3, 1}),
                                   tensor_node(dtype::bf16, {3, 2}, "0", 6, 0, {1, 3}, true),
                                   tensor_node(dtype::i64, {}, "7", 10, 9, {}),
                                   tensor_node(dtype::boolean, {0, 4}, "x_y-1", 0, 0, {4, 1}),
                                   tensor_node(dtype::u8, {2, 2, 2, 2}, "2", 100, 3, {16, 8, 2, 1})})},
      {"empty", py_object::dict({{"l", py_object::list()}, {"d", py_object::dict()}, {"t", py_object::tuple()}})},
  });
  const auto pkl = ckpt::interop::pickle(root);
  const py_object back = ckpt::interop::unpickle(pkl, "roundtrip");
  CHECK(back == root);
  CHECK(back.repr() == root.repr());
  CHECK(back.at("od").is_ordered_dict());
  CHECK(!back.is_ordered_dict());
  CHECK(back.at("keys").at(1).as_str() == "int");
  CHECK(back.at("keys").at(py_object::tuple({1, "a"})).as_str() == "tuple");
  CHECK(back.at("keys").at(2.5).as_str() == "float");
  CHECK(std::isnan(back.at("floats").at(6).as_float()));
  CHECK(std::signbit(back.at("floats").at(1).as_float()));
  const auto& tensors = back.at("tensors").items();
  const auto& orig = root.at("tensors").items();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    CHECK(tensors[i].as_tensor().storage == orig[i].as_tensor().storage);
    CHECK(tensors[i].as_tensor().requires_grad == orig[i].as_tensor().requires_grad);
  }
  CHECK(back.at("tensors").at(1).as_tensor().value.type == dtype::bf16);
  CHECK(back.at("many").size() == 2345);
}

TEST_CASE("pickle: the classes of plain data round-trip with their classes") {
  using ckpt::interop::py_class;
  const auto ns = py_object::dict({{"lr", 0.5}, {"name", "x"}}).with_class(py_class::argparse_namespace);
  const auto array = py_object::tuple({py_object("<u4").with_class(py_class::numpy_dtype), py_object::tuple({2}),
                                       py_object::bytes(raw("\x01\x00\x00\x00\xff\xff\xff\xff"))})
                         .with_class(py_class::numpy_array);
  const auto tree = py_object::dict({{"args", ns},
                                     {"names", py_object::list({"a", "b"}).with_class(py_class::set)},
                                     {"frozen", py_object::list({1}).with_class(py_class::frozenset)},
                                     {"shape", py_object::tuple({3, 4}).with_class(py_class::torch_size)},
                                     {"dtype", py_object("bfloat16").with_class(py_class::torch_dtype)},
                                     {"np", py_object::tuple({"MT19937", array, 624, 0, 0.0})}});
  const auto back = ckpt::interop::unpickle(ckpt::interop::pickle(tree), "round.pkl");
  CHECK(back == tree);
  CHECK(back.at("args").python_class() == py_class::argparse_namespace);
  CHECK(back.at("names").python_class() == py_class::set);
  CHECK(back.at("frozen").python_class() == py_class::frozenset);
  CHECK(back.at("shape").python_class() == py_class::torch_size);
  CHECK(back.at("dtype").python_class() == py_class::torch_dtype);
  CHECK(back.at("np").items()[1].python_class() == py_class::numpy_array);
  CHECK(back.at("np").items()[1].items()[0].python_class() == py_class::numpy_dtype);
}

TEST_CASE("unpickle: equal dict keys merge as in Python, keeping the first key and position") {
  std::string one;
  for (int i = 0; i < 8; ++i) one += static_cast<char>(i == 0 ? 0x3f : i == 1 ? 0xf0 : 0);  // 1.0, big-endian
  const auto d = ckpt::interop::unpickle(
      bytes_of("}(" + binunicode("a") + "K\x01" + binunicode("a") + "K\x02" + "K\x01K\x03" + "\x88K\x04" + "G" + one +
               "K\x05" + "(K\x01" + binunicode("a") + "tK\x06" + "(\x88" + binunicode("a") + "tK\x07" + "u."),
      "keys");
  REQUIRE(d.size() == 3);
  CHECK(d.entries()[0].first.as_str() == "a");
  CHECK(d.entries()[0].second.as_int() == 2);
  CHECK(d.entries()[1].first.is_int());  // the key 1 stays, True and 1.0 only replace its value
  CHECK(d.entries()[1].second.as_int() == 5);
  CHECK(d.entries()[2].first.is_tuple());
  CHECK(d.entries()[2].second.as_int() == 7);
  CHECK(d.at(1.0).as_int() == 5);
  CHECK(d.at(true).as_int() == 5);
  CHECK(!d.contains(std::numeric_limits<double>::quiet_NaN()));
  CHECK(!py_object::key_equal(py_object((std::int64_t{1} << 53) + 1), py_object(9007199254740992.0)));
}

TEST_CASE("pickle: bytes are exactly what CPython and torch 1.13 write") {
  // pickle.dumps([...], protocol=2) in CPython 3.11.
  const py_object values = py_object::list({-1, 300, 70000, -70000, std::int64_t{1} << 40, std::numeric_limits<std::int64_t>::min(),
                                            std::numeric_limits<std::int64_t>::max(), 1.5, "\xc3\xa9", py_object::tuple(),
                                            py_object::tuple({1}), py_object::tuple({1, 2, 3, 4}), nullptr, true,
                                            py_object::bytes(""), py_object::bytes("\xff" "a")});
  CHECK(ckpt::interop::pickle(values) ==
        py_bytes(R"(\x80\x02]q\x00(J\xff\xff\xff\xffM,\x01Jp\x11\x01\x00J\x90\xee\xfe\xff\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7fG\x3f\xf8\x00\x00\x00\x00\x00\x00X\x02\x00\x00\x00\xc3\xa9q\x01)K\x01\x85q\x02(K\x01K\x02K\x03K\x04tq\x03N\x88c__builtin__\x0abytes\x0aq\x04)Rq\x05c_codecs\x0aencode\x0aq\x06X\x03\x00\x00\x00\xc3\xbfaq\x07X\x06\x00\x00\x00latin1q\x08\x86q\x09Rq\x0ae.)"));
  CHECK(ckpt::interop::pickle(py_object::ordered_dict({{"a", 1}, {"b", py_object::list({2})}})) ==
        py_bytes(R"(\x80\x02ccollections\x0aOrderedDict\x0aq\x00)Rq\x01(X\x01\x00\x00\x00aq\x02K\x01X\x01\x00\x00\x00bq\x03]q\x04K\x02au.)"));
  // data.pkl of torch.save({'w': torch.zeros(2, 3), 'b': torch.zeros(3, dtype=torch.bfloat16)}) in torch 1.13.
  const py_object state = py_object::dict({{"w", tensor_node(dtype::f32, {2, 3}, "0", 6, 0, {3, 1})},
                                           {"b", tensor_node(dtype::bf16, {3}, "1", 3, 0, {1})}});
  CHECK(ckpt::interop::pickle(state) ==
        py_bytes(R"(\x80\x02}q\x00(X\x01\x00\x00\x00wq\x01ctorch._utils\x0a_rebuild_tensor_v2\x0aq\x02((X\x07\x00\x00\x00storageq\x03ctorch\x0aFloatStorage\x0aq\x04X\x01\x00\x00\x000q\x05X\x03\x00\x00\x00cpuq\x06K\x06tq\x07QK\x00K\x02K\x03\x86q\x08K\x03K\x01\x86q\x09\x89ccollections\x0aOrderedDict\x0aq\x0a)Rq\x0btq\x0cRq\x0dX\x01\x00\x00\x00bq\x0eh\x02((h\x03ctorch\x0aBFloat16Storage\x0aq\x0fX\x01\x00\x00\x001q\x10h\x06K\x03tq\x11QK\x00K\x03\x85q\x12K\x01\x85q\x13\x89h\x0a)Rq\x14tq\x15Rq\x16u.)"));
}

TEST_CASE("pickle: the pickler refuses trees Python could not load") {
  auto msg = [](const py_object& o) { return std::string(catch_error([&] { ckpt::interop::pickle(o); }).what()); };
  CHECK(contains(msg(py_object::dict({{py_object::list(), 1}})), "not hashable"));
  CHECK(contains(msg(py_object::dict({{"w", tensor_node(dtype::f32, {4}, "0", 3, 0, {1})}})), "['w']"));
  CHECK(contains(msg(py_object::dict({{"w", tensor_node(dtype::f32, {4}, "0", 3, 0, {1})}})), "holds 3 elements"));
  CHECK(contains(msg(py_object::dict({{"w", iota_f32({2})}})), "no storage record"));
  CHECK(contains(msg(std::string("\xff\xfe")), "not valid UTF-8"));
  py_object deep = py_object::list();
  for (int i = 0; i < 1200; ++i) deep = py_object::list({deep});
  CHECK(contains(msg(deep), "nesting deeper than 1000"));
}

TEST_CASE("py_object: building and querying") {
  py_object d = py_object::dict({{"iteration", 100}, {"lr", 0.5}, {"name", "x"}});
  CHECK(d.is_dict());
  CHECK(d.at("iteration").as_int() == 100);
  CHECK(d.at("iteration").as_float() == 100.0);  // ints read as floats too
  CHECK(d.size() == 3);
  d.set("iteration", 200);
  CHECK(d.at("iteration").as_int() == 200);
  CHECK(d.size() == 3);
  CHECK(d.find("missing") == nullptr);
  CHECK(!d.contains("missing"));
  const auto e1 = catch_error([&] { (void)d.at("missing"); });
  CHECK(e1.kind() == ckpt::error_kind::not_found);
  CHECK(contains(e1.what(), "'missing'"));
  const auto e2 = catch_error([&] { (void)d.at("name").as_int(); });
  CHECK(e2.kind() == ckpt::error_kind::mismatch);
  CHECK(contains(e2.what(), "expected int, got str"));
  CHECK(contains(catch_error([&] { (void)py_object(std::numeric_limits<std::uint64_t>::max()); }).what(), "does not fit"));
  py_object l = py_object::list({1, "two"});
  l.append(3.0);
  CHECK(l.at(2).as_float() == 3.0);
  CHECK(l.at(-1).as_float() == 3.0);  // negative indices count from the end, as in Python
  CHECK(contains(catch_error([&] { (void)l.at(9); }).what(), "index 9 out of range"));
  CHECK(py_object::dict({{1, "a"}, {true, "b"}}).size() == 1);  // 1 == True, as in Python
  CHECK(py_object(host_tensor{dtype::f32, {2}, std::vector<std::byte>(8)}).as_tensor().value.numel() == 2);
  CHECK(l.repr() == "[1, 'two', 3.0]");
}

TEST_CASE("unpickle: hostile pickles are refused with a message that names the problem") {
  auto expect = [](const std::string& pkl, std::initializer_list<const char*> needles) {
    const auto e = unpickle_error(pkl);
    CHECK(e.kind() == ckpt::error_kind::corrupt);
    CHECK(contains(e.what(), "evil.pkl"));
    for (const char* n : needles) CHECK_MESSAGE(contains(e.what(), n), std::string(e.what()));
  };
  SUBCASE("GLOBAL os.system + REDUCE") { expect("\x80\x02" "cos\nsystem\n" + binunicode("touch /tmp/pwned") + "\x85R.", {"'os.system' is not allowed"}); }
  SUBCASE("GLOBAL posix.system") { expect("cposix\nsystem\n.", {"'posix.system' is not allowed", "pickle offset 0"}); }
  SUBCASE("GLOBAL builtins.eval") { expect("\x80\x02" "cbuiltins\neval\n" + binunicode("1") + "\x85R.", {"'builtins.eval' is not allowed"}); }
  SUBCASE("STACK_GLOBAL builtins.exec") { expect("\x80\x04" + binunicode("builtins") + binunicode("exec") + "\x93.", {"'builtins.exec' is not allowed"}); }
  SUBCASE("INST, OBJ, NEWOBJ, EXT, PERSID") {
    expect("(ios\nsystem\n.", {"opcode INST is not allowed"});
    expect("(o.", {"opcode OBJ is not allowed"});
    expect("))\x81.", {"NEWOBJ may only make an allowed class, not a tuple"});
    expect("c__main__\nEvil\n)\x81.", {"'__main__.Evil' is not allowed"});
    expect("ctorch._utils\n_rebuild_tensor_v2\n)\x81.", {"NEWOBJ may not make 'torch._utils._rebuild_tensor_v2'"});
    expect("\x82\x01.", {"opcode EXT1 is not allowed"});
    expect("P0\n.", {"opcode PERSID is not allowed"});
  }
  SUBCASE("REDUCE of an allowed global with the wrong arity") {
    expect("ccollections\nOrderedDict\nK\x01K\x02\x86R.", {"collections.OrderedDict takes 0 to 1 arguments, got 2"});
    expect("ccollections\nOrderedDict\nK\x01\x85R.", {"collections.OrderedDict takes a list of (key, value) pairs, not a int"});
    expect("ctorch._utils\n_rebuild_tensor_v2\nK\x01K\x02\x86R.", {"_rebuild_tensor_v2 takes 6 to 7 arguments, got 2"});
    expect("ctorch._utils\n_rebuild_parameter\n)R.", {"_rebuild_parameter takes 3 arguments, got 0"});
  }
  SUBCASE("REDUCE of a non-callable") {
    expect("K\x01)R.", {"REDUCE may only call an allowed global, not a int"});
    expect("ctorch\nFloatStorage\n)R.", {"REDUCE may only call an allowed global", "'torch.FloatStorage'"});
  }
  SUBCASE("huge memo indices") {
    expect("h\xff.", {"memo index 255 was never stored (BINGET"});
    expect("j\xff\xff\xff\xff.", {"memo index 4294967295 was never stored (LONG_BINGET"});
    expect("Nr\xff\xff\xff\xff.", {"memo index 4294967295 skips past the 0 entries so far (LONG_BINPUT)"});
  }
  SUBCASE("lengths beyond the input") {
    expect("X\xff\xff\xff\x7f" "abc", {"needs 2147483647 bytes but only 3 remain"});
    expect("\x8d" + le_bytes(std::uint64_t{1} << 62, 8) + "abc", {"needs 4611686018427387904 bytes"});
    expect(raw("B\x10\x00\x00\x00" "abc"), {"needs 16 bytes but only 3 remain"});
  }
  SUBCASE("integers beyond 64 bits") {
    expect("\x8a\x09" + std::string(9, '\x01') + ".", {"integer of 9 bytes does not fit in 64 bits"});
    expect("\x8b\xff\xff\xff\xff.", {"integer of 4294967295 bytes does not fit in 64 bits"});
  }
  SUBCASE("deep nesting") {
    expect(std::string(5000, '(') + std::string(5000, 't') + ".", {"nesting deeper than 1000 levels"});
    expect(std::string(3000, ']') + std::string(2999, 'a') + ".", {"nesting deeper than 1000 levels"});
  }
  SUBCASE("a container that contains itself") { expect(raw("]q\x00h\x00" "a."), {"recursive structure"}); }
  SUBCASE("shared references that would expand exponentially") {
    std::string p = raw("]K\x01" "aq\x00");  // memo 0 = [1]
    for (int i = 1; i < 40; ++i) p += "(h" + std::string(1, static_cast<char>(i - 1)) + "h" + std::string(1, static_cast<char>(i - 1)) + "lq" + std::string(1, static_cast<char>(i));
    expect(p + ".", {"more than 4194304 objects"});
  }
  SUBCASE("shared references are counted before anything is built") {
    // memo 0 = [1] (2 objects); each level is a list of two references to the one before:
    // 1 + 2 x the level below, so 8 levels make 3 x 2^8 - 1 = 767 objects.
    std::string p = raw("]K\x01" "aq\x00");
    for (int i = 1; i <= 8; ++i) p += "(h" + std::string(1, static_cast<char>(i - 1)) + "h" + std::string(1, static_cast<char>(i - 1)) + "lq" + std::string(1, static_cast<char>(i));
    const auto e = catch_error([&] { ckpt::interop::unpickle(bytes_of(p + "."), "evil.pkl", {.max_objects = 766}); });
    CHECK(e.kind() == ckpt::error_kind::corrupt);
    CHECK_MESSAGE(contains(e.what(), "more than 766 objects (shared references included): 767"), std::string(e.what()));
    // At the limit: the whole result is built, every reference a copy.
    const auto ok = ckpt::interop::unpickle(bytes_of(p + "."), "evil.pkl", {.max_objects = 767});
    CHECK(ok.items().size() == 2);
    // The same expansion followed by a list that contains itself, [level 8, c] with c = [c]:
    // refused for its count too (769 objects before the cycle is reached), not built first.
    const std::string cyclic = p + "(h\x08" + "]q\x09h\x09" "a" + "l.";
    const auto c = catch_error([&] { ckpt::interop::unpickle(bytes_of(cyclic), "evil.pkl", {.max_objects = 766}); });
    CHECK_MESSAGE(contains(c.what(), "more than 766 objects (shared references included): 769"), std::string(c.what()));
    // Under a limit it does not reach (convert counts c a second time, then sees the cycle), the
    // cycle is what is reported.
    const auto r = catch_error([&] { ckpt::interop::unpickle(bytes_of(cyclic), "evil.pkl", {.max_objects = 770}); });
    CHECK_MESSAGE(contains(r.what(), "recursive structure"), std::string(r.what()));
  }
  SUBCASE("a long string referenced many times is refused before it is copied") {
    // 4 MiB of text, then a list holding it 300 times: 1.2 GiB of copies, over the 1 GiB limit.
    std::string p = "\x80\x02X";
    const std::uint32_t n = 4u << 20;
    for (int k = 0; k < 4; ++k) p += static_cast<char>((n >> (8 * k)) & 0xff);
    p += std::string(n, 'x') + "q" + std::string(1, '\0') + "(";
    for (int i = 0; i < 300; ++i) p += "h" + std::string(1, '\0');
    p += "l.";
    // The count in the message is the pre-check's: the list and 300 copies of the string.
    const auto bytes = 301 * sizeof(ckpt::interop::py_object) + 300 * std::uint64_t{n};
    expect(p, {"the result would exceed 1073741824 bytes (shared references are copied): "});
    CHECK(contains(unpickle_error(p).what(), "copied): " + std::to_string(bytes)));
  }
  SUBCASE("truncated pickles") {
    const auto good = text_of(ckpt::interop::pickle(py_object::dict({{"a", py_object::list({1, 2, "three"})}})));
    for (std::size_t cut = 1; cut < good.size(); ++cut) {
      CAPTURE(cut);
      const auto e = unpickle_error(good.substr(0, good.size() - cut));
      CHECK(e.kind() == ckpt::error_kind::corrupt);
      const std::string m = e.what();
      CHECK((contains(m, "truncated") || contains(m, "without a MARK") || contains(m, "empty stack")));
    }
  }
  SUBCASE("stack and mark misuse") {
    expect("a.", {"APPEND on an empty stack"});
    expect("Nu.", {"SETITEMS without a MARK"});
    expect("NK\x01" "a.", {"APPEND needs a list, not a None"});
    expect("}(K\x01u.", {"odd number"});
    expect("}]K\x01s.", {"dict key of type list is not hashable"});
  }
  SUBCASE("persistent ids other than storages") {
    expect("K\x01Q.", {"persistent id must be a 5-tuple"});
    expect("(" + binunicode("module") + "ctorch\nFloatStorage\n" + binunicode("0") + binunicode("cpu") + "K\x01tQ.",
           {"only persistent ids of storages are allowed"});
    expect("(" + binunicode("storage") + "ctorch\nFloatStorage\n" + binunicode("../etc/passwd") + binunicode("cpu") + "K\x01tQ.",
           {"storage key must be", "'../etc/passwd'"});
  }
  SUBCASE("BUILD on anything but an OrderedDict") { expect("]}b.", {"BUILD is only allowed on an OrderedDict"}); }
  SUBCASE("the plain data of training frameworks, misused") {
    const std::string ns = "cargparse\nNamespace\n)\x81";
    expect(ns + "]b.", {"BUILD state of an argparse.Namespace must be a dict, not a list"});
    expect(ns + "}K\x01K\x02sb.", {"argparse.Namespace attribute names must be strings, not a int"});
    expect("cargparse\nNamespace\n" + binunicode("x") + "\x85\x81.", {"argparse.Namespace takes 0 arguments, got 1"});
    expect("ccollections\ndefaultdict\nK\x01\x85R.", {"default factory may only be None or a builtin type"});
    expect("ccollections\ndefaultdict\ncposix\nsystem\n\x85R.", {"'posix.system' is not allowed"});
    expect("cbuiltins\nlist\n.", {"'builtins.list' cannot be used as a value"});
    expect("cbuiltins\nset\nK\x01\x85R.", {"builtins.set takes a list of its elements, not a int"});
    expect("cbuiltins\nset\n]]a\x85R.", {"not hashable"});
    expect("ctorch\nSize\n(J\xff\xff\xff\xfft\x85R.", {"torch.Size must be a non-negative int"});
    expect("ccopyreg\n_reconstructor\ncargparse\nNamespace\ncbuiltins\nlist\nN\x87R.",
           {"only allowed as copyreg._reconstructor(cls, object, None)"});
    expect("ccopyreg\n_reconstructor\ncposix\nsystem\n", {"'posix.system' is not allowed"});
    expect("\x8f(K\x01\x90](\x90.", {"ADDITEMS needs a set, not a list"});
  }
  SUBCASE("numpy arrays, dtypes and scalars that are not plain data") {
    // The opcodes numpy's pickling makes (protocol 2), piece by piece.
    const auto dtype = [](const std::string& code) { return "cnumpy\ndtype\n" + binunicode(code) + "\x89\x88\x87" "R"; };
    const std::string order = "(K\x03" + binunicode("<") + "NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK" + raw("\x00") + "tb";
    const std::string array = "cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK" + raw("\x00") + "\x85" "C\x01" "b\x87" "R";
    const std::string shape3 = "(K\x01K\x03\x85";
    expect(dtype("O8") + ".", {"numpy dtype 'O8' is not a numeric dtype"});
    expect(dtype("U5") + ".", {"numpy dtype 'U5' is not a numeric dtype"});
    expect(dtype("u4") + "(K\x03" + binunicode("?") + "tb.", {"byte order '?' is not one of"});
    // (1, shape (3,), dtype <u4, not Fortran, 3 bytes): 12 are needed
    expect(array + shape3 + dtype("u4") + order + "\x89" "C\x03" "abctb.", {"numpy array of shape [3] and dtype <u4 needs 12 bytes, its data has 3"});
    expect(array + shape3 + dtype("u4") + order + "\x89" "]tb.", {"numpy array data must be bytes (an object array is not data)"});

    expect(array + ".", {"a numpy array without its data (no BUILD)"});
    expect("cnumpy.core.multiarray\n_reconstruct\ncbuiltins\nlist\nK" + raw("\x00") + "\x85" "C\x01" "b\x87" "R.", {"may only make a numpy.ndarray"});
    expect("cnumpy.core.multiarray\nscalar\n" + dtype("f8") + order + "C\x03" "abc\x86" "R.", {"numpy scalar of dtype <f8 has 3 bytes, not 8"});
    expect("cnumpy.core.multiarray\nscalar\n" + dtype("c8") + order + "C\x08" "abcdefgh\x86" "R.", {"(complex) is not supported"});
  }
  SUBCASE("numpy's own names in numpy 2 are accepted too, and a scalar of every kind reads as its number") {
    const auto dtype = [](const std::string& code) { return "cnumpy\ndtype\n" + binunicode(code) + "\x89\x88\x87" "R"; };
    const auto scalar = [&](const std::string& code, const std::string& bytes) {
      return "cnumpy._core.multiarray\nscalar\n" + dtype(code) + "C" + std::string(1, static_cast<char>(bytes.size())) + bytes + "\x86" "R";
    };
    const auto r = ckpt::interop::unpickle(
        bytes_of("(" + scalar("i2", raw("\xfe\xff")) + scalar("u8", raw("\x07\x00\x00\x00\x00\x00\x00\x00")) +
                 scalar("f4", raw("\x00\x00\xc0\x3f")) + scalar("f2", raw("\x00\x38")) + scalar("b1", raw("\x01")) + "l."),
        "ok");
    REQUIRE(r.size() == 5);
    CHECK(r.items()[0].as_int() == -2);
    CHECK(r.items()[1].as_int() == 7);
    CHECK(r.items()[2].as_float() == 1.5);
    CHECK(r.items()[3].as_float() == 0.5);
    CHECK(r.items()[4].as_bool());
    const std::string order = "(K\x03" + binunicode("<") + "NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK" + raw("\x00") + "tb";
    const auto a = ckpt::interop::unpickle(
        bytes_of("cnumpy._core.multiarray\n_reconstruct\ncnumpy\nndarray\nK" + raw("\x00") + "\x85" "C\x01" "b\x87" "R" + "(K\x01K\x02\x85" +
                 dtype("i2") + order + "\x89" "C\x04" + raw("\x01\x00\xff\xff") + "tb."),
        "ok");
    CHECK(a.python_class() == ckpt::interop::py_class::numpy_array);
    CHECK(a.items()[0].as_str() == "<i2");
    CHECK(a.items()[0].python_class() == ckpt::interop::py_class::numpy_dtype);
    CHECK(a.items()[1] == py_object::tuple({2}));
    CHECK(a.items()[2] == py_object::bytes(raw("\x01\x00\xff\xff")));
  }
  SUBCASE("a valid tensor pickle built the same way is accepted") {
    const auto r = ckpt::interop::unpickle(bytes_of(tensor_pickle("HalfStorage", 6, 1, {2, 2}, {1, 2})), "ok");
    CHECK(r.at("w").as_tensor().value.type == dtype::f16);
    CHECK(r.at("w").as_tensor().storage.offset == 1);
  }
}

// ====================================== .pt files ======================================

TEST_CASE("torch: writer and loader round-trip values, views and shared storages") {
  test::temp_dir dir;
  const auto path = dir.path() / "m.pt";
  const std::vector<std::int16_t> shorts = {1, -2, 3};
  {
    ckpt::interop::torch_writer w(path);
    py_object base = w.add_tensor(iota_f32({4, 6}));
    py_tensor tr = base.as_tensor();  // the transpose, same storage
    tr.value.shape = {6, 4};
    tr.storage.stride = {1, 6};
    py_tensor slice = base.as_tensor();  // base[1:3, 2:5]
    slice.value.shape = {2, 3};
    slice.storage.offset = 8;
    slice.storage.stride = {6, 1};
    py_tensor col = base.as_tensor();  // base[:, 5]
    col.value.shape = {4};
    col.storage.offset = 5;
    col.storage.stride = {6};
    py_tensor bcast = base.as_tensor();  // base[0, :3] expanded to 2x3 (stride 0)
    bcast.value.shape = {2, 3};
    bcast.storage.stride = {0, 1};
    py_tensor scalar = base.as_tensor();  // base[3, 4] as a 0-d tensor
    scalar.value.shape = {};
    scalar.storage.offset = 22;
    scalar.storage.stride = {};
    w.finish(py_object::dict({
        {"base", base},
        {"views", py_object::list({tr, slice, col, bcast, scalar})},
        {"shorts", w.add_tensor(std::span<const std::int16_t>(shorts), {3})},
        {"inline", iota_f32({2, 2})},  // carries its own bytes: written by finish()
        {"empty", w.add_tensor(dtype::bf16, {0, 3}, {})},
        {"meta", py_object::dict({{"iteration", 7}, {"name", "gpt"}})},
    }));
  }
  CHECK(files_in(dir.path()) == 1);
  ckpt::interop::zip_reader z(path);
  CHECK(z.find("archive/data.pkl") != nullptr);
  CHECK(text_of(z.read("archive/version")) == "3\n");
  CHECK(text_of(z.read("archive/byteorder")) == "little");
  for (const auto& e : z.entries()) CHECK(e.data_offset % 64 == 0);

  const py_object r = ckpt::interop::load_torch(path);
  CHECK(floats(r.at("base").as_tensor().value) == floats(iota_f32({4, 6})));
  const auto& v = r.at("views").items();
  std::vector<float> t;
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 4; ++j) t.push_back(static_cast<float>(j * 6 + i));
  CHECK(v[0].as_tensor().value.shape == ckpt::shape_t{6, 4});
  CHECK(floats(v[0].as_tensor().value) == t);
  CHECK(floats(v[1].as_tensor().value) == std::vector<float>{8, 9, 10, 14, 15, 16});
  CHECK(floats(v[2].as_tensor().value) == std::vector<float>{5, 11, 17, 23});
  CHECK(floats(v[3].as_tensor().value) == std::vector<float>{0, 1, 2, 0, 1, 2});
  CHECK(floats(v[4].as_tensor().value) == std::vector<float>{22});
  CHECK(v[4].as_tensor().value.shape.empty());
  CHECK(v[1].as_tensor().storage.key == r.at("base").as_tensor().storage.key);
  const auto& s = r.at("shorts").as_tensor().value;
  CHECK(s.type == dtype::i16);
  CHECK(std::memcmp(s.data.data(), shorts.data(), 6) == 0);
  CHECK(floats(r.at("inline").as_tensor().value) == std::vector<float>{0, 1, 2, 3});
  CHECK(r.at("empty").as_tensor().value.shape == ckpt::shape_t{0, 3});
  CHECK(r.at("empty").as_tensor().value.data.empty());
  CHECK(r.at("meta").at("name").as_str() == "gpt");
}

/// `{'w': _rebuild_tensor_v3(('storage', torch.storage.UntypedStorage, '0', 'cpu', nbytes), offset,
/// shape, stride, False, OrderedDict(), torch.<dtype>)}`, as torch >= 2.1 pickles the dtypes
/// that have no storage class, written opcode by opcode.
std::string tensor_v3_pickle(const std::string& dtype_name, std::uint64_t nbytes, std::uint64_t offset,
                             const std::vector<std::uint64_t>& shape, const std::vector<std::uint64_t>& stride,
                             const std::string& storage_global = "torch.storage\nUntypedStorage") {
  return "\x80\x02}" + binunicode("w") + "ctorch._utils\n_rebuild_tensor_v3\n((" + binunicode("storage") + "c" +
         storage_global + "\n" + binunicode("0") + binunicode("cpu") + long8(nbytes) + "tQ" + long8(offset) + dims(shape) +
         dims(stride) + "\x89" "ccollections\nOrderedDict\n)R" "ctorch\n" + dtype_name + "\nt" "Rs.";
}

TEST_CASE("torch: u16, u32, u64 and FP8 tensors as torch >= 2.1 pickles them (_rebuild_tensor_v3)") {
  test::temp_dir dir;
  const auto path = dir.path() / "wide.pt";
  std::vector<std::byte> fp8(256), u64s(5 * 8), u16s(6 * 2);
  for (std::size_t i = 0; i < fp8.size(); ++i) fp8[i] = static_cast<std::byte>(i);
  const std::uint64_t extremes[] = {0, 1, std::uint64_t{1} << 63, (std::uint64_t{1} << 53) + 1, ~std::uint64_t{0}};
  std::memcpy(u64s.data(), extremes, sizeof extremes);
  for (std::size_t i = 0; i < u16s.size(); ++i) u16s[i] = static_cast<std::byte>(0xf0 + i);
  {
    ckpt::interop::torch_writer w(path);
    py_object e4 = w.add_tensor(dtype::f8_e4m3, {16, 16}, fp8);
    py_tensor col = e4.as_tensor();  // e4[:, 3]: a view in elements of the tensor's dtype
    col.value.shape = {16};
    col.storage.offset = 3;
    col.storage.stride = {16};
    w.finish(py_object::dict({{"e4m3", e4}, {"e4m3.col", col}, {"e5m2", w.add_tensor(dtype::f8_e5m2, {256}, fp8)},
                              {"u64", w.add_tensor(dtype::u64, {5}, u64s)}, {"u16", w.add_tensor(dtype::u16, {2, 3}, u16s)},
                              {"u32", w.add_tensor(dtype::u32, {0}, {})}}));
  }
  ckpt::interop::zip_reader z(path);
  const std::string pkl = text_of(z.read("archive/data.pkl"));
  CHECK(contains(pkl, "torch._utils\n_rebuild_tensor_v3\n"));
  CHECK(contains(pkl, "torch.storage\nUntypedStorage\n"));
  CHECK(contains(pkl, "torch\nfloat8_e4m3fn\n"));
  CHECK(contains(pkl, "torch\nfloat8_e5m2\n"));
  CHECK(contains(pkl, "torch\nuint64\n"));
  CHECK_FALSE(contains(pkl, "_rebuild_tensor_v2"));  // no dtype here has a storage class
  CHECK(z.read("archive/data/2").size() == 40);       // the u64 record: 5 elements x 8 bytes

  const py_object r = ckpt::interop::load_torch(path);
  const auto& a = r.at("e4m3").as_tensor().value;
  CHECK(a.type == dtype::f8_e4m3);
  CHECK(a.shape == ckpt::shape_t{16, 16});
  CHECK(a.data == fp8);
  const auto& c = r.at("e4m3.col").as_tensor();
  CHECK(c.storage.numel == 256);  // elements again, from the untyped storage's 256 bytes
  for (std::size_t i = 0; i < 16; ++i) CHECK(c.value.data[i] == fp8[3 + 16 * i]);
  CHECK(r.at("e5m2").as_tensor().value.type == dtype::f8_e5m2);
  CHECK(r.at("e5m2").as_tensor().value.data == fp8);
  CHECK(r.at("u64").as_tensor().value.type == dtype::u64);
  CHECK(r.at("u64").as_tensor().value.data == u64s);
  CHECK(r.at("u16").as_tensor().value.data == u16s);
  CHECK(r.at("u16").as_tensor().value.shape == ckpt::shape_t{2, 3});
  CHECK(r.at("u32").as_tensor().value.data.empty());

  // What torch 2.x itself writes, byte for byte the same form, including a dtype with a storage
  // class written the new way (torch does so for any dtype with a v3 rebuild).
  write_pt(path, tensor_v3_pickle("uint32", 12, 1, {2}, {1}), {{"0", std::vector<std::byte>(12, std::byte{0xab})}});
  const py_object back = ckpt::interop::load_torch(path);
  const auto& u = back.at("w").as_tensor().value;
  CHECK(u.type == dtype::u32);
  CHECK(u.data == std::vector<std::byte>(8, std::byte{0xab}));
  write_pt(path, tensor_v3_pickle("bfloat16", 4, 0, {2}, {1}), {{"0", std::vector<std::byte>(4)}});
  CHECK(ckpt::interop::load_torch(path).at("w").as_tensor().value.type == dtype::bf16);
}

TEST_CASE("torch: hostile _rebuild_tensor_v3 pickles are refused, naming the problem") {
  test::temp_dir dir;
  const auto path = dir.path() / "bad3.pt";
  auto expect = [&](ckpt::error_kind kind, std::initializer_list<const char*> needles) {
    const auto e = catch_error([&] { ckpt::interop::load_torch(path); });
    CHECK(e.kind() == kind);
    CHECK(contains(e.what(), path.string()));
    for (const char* n : needles) CHECK_MESSAGE(contains(e.what(), n), std::string(e.what()));
  };
  // An untyped storage whose bytes are not a whole number of elements.
  write_pt(path, tensor_v3_pickle("uint32", 10, 0, {2}, {1}), {{"0", std::vector<std::byte>(10)}});
  expect(ckpt::error_kind::corrupt, {"['w']", "untyped storage '0' of 10 bytes, not a multiple of 4"});
  // A view past the storage's end, counted in elements of the dtype.
  write_pt(path, tensor_v3_pickle("uint64", 16, 1, {2}, {1}), {{"0", std::vector<std::byte>(16)}});
  expect(ckpt::error_kind::corrupt, {"['w']", "reaches element 2", "holds 2 elements"});
  // A dtype ckpt has no dtype for, named as torch names it.
  write_pt(path, tensor_v3_pickle("float8_e4m3fnuz", 2, 0, {2}, {1}), {{"0", std::vector<std::byte>(2)}});
  expect(ckpt::error_kind::invalid_argument, {"tensor ['w']", "torch.float8_e4m3fnuz", "does not support", "float8_e4m3fn"});
  // v3 over a typed storage, and v2 over an untyped one: neither is what torch writes.
  write_pt(path, tensor_v3_pickle("uint8", 2, 0, {2}, {1}, "torch\nByteStorage"), {{"0", std::vector<std::byte>(2)}});
  expect(ckpt::error_kind::corrupt, {"_rebuild_tensor_v3 needs a torch.storage.UntypedStorage"});
  write_pt(path, tensor_pickle("UntypedStorage", 2, 0, {2}, {1}), {{"0", std::vector<std::byte>(2)}});  // torch.UntypedStorage
  expect(ckpt::error_kind::corrupt, {"cannot type an untyped storage"});
  // The dtype argument must be a torch dtype.
  std::string not_dtype = tensor_v3_pickle("uint8", 2, 0, {2}, {1});
  not_dtype.replace(not_dtype.find("ctorch\nuint8\n"), 13, binunicode("uint8"));
  write_pt(path, not_dtype, {{"0", std::vector<std::byte>(2)}});
  expect(ckpt::error_kind::corrupt, {"_rebuild_tensor_v3 needs a torch dtype"});
}

TEST_CASE("torch: ZIP64 and a custom archive folder load the same") {
  test::temp_dir dir;
  const auto path = dir.path() / "z.pt";
  ckpt::interop::save_torch(path, py_object::dict({{"w", iota_f32({3})}}),
                            {.archive_name = "mymodel", .zip = {.force_zip64 = true}});
  ckpt::interop::zip_reader z(path);
  CHECK(z.find("mymodel/data.pkl") != nullptr);
  CHECK(floats(ckpt::interop::load_torch(path).at("w").as_tensor().value) == std::vector<float>{0, 1, 2});
}

TEST_CASE("torch: a tensor streamed in pieces loads like one written whole") {
  test::temp_dir dir;
  const auto path = dir.path() / "s.pt";
  const auto whole = iota_f32({4, 6});
  {
    ckpt::interop::torch_writer w(path);
    py_object node = w.begin_tensor(dtype::f32, {4, 6});
    const std::span<const std::byte> bytes(whole.data);
    CHECK(contains(catch_error([&] { w.begin_tensor(dtype::f32, {1}); }).what(), "started before the last one ended"));
    w.write(bytes.subspan(0, 7));  // pieces need not be whole elements
    w.write(bytes.subspan(7, 40));
    w.write(bytes.subspan(47));
    w.end_tensor();
    CHECK(contains(catch_error([&] { w.write(bytes); }).what(), "write with no tensor started"));
    py_object short_one = w.begin_tensor(dtype::i64, {3});
    w.write(std::vector<std::byte>(8));
    CHECK(contains(catch_error([&] { w.end_tensor(); }).what(), "archive/data/1' declared 24 bytes, got 8"));
    (void)short_one;
  }
  CHECK(files_in(dir.path()) == 0);  // the writer above never finished
  {
    ckpt::interop::torch_writer w(path);
    py_object node = w.begin_tensor(dtype::f32, {4, 6});
    w.write(std::span<const std::byte>(whole.data));
    w.end_tensor();
    w.finish(py_object::dict({{"w", node}, {"step", 3}}));
  }
  const auto back = ckpt::interop::load_torch(path);
  CHECK(floats(back.at("w").as_tensor().value) == floats(whole));
  CHECK(back.at("w").as_tensor().value.shape == ckpt::shape_t{4, 6});
}

TEST_CASE("torch: a failed save leaves no file") {
  test::temp_dir dir;
  const auto path = dir.path() / "f.pt";
  {
    ckpt::interop::torch_writer w(path);
    py_object t = w.add_tensor(iota_f32({2}));
    t.as_tensor().storage.key = "99";
    const auto e = catch_error([&] { w.finish(py_object::dict({{"w", t}})); });
    CHECK(contains(e.what(), "tensor ['w'] refers to storage '99', which this writer did not write"));
  }
  {
    ckpt::interop::torch_writer w(path);
    const auto e = catch_error([&] { w.add_tensor(dtype::f32, {2, 3}, std::vector<std::byte>(20)); });
    CHECK(contains(e.what(), "needs 24 bytes, got 20"));
    CHECK(contains(catch_error([&] { w.finish(py_object::dict({{py_object::list(), 1}})); }).what(), "not hashable"));
  }
  CHECK(files_in(dir.path()) == 0);
  // An existing file survives a failed overwrite untouched.
  ckpt::interop::save_torch(path, py_object::dict({{"v", 1}}));
  {
    ckpt::interop::torch_writer w(path);
    w.add_tensor(iota_f32({100}));
  }
  CHECK(ckpt::interop::load_torch(path).at("v").as_int() == 1);
  CHECK(files_in(dir.path()) == 1);
}

TEST_CASE("torch: hostile and unsupported .pt files are refused, naming the file and the tensor") {
  test::temp_dir dir;
  const auto path = dir.path() / "bad.pt";
  auto expect = [&](ckpt::error_kind kind, std::initializer_list<const char*> needles) {
    const auto e = catch_error([&] { ckpt::interop::load_torch(path); });
    CHECK(e.kind() == kind);
    CHECK(contains(e.what(), path.string()));
    for (const char* n : needles) CHECK_MESSAGE(contains(e.what(), n), std::string(e.what()));
  };
  SUBCASE("storage record too small for the tensor") {
    write_pt(path, tensor_pickle("FloatStorage", 6, 0, {2, 3}, {3, 1}), {{"0", std::vector<std::byte>(20)}});
    expect(ckpt::error_kind::corrupt, {"tensor ['w']", "'archive/data/0' has 20 bytes", "needs 6 x 4 bytes"});
  }
  SUBCASE("storage record missing") {
    write_pt(path, tensor_pickle("FloatStorage", 6, 0, {2, 3}, {3, 1}), {});
    expect(ckpt::error_kind::corrupt, {"tensor ['w']", "'archive/data/0', which the archive lacks"});
  }
  SUBCASE("strides pointing outside the storage") {
    write_pt(path, tensor_pickle("FloatStorage", 6, 0, {3, 3}, {3, 1}), {{"0", std::vector<std::byte>(24)}});
    expect(ckpt::error_kind::corrupt, {"['w']", "reaches element 8", "holds 6 elements"});
  }
  SUBCASE("two tensors disagreeing about one storage") {
    const py_object root = py_object::dict({{"a", tensor_node(dtype::f32, {6}, "0", 6, 0, {1})},
                                            {"b", tensor_node(dtype::i32, {6}, "0", 6, 0, {1})}});
    write_pt(path, text_of(ckpt::interop::pickle(root)), {{"0", std::vector<std::byte>(24)}});
    expect(ckpt::error_kind::corrupt, {"tensor ['b'] shares storage '0' with ['a']", "i32 x 6 vs f32 x 6"});
  }
  SUBCASE("unsupported dtype") {
    write_pt(path, tensor_pickle("ComplexDoubleStorage", 2, 0, {2}, {1}), {{"0", std::vector<std::byte>(32)}});
    expect(ckpt::error_kind::invalid_argument, {"tensor ['w']", "'torch.ComplexDoubleStorage'", "does not support"});
  }
  SUBCASE("os.system inside a torch-like zip") {
    write_pt(path, "\x80\x02" "cposix\nsystem\n" + binunicode("touch /tmp/pwned") + "\x85R.", {});
    expect(ckpt::error_kind::corrupt, {"archive/data.pkl", "'posix.system' is not allowed"});
  }
  SUBCASE("flipped byte in a storage") {
    ckpt::interop::save_torch(path, py_object::dict({{"w", iota_f32({64})}}));
    auto raw = read_file(path);
    const auto off = ckpt::interop::zip_reader(path).at("archive/data/0").data_offset;
    raw[off + 17] ^= std::byte{0x10};
    write_file(path, raw);
    expect(ckpt::error_kind::corrupt, {"'archive/data/0'", "CRC-32 mismatch"});
  }
  SUBCASE("legacy torch.save format") {
    write_file(path, bytes_of(std::string("\x80\x02\x8a\x0a") + "legacy magic number and pickles follow"));
    expect(ckpt::error_kind::invalid_argument, {"legacy", "_use_new_zipfile_serialization=False"});
  }
  SUBCASE("not a zip") {
    write_file(path, bytes_of("{\"json\": true}"));
    expect(ckpt::error_kind::corrupt, {"not a PyTorch .pt file"});
  }
  SUBCASE("zip without data.pkl") {
    ckpt::interop::zip_writer z(path);
    z.add("archive/constants.pkl", bytes_of("\x80\x02N."));
    z.finish();
    expect(ckpt::error_kind::corrupt, {"no 'archive/data.pkl' record"});
  }
  SUBCASE("big-endian byteorder") {
    ckpt::interop::zip_writer z(path);
    z.add("archive/data.pkl", bytes_of("\x80\x02N."));
    z.add("archive/byteorder", bytes_of("big"));
    z.finish();
    expect(ckpt::error_kind::invalid_argument, {"'big'-endian"});
  }
}
