// safetensors export and import: round trips, the exact bytes of a small file, sharding, size
// strings, and hostile files that must be refused with a message naming the problem.

#include <ckpt/interop/safetensors.hpp>

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../helpers.hpp"

namespace st = ckpt::interop;
namespace fs = std::filesystem;
using ckpt::dtype;
using ckpt::error_kind;

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream os;
  os << in.rdbuf();
  return std::move(os).str();
}

void write_all(const fs::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

std::string le64(std::uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

/// A safetensors file from its parts, with the true header length in front.
std::string raw_file(std::string_view header, std::string_view buffer) {
  return le64(header.size()) + std::string(header) + std::string(buffer);
}

std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(g() & 0xff);
  return v;
}

/// Every file in `dir` (names only).
std::set<std::string> listing(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

/// Opening `bytes` (written to a file) fails with `kind`, and the message contains the file
/// name and every one of `needles`.
void expect_corrupt(const test::temp_dir& dir, std::string_view bytes, std::initializer_list<std::string_view> needles,
                    error_kind kind = error_kind::corrupt) {
  const auto path = dir.path() / "hostile.safetensors";
  write_all(path, bytes);
  const auto e = test::catch_error([&] { st::safetensors_file f(path); });
  CHECK(e.kind() == kind);
  const std::string msg = e.what();
  INFO("message: " << msg);
  CHECK(msg.find(path.string() + ": ") == 0);
  for (auto n : needles) CHECK_MESSAGE(msg.find(n) != std::string::npos, "missing '" << n << "'");
}

}  // namespace

TEST_CASE("safetensors dtype names map both ways") {
  const std::vector<std::pair<dtype, std::string_view>> all{
      {dtype::f64, "F64"}, {dtype::f32, "F32"}, {dtype::f16, "F16"}, {dtype::bf16, "BF16"}, {dtype::i64, "I64"},
      {dtype::i32, "I32"}, {dtype::i16, "I16"}, {dtype::i8, "I8"},   {dtype::u8, "U8"},     {dtype::boolean, "BOOL"},
      {dtype::u16, "U16"}, {dtype::u32, "U32"}, {dtype::u64, "U64"}, {dtype::f8_e4m3, "F8_E4M3"},
      {dtype::f8_e5m2, "F8_E5M2"}};
  REQUIRE(all.size() == ckpt::last_dtype_id);  // every dtype has its name
  for (const auto& [t, name] : all) {
    CHECK(st::safetensors_dtype_name(t) == name);
    CHECK(st::dtype_from_safetensors(name) == t);
  }
  CHECK_FALSE(st::dtype_from_safetensors("f32"));
  CHECK_FALSE(st::dtype_from_safetensors("F8_E4M3FN"));  // torch's name, not the format's
  CHECK_FALSE(st::dtype_from_safetensors("F8_E8M0"));
  CHECK_FALSE(st::dtype_from_safetensors(""));
}

TEST_CASE("safetensors round trip of every dtype, empty and 0-d tensors, metadata") {
  test::temp_dir dir;
  const auto path = dir.path() / "model.safetensors";
  struct spec {
    std::string name;
    dtype type;
    ckpt::shape_t shape;
  };
  const std::vector<spec> specs{
      {"emb.f64", dtype::f64, {3, 5}},   {"layers.0.f32", dtype::f32, {4, 6}},
      {"layers.0.f16", dtype::f16, {7}}, {"bf16", dtype::bf16, {2, 3, 4}},
      {"i64", dtype::i64, {9}},          {"i32", dtype::i32, {2, 5}},
      {"i16", dtype::i16, {11}},         {"i8", dtype::i8, {13}},
      {"u8", dtype::u8, {3, 3}},         {"flags", dtype::boolean, {7}},
      {"scalar.f64", dtype::f64, {}},    {"scalar.bool", dtype::boolean, {}},
      {"empty", dtype::f32, {0}},        {"empty.3d", dtype::bf16, {2, 0, 3}},
      {"after.empty", dtype::i16, {3}},  {"u16", dtype::u16, {5}},
      {"u32", dtype::u32, {2, 3}},       {"u64", dtype::u64, {4}},
      {"fp8.e4m3", dtype::f8_e4m3, {256}}, {"fp8.e5m2", dtype::f8_e5m2, {16, 16}},
  };
  std::vector<std::pair<std::string, st::host_tensor>> tensors;
  std::uint64_t seed = 1;
  for (const auto& s : specs) {
    st::host_tensor t{s.type, s.shape, {}};
    t.data = random_bytes(static_cast<std::size_t>(t.numel() * ckpt::size_of(s.type)), seed++);
    if (s.type == dtype::boolean)
      for (auto& b : t.data) b = static_cast<std::byte>(std::to_integer<int>(b) & 1);
    tensors.emplace_back(s.name, std::move(t));
  }
  const st::safetensors_metadata metadata{{"format", "pt"},
                                          {"quote\"back\\slash", "new\nline\ttab\x01"},
                                          {"unicode \xe2\x9c\x93", "na\xc3\xafve \xe2\x98\x83 \xf0\x9f\x98\x80"},
                                          {"empty", ""}};

  // Written in reverse order, the f32 tensor in several pieces: order and chunking are free.
  std::vector<st::tensor_decl> decls;
  for (const auto& [name, t] : tensors) decls.push_back({name, t.type, t.shape});
  {
    st::safetensors_writer w(path, decls, metadata);
    for (auto it = tensors.rbegin(); it != tensors.rend(); ++it) {
      const auto& [name, t] = *it;
      if (name == "layers.0.f32") {
        const std::span<const std::byte> all(t.data);
        w.write(name, all.first(10));
        w.write(name, all.subspan(10, 0));
        w.write(name, all.subspan(10, 50));
        w.write(name, all.subspan(60));
      } else {
        w.write(name, t.data);
      }
    }
    CHECK_FALSE(fs::exists(path));  // nothing at the destination until finish
    w.finish();
    CHECK(fs::file_size(path) == w.file_size());
    CHECK(w.data_start() % 8 == 0);
  }
  CHECK(listing(dir.path()) == std::set<std::string>{"model.safetensors"});  // no temporary left

  st::safetensors_file f(path);
  CHECK(f.metadata() == metadata);
  CHECK(f.data_start() % 8 == 0);
  REQUIRE(f.tensors().size() == tensors.size());
  std::uint64_t offset = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::string& name = tensors[i].first;  // not a structured binding: CAPTURE captures it
    const st::host_tensor& want = tensors[i].second;
    const auto& info = f.tensors()[i];  // file order = declaration order
    CAPTURE(name);
    CHECK(info.name == name);
    CHECK(info.type == want.type);
    CHECK(info.shape == want.shape);
    CHECK(info.begin == offset);
    CHECK(info.nbytes() == want.data.size());
    offset = info.end;
    const auto got = f.read(name);
    CHECK(got.type == want.type);
    CHECK(got.shape == want.shape);
    CHECK(got.data == want.data);
    std::vector<std::byte> into(want.data.size());
    f.read(name, into);
    CHECK(into == want.data);
  }
  CHECK(offset + f.data_start() == fs::file_size(path));

  // Partial reads of a larger tensor.
  const auto& f32 = tensors[1].second.data;
  std::vector<std::byte> part(17);
  f.read_part("layers.0.f32", 40, part);
  CHECK(std::equal(part.begin(), part.end(), f32.begin() + 40));
  f.read_part("layers.0.f32", f32.size(), std::span<std::byte>());
  CHECK(test::catch_error([&] { f.read_part("layers.0.f32", f32.size() - 16, part); }).kind() ==
        error_kind::invalid_argument);

  // A 0-d tensor holds one element; an empty one none.
  CHECK(f.at("scalar.f64").nbytes() == 8);
  CHECK(f.at("empty").nbytes() == 0);
  CHECK(f.read("empty.3d").data.empty());

  // A moved-from file object hands over its descriptor.
  st::safetensors_file moved = std::move(f);
  CHECK(moved.read("i8").data == tensors[7].second.data);
}

TEST_CASE("safetensors writer output is byte-exact") {
  test::temp_dir dir;
  SUBCASE("metadata, two tensors, a 0-d one, header padded with spaces") {
    const auto path = dir.path() / "small.safetensors";
    const float a[2] = {1.0f, -2.0f};
    const std::int8_t bias = 7;
    st::safetensors_writer w(path, {{"a", dtype::f32, {2}}, {"bias", dtype::i8, {}}}, {{"format", "pt"}});
    w.write("bias", std::as_bytes(std::span(&bias, 1)));
    w.write("a", std::as_bytes(std::span(a)));
    w.finish();
    // 139 bytes of JSON + 5 spaces = 144 = 0x90.
    const std::string expected =
        std::string("\x90\0\0\0\0\0\0\0", 8) +
        R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
        R"("bias":{"dtype":"I8","shape":[],"data_offsets":[8,9]}})"
        "     " +
        std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0\x07", 9);
    CHECK(read_all(path) == expected);
  }
  SUBCASE("no metadata, an escaped UTF-8 name, an empty tensor") {
    const auto path = dir.path() / "escaped.safetensors";
    st::safetensors_writer w(path, {{"q\"\n\xc3\xa9", dtype::boolean, {3, 0}}});
    w.finish();  // an empty tensor needs no write
    // 63 bytes of JSON + 1 space = 64 = 0x40; no data.
    const std::string expected = std::string("\x40\0\0\0\0\0\0\0", 8) +
                                 "{\"q\\\"\\n\xc3\xa9\":{\"dtype\":\"BOOL\",\"shape\":[3,0],\"data_offsets\":[0,0]}} ";
    CHECK(read_all(path) == expected);
  }
  SUBCASE("no tensors at all") {
    const auto path = dir.path() / "nothing.safetensors";
    st::safetensors_writer(path, {}).finish();
    CHECK(read_all(path) == std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
    st::safetensors_file f(path);
    CHECK(f.tensors().empty());
    CHECK(f.metadata().empty());
  }
}

TEST_CASE("sort_by_alignment gives the reference implementation's order") {
  std::vector<st::tensor_decl> d{{"z", dtype::boolean, {1}}, {"b", dtype::f32, {1}}, {"a", dtype::u8, {1}},
                                 {"c", dtype::i64, {1}},     {"a", dtype::f32, {1}}, {"h", dtype::bf16, {1}},
                                 {"g", dtype::f16, {1}},     {"x", dtype::f64, {1}}, {"i", dtype::i32, {1}},
                                 {"j", dtype::i16, {1}},     {"k", dtype::i8, {1}}};
  st::sort_by_alignment(d);
  std::vector<std::string> got;
  for (const auto& t : d) got.push_back(t.name + ":" + std::string(st::safetensors_dtype_name(t.type)));
  CHECK(got == std::vector<std::string>{"c:I64", "x:F64", "a:F32", "b:F32", "i:I32", "h:BF16", "g:F16", "j:I16", "k:I8",
                                        "a:U8", "z:BOOL"});
}

TEST_CASE("safetensors writer rejects misuse") {
  test::temp_dir dir;
  const auto path = dir.path() / "m.safetensors";
  const auto kind_of = [](auto&& f) { return test::catch_error(f).kind(); };
  CHECK(kind_of([&] { st::safetensors_writer(path, {{"", dtype::f32, {1}}}); }) == error_kind::invalid_argument);
  CHECK(kind_of([&] {
          st::safetensors_writer(path, {{"__metadata__", dtype::f32, {1}}});
        }) == error_kind::invalid_argument);
  CHECK(kind_of([&] { st::safetensors_writer(path, {{"bad\xff", dtype::f32, {1}}}); }) == error_kind::invalid_argument);
  CHECK(kind_of([&] {
          st::safetensors_writer(path, {{"w", dtype::f32, {1}}}, {{"k", "\xc0\x80"}});
        }) == error_kind::invalid_argument);
  const auto dup = test::catch_error([&] {
    st::safetensors_writer(path, {{"w", dtype::f32, {1}}, {"w", dtype::i8, {2}}});
  });
  CHECK(std::string(dup.what()).find("'w' is declared twice") != std::string::npos);
  const auto huge = test::catch_error([&] {
    st::safetensors_writer(path, {{"w", dtype::f32, {std::uint64_t{1} << 40, std::uint64_t{1} << 40}}});
  });
  CHECK(huge.kind() == error_kind::invalid_argument);
  CHECK(std::string(huge.what()).find("overflows") != std::string::npos);
  CHECK(listing(dir.path()).empty());

  st::safetensors_writer w(path, {{"w", dtype::f32, {2}}});
  const float v[3] = {1, 2, 3};
  const auto bytes = std::as_bytes(std::span(v));
  const auto undeclared = test::catch_error([&] { w.write("nope", bytes); });
  CHECK(undeclared.kind() == error_kind::invalid_argument);
  CHECK(std::string(undeclared.what()).find("'nope' was not declared") != std::string::npos);
  const auto too_many = test::catch_error([&] { w.write("w", bytes); });
  CHECK(std::string(too_many.what()).find("has 8 bytes; 0 are written and 12 more were given") != std::string::npos);
  w.write("w", bytes.first(4));
  CHECK(kind_of([&] { w.write("w", bytes.first(8)); }) == error_kind::invalid_argument);
  w.write("w", bytes.subspan(4, 4));
  w.finish();
  CHECK(kind_of([&] { w.write("w", {}); }) == error_kind::invalid_argument);
  CHECK(kind_of([&] { w.finish(); }) == error_kind::invalid_argument);
  const auto back = st::safetensors_file(path).read("w").data;
  CHECK(std::equal(back.begin(), back.end(), bytes.begin(), bytes.begin() + 8));
}

TEST_CASE("a failed safetensors export leaves no file at the destination") {
  test::temp_dir dir;
  const auto path = dir.path() / "model.safetensors";
  const float v[4] = {1, 2, 3, 4};
  const auto bytes = std::as_bytes(std::span(v));

  SUBCASE("a tensor never written") {
    {
      st::safetensors_writer w(path, {{"a", dtype::f32, {4}}, {"b", dtype::f32, {4}}});
      w.write("a", bytes);
      const auto e = test::catch_error([&] { w.finish(); });
      CHECK(e.kind() == error_kind::invalid_argument);
      CHECK(std::string(e.what()).find("tensor 'b' is incomplete: 0 of 16 bytes written") != std::string::npos);
      CHECK_FALSE(fs::exists(path));
    }
    CHECK(listing(dir.path()).empty());  // the temporary file went with the writer
  }
  SUBCASE("a tensor written in part, over an existing file that must survive") {
    write_all(path, "previous export");
    {
      st::safetensors_writer w(path, {{"a", dtype::f32, {4}}});
      w.write("a", bytes.first(12));
      CHECK(std::string(test::catch_error([&] { w.finish(); }).what()).find("12 of 16 bytes") != std::string::npos);
    }
    CHECK(read_all(path) == "previous export");
    CHECK(listing(dir.path()) == std::set<std::string>{"model.safetensors"});
  }
  SUBCASE("a writer abandoned without finish") {
    {
      st::safetensors_writer w(path, {{"a", dtype::f32, {4}}});
      w.write("a", bytes);
    }
    CHECK(listing(dir.path()).empty());
  }
  SUBCASE("a directory that does not exist or is a file") {
    const auto e = test::catch_error([&] { st::safetensors_writer(dir.path() / "missing" / "m.safetensors", {}); });
    CHECK(e.kind() == error_kind::io);
    CHECK(std::string(e.what()).find("missing/m.safetensors") != std::string::npos);
    write_all(dir.path() / "plain", "x");
    CHECK(test::catch_error([&] { st::safetensors_writer(dir.path() / "plain" / "m.safetensors", {}); }).kind() ==
          error_kind::io);
    CHECK(listing(dir.path()) == std::set<std::string>{"plain"});
  }
  SUBCASE("an unwritable directory") {
    const auto ro = dir.path() / "ro";
    fs::create_directory(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    // root writes anywhere: then the permission case cannot be made, and the export succeeds.
    if (::access(ro.c_str(), W_OK) == 0) {
      fs::permissions(ro, fs::perms::owner_all);
      return;
    }
    const auto e = test::catch_error([&] { st::safetensors_writer(ro / "m.safetensors", {}); });
    fs::permissions(ro, fs::perms::owner_all);
    CHECK(e.kind() == error_kind::io);
    CHECK(std::string(e.what()).find("Permission denied") != std::string::npos);
    CHECK(listing(ro).empty());
  }
  SUBCASE("a sharded export with a missing tensor publishes no shard and no index") {
    const auto out = dir.path() / "sharded";
    {
      st::safetensors_sharded_writer w(out, {{"a", dtype::f32, {4}}, {"b", dtype::f32, {4}}, {"c", dtype::f32, {4}}},
                                       {}, 20);
      REQUIRE(w.shards().size() == 3);
      w.write("a", bytes);
      w.write("c", bytes);
      CHECK(std::string(test::catch_error([&] { w.finish(); }).what()).find("tensor 'b' is incomplete") !=
            std::string::npos);
      CHECK(listing(out).size() == 3);  // three temporary files, nothing published
      for (const auto& f : listing(out)) CHECK(f.starts_with(".model-0000"));
    }
    CHECK(listing(out).empty());
  }
  SUBCASE("a sharded export can be completed after finish reported a missing tensor") {
    const auto out = dir.path() / "sharded";
    st::safetensors_sharded_writer w(out, {{"a", dtype::f32, {4}}, {"b", dtype::f32, {4}}}, {}, 20);
    w.write("a", bytes);
    CHECK(test::catch_error([&] { w.finish(); }).kind() == error_kind::invalid_argument);
    w.write("b", bytes);
    w.finish();
    CHECK(st::safetensors_index(out / "model.safetensors.index.json").read("b").data.size() == 16);
    CHECK(test::catch_error([&] { w.finish(); }).kind() == error_kind::invalid_argument);
  }
}

TEST_CASE("parse_size reads transformers-style size strings") {
  CHECK(st::parse_size("5GB") == 5'000'000'000ull);
  CHECK(st::parse_size("500MB") == 500'000'000ull);
  CHECK(st::parse_size("10GiB") == 10ull << 30);
  CHECK(st::parse_size("100KB") == 100'000ull);
  CHECK(st::parse_size("3KiB") == 3072);
  CHECK(st::parse_size("7MiB") == 7ull << 20);
  CHECK(st::parse_size("2TB") == 2'000'000'000'000ull);
  CHECK(st::parse_size("1TiB") == 1ull << 40);
  CHECK(st::parse_size("4096") == 4096);
  CHECK(st::parse_size("64B") == 64);
  CHECK(st::parse_size(" 2 GB ") == 2'000'000'000ull);
  CHECK(st::parse_size("5gB") == 5'000'000'000ull);
  CHECK(st::parse_size("5gib") == 5ull << 30);
  CHECK(st::parse_size("0") == 0);
  CHECK(st::parse_size("18446744073709551615") == std::numeric_limits<std::uint64_t>::max());

  const auto message = [](std::string_view text) {
    const auto e = test::catch_error([&] { st::parse_size(text); });
    CHECK(e.kind() == error_kind::invalid_argument);
    const std::string m = e.what();
    CHECK(m.find("invalid size") != std::string::npos);
    return m;
  };
  CHECK(message("").find("expected a whole number") != std::string::npos);
  CHECK(message("GB").find("expected a whole number") != std::string::npos);
  CHECK(message("-5GB").find("expected a whole number") != std::string::npos);
  CHECK(message("1.5GB").find("fractions are not supported") != std::string::npos);
  CHECK(message("5G").find("unknown unit 'G'") != std::string::npos);
  CHECK(message("5 GBs").find("unknown unit 'GBs'") != std::string::npos);
  CHECK(message("5Gb").find("lowercase 'b' means bits") != std::string::npos);
  CHECK(message("5Gb").find("'5GB'") != std::string::npos);
  CHECK(message("20000000000GB").find("does not fit in 64 bits") != std::string::npos);
  CHECK(message("99999999999999999999").find("does not fit in 64 bits") != std::string::npos);
}

TEST_CASE("plan_shards splits like save_pretrained(max_shard_size)") {
  const std::vector<st::tensor_decl> decls{
      {"a", dtype::f32, {10}},     // 40
      {"b", dtype::f32, {10}},     // 40  -> a+b = 80 fits 100
      {"e", dtype::i16, {0}},      // 0   -> still 80
      {"c", dtype::f64, {5}},      // 40  -> 120 > 100: new shard
      {"huge", dtype::u8, {250}},  // 250 > 100: a shard of its own
      {"d", dtype::i16, {30}},     // 60: new shard (250 + 60 > 100)
      {"s", dtype::i64, {}},       // 8  -> 68
      {"t", dtype::i32, {6}},      // 24 -> 92
      {"u", dtype::i8, {8}},       // 8  -> 100, exactly the limit
      {"v", dtype::boolean, {1}},  // 1  -> 101 > 100: new shard
  };
  const auto shards = st::plan_shards(decls, 100, "model");
  REQUIRE(shards.size() == 5);
  const std::vector<std::vector<std::size_t>> members{{0, 1, 2}, {3}, {4}, {5, 6, 7, 8}, {9}};
  const std::vector<std::uint64_t> bytes{80, 40, 250, 100, 1};
  for (std::size_t k = 0; k < shards.size(); ++k) {
    CHECK(shards[k].file == "model-0000" + std::to_string(k + 1) + "-of-00005.safetensors");
    CHECK(shards[k].tensors == members[k]);
    CHECK(shards[k].bytes == bytes[k]);
  }
  // Everything in one shard: the single file name.
  const auto one = st::plan_shards(decls, 10'000, "pytorch_model");
  REQUIRE(one.size() == 1);
  CHECK(one[0].file == "pytorch_model.safetensors");
  CHECK(one[0].tensors.size() == decls.size());
  // No tensors: one empty single file.
  CHECK(st::plan_shards({}, 1).size() == 1);
  // Many shards keep five digits.
  std::vector<st::tensor_decl> many(12, st::tensor_decl{"", dtype::u8, {1}});
  CHECK(st::plan_shards(many, 1).back().file == "model-00012-of-00012.safetensors");

  CHECK(test::catch_error([&] { st::plan_shards(decls, 0); }).kind() == error_kind::invalid_argument);
  CHECK(test::catch_error([&] { st::plan_shards(decls, 100, "a/b"); }).kind() == error_kind::invalid_argument);
  CHECK(test::catch_error([&] { st::plan_shards(decls, 100, ""); }).kind() == error_kind::invalid_argument);
}

TEST_CASE("sharded safetensors export writes shards and a transformers-style index") {
  test::temp_dir dir;
  const auto out = dir.path() / "export";
  const std::vector<st::tensor_decl> decls{
      {"model.embed", dtype::bf16, {4, 8}},  // 64 bytes
      {"model.norm", dtype::f32, {8}},       // 32 -> 96
      {"lm_head", dtype::f16, {60}},         // 120 > 100: own shard
      {"step", dtype::i64, {}},              // 8
      {"caf\xc3\xa9", dtype::u8, {3}},       // 3, a non-ASCII name
  };
  std::map<std::string, std::vector<std::byte>> data;
  std::uint64_t seed = 7;
  for (const auto& d : decls) data[d.name] = random_bytes(static_cast<std::size_t>(d.nbytes()), seed++);
  const st::safetensors_metadata meta{{"format", "pt"}};

  // Files of an earlier export that the new one replaces, and files it must keep.
  fs::create_directories(out);
  write_all(out / "model.safetensors", "stale single file");
  write_all(out / "model-00001-of-00009.safetensors", "stale shard");
  write_all(out / "model-extra.safetensors", "not an export file");
  write_all(out / "config.json", "{}");

  st::safetensors_sharded_writer w(out, decls, meta, 100);
  REQUIRE(w.shards().size() == 3);
  CHECK(w.total_size() == 64 + 32 + 120 + 8 + 3);
  for (auto it = decls.rbegin(); it != decls.rend(); ++it) w.write(it->name, data[it->name]);
  CHECK(test::catch_error([&] { w.write("nope", {}); }).kind() == error_kind::invalid_argument);
  w.finish();

  CHECK(listing(out) == std::set<std::string>{"config.json", "model-extra.safetensors",
                                              "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                              "model-00003-of-00003.safetensors", "model.safetensors.index.json"});
  // Exactly what json.dumps(index, indent=2, sort_keys=True) + "\n" gives.
  const std::string expected_index = R"({
  "metadata": {
    "total_size": 227
  },
  "weight_map": {
    "caf\u00e9": "model-00003-of-00003.safetensors",
    "lm_head": "model-00002-of-00003.safetensors",
    "model.embed": "model-00001-of-00003.safetensors",
    "model.norm": "model-00001-of-00003.safetensors",
    "step": "model-00003-of-00003.safetensors"
  }
}
)";
  CHECK(read_all(out / "model.safetensors.index.json") == expected_index);
  CHECK(w.index_text() == expected_index);

  // Each shard is an ordinary file holding its tensors in order, with the metadata.
  st::safetensors_file s1(out / "model-00001-of-00003.safetensors");
  REQUIRE(s1.tensors().size() == 2);
  CHECK(s1.tensors()[0].name == "model.embed");
  CHECK(s1.tensors()[1].name == "model.norm");
  CHECK(s1.metadata() == meta);

  st::safetensors_index idx(out / "model.safetensors.index.json");
  CHECK(idx.total_size() == std::optional<std::uint64_t>(227));
  CHECK(idx.shards().size() == 3);
  CHECK(idx.weight_map().size() == decls.size());
  for (const auto& d : decls) {
    CAPTURE(d.name);
    const auto t = idx.read(d.name);
    CHECK(t.type == d.type);
    CHECK(t.shape == d.shape);
    CHECK(t.data == data[d.name]);
    std::vector<std::byte> into(data[d.name].size());
    idx.read(d.name, into);
    CHECK(into == data[d.name]);
    CHECK(idx.at(d.name).nbytes() == d.nbytes());
  }
  CHECK(idx.shard_of("lm_head").path() == (out / "model-00002-of-00003.safetensors").string());
  CHECK(test::catch_error([&] { idx.read("nope"); }).kind() == error_kind::not_found);

  SUBCASE("a re-export that fits one file replaces the shards and the index") {
    st::safetensors_sharded_writer again(out, decls, meta, st::parse_size("1KB"));
    REQUIRE(again.shards().size() == 1);
    for (const auto& d : decls) again.write(d.name, data[d.name]);
    again.finish();
    CHECK(listing(out) == std::set<std::string>{"config.json", "model-extra.safetensors", "model.safetensors"});
    st::safetensors_file f(out / "model.safetensors");
    CHECK(f.tensors().size() == decls.size());
    CHECK(f.read("caf\xc3\xa9").data == data["caf\xc3\xa9"]);
  }
  SUBCASE("another base name leaves this export alone") {
    st::safetensors_sharded_writer other(out, {{"x", dtype::u8, {1}}}, {}, 100, "adapter");
    const std::byte one{1};
    other.write("x", std::span(&one, 1));
    other.finish();
    CHECK(listing(out).size() == 7);
    CHECK(listing(out).count("adapter.safetensors") == 1);
  }
}

TEST_CASE("safetensors index reader refuses inconsistent sets") {
  test::temp_dir dir;
  const auto d = dir.path();
  const float v[2] = {1, 2};
  const auto shard = [&](const std::string& file, std::vector<std::string> names) {
    std::vector<st::tensor_decl> decls;
    for (auto& n : names) decls.push_back({n, dtype::f32, {2}});
    st::safetensors_writer w(d / file, decls);
    for (auto& n : names) w.write(n, std::as_bytes(std::span(v)));
    w.finish();
  };
  shard("s1.safetensors", {"a", "b"});
  shard("s2.safetensors", {"c"});
  const auto index = d / "model.safetensors.index.json";
  const auto expect = [&](const std::string& json, std::initializer_list<std::string_view> needles) {
    write_all(index, json);
    const auto e = test::catch_error([&] { st::safetensors_index i(index); });
    CHECK(e.kind() == error_kind::corrupt);
    const std::string msg = e.what();
    INFO("index: " << json);
    INFO("message: " << msg);
    CHECK(msg.find(index.string() + ": ") == 0);
    for (auto n : needles) CHECK_MESSAGE(msg.find(n) != std::string::npos, "missing '" << n << "'");
  };

  // The consistent set opens; no metadata is fine, leading whitespace tolerated.
  write_all(index, R"(  {"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s2.safetensors"}})");
  st::safetensors_index ok(index);
  CHECK_FALSE(ok.total_size());
  CHECK(ok.read("c").data.size() == 8);

  expect(R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s3.safetensors"}})",
         {"shard 's3.safetensors' does not exist"});
  expect(R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s1.safetensors"}})",
         {"tensor 'c' is mapped to shard 's1.safetensors', which does not hold it"});
  expect(R"({"weight_map": {"a": "s1.safetensors", "c": "s2.safetensors"}})",
         {"s1.safetensors holds tensor 'b', which the weight_map does not list"});
  expect(R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "c": "../s2.safetensors"}})",
         {"'../s2.safetensors', which is not a file name"});
  expect(R"({"weight_map": {"a": "s1.safetensors", "a": "s1.safetensors", "b": "s1.safetensors"}})",
         {"tensor 'a' appears twice in weight_map"});
  expect(R"({"weight_map": {"a": 1}})", {"weight_map entry of tensor 'a' is not a string"});
  expect(R"({"metadata": {"total_size": -1}, "weight_map": {}})", {"'total_size' is not a non-negative integer"});
  expect(R"({"metadata": {"total_size": "12"}, "weight_map": {}})", {"'total_size' is not a non-negative integer"});
  expect(R"({"metadata": {}})", {"has no 'weight_map' object"});
  expect(R"({"weight_map": [1]})", {"has no 'weight_map' object"});
  expect(R"({"weight_map": {"a": "s1.safetensors",)", {"index is not valid JSON"});
  expect(R"(["weight_map"])", {"index is not a JSON object"});
  expect(R"({"metadata": {"total_size": 1e400}, "weight_map": {}})", {"'1e400'", "not an integer"});

  // A shard that is itself corrupt is reported with the shard's name.
  write_all(d / "s2.safetensors", raw_file("{", ""));
  write_all(index, R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s2.safetensors"}})");
  const auto e = test::catch_error([&] { st::safetensors_index i(index); });
  CHECK(e.kind() == error_kind::corrupt);
  CHECK(std::string(e.what()).find("s2.safetensors: header is not valid JSON") != std::string::npos);
  CHECK(test::catch_error([&] { st::safetensors_index i(d / "absent.json"); }).kind() == error_kind::not_found);
}

TEST_CASE("safetensors reader agrees with the reference on leading whitespace, null metadata, unknown keys and empty huge shapes") {
  test::temp_dir dir;
  const auto path = dir.path() / "ref.safetensors";
  // test_whitespace_leading_padded_header; "__metadata__": null; an unknown key in an entry;
  // [2^62, 0] holds no element, so it needs no bytes (the reference counts elements first).
  const std::string header = "  \n\t{\"__metadata__\": null, \"w\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904, 0], "
                             "\"data_offsets\": [0, 0], \"note\": \"x\"}, \"v\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}";
  write_all(path, raw_file(header, "z"));
  st::safetensors_file f(path);
  REQUIRE(f.tensors().size() == 2);
  CHECK(f.metadata().empty());
  CHECK(f.read("w").data.empty());
  CHECK(f.read("v").data.size() == 1);
}

TEST_CASE("safetensors reader accepts other writers' valid layouts") {
  test::temp_dir dir;
  const auto path = dir.path() / "other.safetensors";
  // Header order differs from data order, __metadata__ comes last, an unknown per-tensor key,
  // escapes the reader must decode, whitespace in the JSON, padding spaces after it.
  const std::string header =
      "{ \"b\" : {\"data_offsets\": [4, 6], \"dtype\": \"I16\", \"shape\": [1], \"extra\": {\"x\": [1]}},\n"
      "  \"a\\u00e9\": {\"dtype\": \"U8\", \"shape\": [2, 2], \"data_offsets\": [0, 4]},\n"
      "  \"z\": {\"dtype\": \"F64\", \"shape\": [0], \"data_offsets\": [6, 6]},\n"
      "  \"__metadata__\": {\"k\\n\": \"\\ud83d\\ude00\"}}       ";
  write_all(path, raw_file(header, std::string("\x01\x02\x03\x04\xff\x7f", 6)));
  st::safetensors_file f(path);
  REQUIRE(f.tensors().size() == 3);
  CHECK(f.tensors()[0].name == "a\xc3\xa9");  // in data order
  CHECK(f.tensors()[1].name == "b");
  CHECK(f.tensors()[2].name == "z");
  CHECK(f.metadata() == st::safetensors_metadata{{"k\n", "\xf0\x9f\x98\x80"}});
  CHECK(f.data_start() == 8 + header.size());
  const auto b = f.read("b");
  std::int16_t value;
  std::memcpy(&value, b.data.data(), 2);
  CHECK(value == 0x7fff);
  CHECK(f.read("a\xc3\xa9").shape == ckpt::shape_t{2, 2});

  CHECK(test::catch_error([&] { f.read("missing"); }).kind() == error_kind::not_found);
  std::vector<std::byte> wrong(3);
  const auto e = test::catch_error([&] { f.read("b", wrong); });
  CHECK(e.kind() == error_kind::invalid_argument);
  CHECK(std::string(e.what()).find("tensor 'b' has 2 bytes, the buffer given holds 3") != std::string::npos);
  CHECK(test::catch_error([&] { st::safetensors_file g(dir.path() / "absent.safetensors"); }).kind() ==
        error_kind::not_found);
}

TEST_CASE("safetensors reader refuses hostile files, naming the problem") {
  test::temp_dir dir;
  const std::string entry_a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string eight(8, '\x11');

  SUBCASE("shorter than the length prefix") { expect_corrupt(dir, "abc", {"3 bytes, too short"}); }
  SUBCASE("header length larger than the file") {
    expect_corrupt(dir, le64(1000) + "{}", {"header length 1000 is larger than the 2 bytes that follow it"});
  }
  SUBCASE("header length 2^63") {
    expect_corrupt(dir, le64(std::uint64_t{1} << 63) + "{}", {"header length 9223372036854775808 exceeds the limit"});
  }
  SUBCASE("header length just over 100 MB") {
    expect_corrupt(dir, le64(100'000'001) + "{}", {"header length 100000001 exceeds the limit of 100000000"});
  }
  SUBCASE("invalid JSON") {
    expect_corrupt(dir, raw_file("{" + entry_a, eight), {"header is not valid JSON", "missing ',' or '}'"});
    expect_corrupt(dir, raw_file(R"({"a":{"dtype":F32}})", ""), {"header is not valid JSON", "invalid value"});
    expect_corrupt(dir, raw_file("{}  x", ""), {"header is not valid JSON", "text follows"});
    expect_corrupt(dir, raw_file("", ""), {"header is not a JSON object"});
  }
  SUBCASE("JSON that is not an object") {
    expect_corrupt(dir, raw_file("[1, 2]", ""), {"header is not a JSON object", "'['"});
    expect_corrupt(dir, raw_file("\"text\"", ""), {"header is not a JSON object"});
    expect_corrupt(dir, raw_file(" x{}", ""), {"header is not a JSON object", "'x'"});  // whitespace may lead, not text
    expect_corrupt(dir, raw_file("\xef\xbb\xbf{}", ""), {"header is not a JSON object", "byte 0xef"});  // a BOM
  }
  SUBCASE("not UTF-8") { expect_corrupt(dir, raw_file("{\"\xff\":1}", ""), {"header is not valid UTF-8"}); }
  SUBCASE("a NUL byte in the header: padding, or a second format's payload after it") {
    expect_corrupt(dir, raw_file("{" + entry_a + "}" + std::string(8, '\0'), eight), {"header holds a NUL byte at byte"});
    expect_corrupt(dir, raw_file("{" + entry_a + "}" + std::string(1, '\0') + "<html>payload</html>", eight),
                   {"holds a NUL byte"});
    expect_corrupt(dir, raw_file(std::string("{\"a\0\":1}", 8), ""), {"holds a NUL byte at byte 3"});
  }
  SUBCASE("a lone surrogate escape in a name") {
    expect_corrupt(dir, raw_file(R"({"\udc00":{"dtype":"U8","shape":[],"data_offsets":[0,1]}})", "x"),
                   {"is not valid UTF-8"});
  }
  SUBCASE("unknown dtype") {
    expect_corrupt(dir, raw_file(R"({"w":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", eight),
                   {"tensor 'w'", "unknown dtype 'F33'"});
    expect_corrupt(dir, raw_file(R"({"w":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", eight),
                   {"tensor 'w'", "dtype is not a string"});
  }
  SUBCASE("a safetensors dtype ckpt cannot represent is a mismatch, not corruption") {
    expect_corrupt(dir, raw_file(R"({"w":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", eight),
                   {"tensor 'w'", "dtype 'C64' is valid safetensors but has no ckpt dtype"}, error_kind::mismatch);
    expect_corrupt(dir, raw_file(R"({"w":{"dtype":"F8_E8M0","shape":[8],"data_offsets":[0,8]}})", eight),
                   {"tensor 'w'", "dtype 'F8_E8M0' is valid safetensors but has no ckpt dtype"}, error_kind::mismatch);
  }
  SUBCASE("shape and offsets disagree") {
    expect_corrupt(dir, raw_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
                   {"tensor 'w'", "shape [3] of F32 needs 12 bytes but data_offsets [0, 8] span 8"});
  }
  SUBCASE("bad shapes") {
    expect_corrupt(dir, raw_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
                   {"tensor 'w'", "not a non-negative integer"});
    expect_corrupt(dir, raw_file(R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", eight),
                   {"'2.0'", "not an integer"});
    expect_corrupt(dir, raw_file(R"({"w":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", eight),
                   {"tensor 'w'", "shape is not an array"});
    expect_corrupt(dir, raw_file(R"({"w":{"dtype":"F32","shape":[1e400],"data_offsets":[0,8]}})", eight),
                   {"'1e400'", "not an integer"});
    expect_corrupt(dir, raw_file(R"({"w":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,8]}})", eight),
                   {"tensor 'w'", "not a non-negative integer"});
  }
  SUBCASE("a huge shape whose byte count overflows") {
    expect_corrupt(dir,
                   raw_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", eight),
                   {"tensor 'w'", "shape [4294967296, 4294967296] of F32 overflows 64 bits"});
    // The product overflows before the zero is reached: refused, as the reference refuses it.
    expect_corrupt(dir,
                   raw_file(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})", ""),
                   {"tensor 'w'", "shape [4294967296, 4294967296, 0] of U8 overflows 64 bits of elements"});
    // The element count fits, the bytes do not.
    expect_corrupt(dir, raw_file(R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", eight),
                   {"tensor 'w'", "overflows 64 bits"});
  }
  SUBCASE("bad data_offsets") {
    expect_corrupt(dir, raw_file(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[5,4]}})", "12345"),
                   {"tensor 'w'", "data_offsets [5, 4] end before they begin"});
    expect_corrupt(dir, raw_file(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", "1"),
                   {"tensor 'w'", "data_offsets is not a pair"});
    expect_corrupt(dir, raw_file(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", "1"),
                   {"tensor 'w'", "data_offsets is not a pair"});
    expect_corrupt(dir, raw_file(R"({"w":{"dtype":"U8","shape":[1]}})", "1"), {"tensor 'w'", "has no 'data_offsets'"});
  }
  SUBCASE("overlapping ranges") {
    expect_corrupt(dir,
                   raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                            eight),
                   {"tensor 'b' at data_offsets [4, 8] overlaps tensor 'a' at [0, 8]"});
    // An empty tensor inside another's bytes overlaps too.
    expect_corrupt(dir,
                   raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                            eight),
                   {"tensor 'e' at data_offsets [4, 4] overlaps tensor 'a'"});
  }
  SUBCASE("holes") {
    expect_corrupt(dir,
                   raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[6,10]}})",
                            "0123456789"),
                   {"hole in the data buffer: bytes [4, 6) belong to no tensor", "'b'"});
    expect_corrupt(dir, raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", eight),
                   {"the tensors end at byte 4 of the 8-byte data buffer"});
    expect_corrupt(dir, raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight),
                   {"hole in the data buffer: bytes [0, 4)"});
  }
  SUBCASE("offsets past the end of the buffer") {
    expect_corrupt(dir, raw_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", eight),
                   {"tensor 'a'", "data_offsets [0, 16] run past the end of the 8-byte data buffer"});
  }
  SUBCASE("duplicate names and keys") {
    expect_corrupt(dir, raw_file("{" + entry_a + "," + entry_a + "}", eight + eight), {"tensor 'a' appears twice"});
    expect_corrupt(dir, raw_file(R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", eight),
                   {"tensor 'a'", "key 'dtype' appears twice"});
    expect_corrupt(dir, raw_file(R"({"__metadata__":{"k":"1","k":"2"}})", ""), {"metadata key 'k' appears twice"});
    expect_corrupt(dir, raw_file(R"({"__metadata__":{},"__metadata__":{}})", ""), {"'__metadata__' appears twice"});
  }
  SUBCASE("metadata that is not strings") {
    expect_corrupt(dir, raw_file(R"({"__metadata__":{"format":"pt","epoch":3}})", ""),
                   {"metadata entry 'epoch' is not a string"});
    expect_corrupt(dir, raw_file(R"({"__metadata__":{"nested":{"a":"b"}}})", ""),
                   {"metadata entry 'nested' is not a string"});
    expect_corrupt(dir, raw_file(R"({"__metadata__":["pt"]})", ""), {"'__metadata__' is not an object"});
  }
  SUBCASE("an entry that is not an object") {
    expect_corrupt(dir, raw_file(R"({"a":[1,2]})", ""), {"tensor 'a': entry is not an object"});
  }
  SUBCASE("nesting too deep for a header") {
    expect_corrupt(dir, raw_file(R"({"a":{"x":[[[[[[[[[]]]]]]]]]}})", ""), {"nested deeper than"});
  }
  SUBCASE("a truncated file") {
    const auto good = dir.path() / "good.safetensors";
    std::vector<float> w(100, 0.5f);
    st::safetensors_writer out(good, {{"w", dtype::f32, {100}}, {"b", dtype::f32, {2}}});
    out.write("w", std::as_bytes(std::span(w)));
    out.write("b", std::as_bytes(std::span(w)).first(8));
    out.finish();
    const std::string bytes = read_all(good);
    expect_corrupt(dir, bytes.substr(0, bytes.size() - 1),
                   {"tensor 'b'", "run past the end of the 407-byte data buffer (truncated file?)"});
    expect_corrupt(dir, bytes.substr(0, 40), {"is larger than the 32 bytes that follow it (truncated file?)"});
    expect_corrupt(dir, bytes.substr(0, 5), {"5 bytes, too short"});
  }
  SUBCASE("names in messages are made printable") {
    expect_corrupt(dir, raw_file("{\"bad\\u0001name\":{\"dtype\":\"X\",\"shape\":[],\"data_offsets\":[0,0]}}", ""),
                   {"tensor 'bad\\x01name'", "unknown dtype 'X'"});
  }
}
