// The dtypes added after the first ten: u16, u32, u64 and the two FP8 formats. Their FP8
// decoding against an independent formula, and their bytes through every path of the library:
// save and load with each codec and storage, chunked, partial reads, a tp change, validation
// logits, and refusal by a reader that predates them.

#include "helpers.hpp"
#include "on_ranks.hpp"

#include <ckpt/in_process.hpp>
#include <ckpt/reader.hpp>
#include <ckpt/zstd.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace {

using ckpt::dtype;

/// E4M3 ("fn"), from the definition: sign, 4 exponent bits of bias 7, 3 mantissa bits, no
/// infinities, S.1111.111 NaN. Written with ldexp, not the bit tricks dtype.hpp uses.
double e4m3_reference(unsigned b) {
  const double sign = (b & 0x80) ? -1.0 : 1.0;
  const int e = static_cast<int>((b >> 3) & 15), m = static_cast<int>(b & 7);
  if (e == 15 && m == 7) return std::nan("");
  if (e == 0) return sign * std::ldexp(m / 8.0, -6);
  return sign * std::ldexp(1.0 + m / 8.0, e - 7);
}
/// E5M2: sign, 5 exponent bits of bias 15, 2 mantissa bits, IEEE infinities and NaNs.
double e5m2_reference(unsigned b) {
  const double sign = (b & 0x80) ? -1.0 : 1.0;
  const int e = static_cast<int>((b >> 2) & 31), m = static_cast<int>(b & 3);
  if (e == 31) return m ? std::nan("") : sign * HUGE_VAL;
  if (e == 0) return sign * std::ldexp(m / 4.0, -14);
  return sign * std::ldexp(1.0 + m / 4.0, e - 15);
}

bool same_double(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

/// A state of every new dtype: the extremes of the unsigned types, every FP8 bit pattern (NaNs
/// and, for E5M2, infinities included), a 2-d u32 weight split by rows at tp > 1.
struct wide_state {
  std::uint32_t rank = 0, tp = 1;
  std::vector<std::uint16_t> u16;
  std::vector<std::uint32_t> u32;
  std::vector<std::uint64_t> u64;
  std::vector<ckpt::float8_e4m3> e4m3 = std::vector<ckpt::float8_e4m3>(256);
  std::vector<ckpt::float8_e5m2> e5m2 = std::vector<ckpt::float8_e5m2>(256);
  std::vector<std::uint32_t> w;  // rows [lo, hi) of a 10 x 3 weight
  std::uint64_t step = 0;
  static constexpr std::uint64_t rows = 10, cols = 3;

  explicit wide_state(std::uint64_t seed, std::uint32_t r = 0, std::uint32_t n = 1) : rank(r), tp(n) {
    std::mt19937_64 g(seed);
    u16 = {0, 1, 0x7fff, 0x8000, 0xffff};
    u32 = {0, 1, 0x7fffffffu, 0x80000000u, 0xffffffffu};
    u64 = {0, 1, std::uint64_t{1} << 53, (std::uint64_t{1} << 53) + 1, 0x7fffffffffffffffull, 0x8000000000000000ull,
           std::numeric_limits<std::uint64_t>::max()};
    for (int i = 0; i < 40; ++i) {
      u16.push_back(static_cast<std::uint16_t>(g()));
      u32.push_back(static_cast<std::uint32_t>(g()));
      u64.push_back(g());
    }
    for (unsigned b = 0; b < 256; ++b) {  // a seed-dependent rotation of all 256 patterns
      e4m3[b].bits = static_cast<std::uint8_t>(b + seed);
      e5m2[b].bits = static_cast<std::uint8_t>(b * 7 + seed);
    }
    for (std::uint64_t i = lo(); i < hi(); ++i)
      for (std::uint64_t j = 0; j < cols; ++j) w.push_back(static_cast<std::uint32_t>(0xfffffff0u - i * cols - j + seed));
    step = seed;
  }
  std::uint64_t lo() const { return rows * rank / tp; }
  std::uint64_t hi() const { return rows * (rank + 1) / tp; }

  template <class V>
  void checkpoint(V& v) {
    v.tensor("u16", u16);
    v.tensor("u32", u32);
    v.tensor("u64", u64);
    v.tensor("fp8.e4m3", ckpt::view(e4m3.data(), {16, 16}));
    v.tensor("fp8.e5m2", e5m2);
    v.tensor("w", ckpt::view(w.data(), {hi() - lo(), cols}).sharded({.global_shape = {rows, cols}, .offset = {lo(), 0}}));
    v.tensor("step", step);  // a u64 scalar
  }
  bool operator==(const wide_state& o) const {
    return u16 == o.u16 && u32 == o.u32 && u64 == o.u64 && e4m3 == o.e4m3 && e5m2 == o.e5m2 && w == o.w && step == o.step;
  }
};

template <class Codec>
void round_trip(const char* what) {
  CAPTURE(what);
  for (std::uint64_t chunk : {std::uint64_t{16}, std::uint64_t{4} << 20}) {
    CAPTURE(chunk);
    test::temp_dir dir;
    ckpt::checkpointer<ckpt::single_process, ckpt::posix, Codec> cp{{}, dir.path(), {.chunk_bytes = chunk}};
    wide_state saved(3);
    cp.save(5, saved);
    wide_state loaded(200);
    REQUIRE_FALSE(loaded == saved);
    cp.load(loaded);
    CHECK(loaded == saved);
    ckpt::reader r{ckpt::posix(dir.path())};
    CHECK(r.find("fp8.e4m3")->type == dtype::f8_e4m3);
    CHECK(r.find("fp8.e5m2")->type == dtype::f8_e5m2);
    CHECK(r.find("u64")->type == dtype::u64);
    CHECK(r.find("step")->type == dtype::u64);
  }
}

}  // namespace

TEST_CASE("FP8 E4M3 (fn) and E5M2 decode every bit pattern exactly") {
  for (unsigned b = 0; b < 256; ++b) {
    CAPTURE(b);
    const auto x = static_cast<std::uint8_t>(b);
    REQUIRE(same_double(ckpt::float8_e4m3::to_float(x), e4m3_reference(b)));
    REQUIRE(same_double(ckpt::float8_e5m2::to_float(x), e5m2_reference(b)));
    const std::byte raw{x};
    CHECK(same_double(ckpt::element_as_double(&raw, dtype::f8_e4m3, 0), e4m3_reference(b)));
    CHECK(same_double(ckpt::element_as_double(&raw, dtype::f8_e5m2, 0), e5m2_reference(b)));
    // E5M2 is binary16's upper byte.
    CHECK(same_double(ckpt::float8_e5m2::to_float(x), ckpt::float16::to_float(static_cast<std::uint16_t>(b << 8))));
  }
  // The landmarks the formats are known by.
  CHECK(static_cast<float>(ckpt::float8_e4m3{0x7e}) == 448.0f);  // largest finite
  CHECK(static_cast<float>(ckpt::float8_e4m3{0xfe}) == -448.0f);
  CHECK(std::isnan(static_cast<float>(ckpt::float8_e4m3{0x7f})));
  CHECK(std::isnan(static_cast<float>(ckpt::float8_e4m3{0xff})));
  CHECK(static_cast<float>(ckpt::float8_e4m3{0x78}) == 256.0f);  // no infinity at S.1111.000
  CHECK(static_cast<float>(ckpt::float8_e4m3{0x38}) == 1.0f);
  CHECK(static_cast<float>(ckpt::float8_e4m3{0x01}) == std::ldexp(1.0f, -9));  // smallest subnormal
  CHECK(static_cast<float>(ckpt::float8_e4m3{0x08}) == std::ldexp(1.0f, -6));  // smallest normal
  CHECK(std::signbit(static_cast<float>(ckpt::float8_e4m3{0x80})));            // -0
  CHECK(static_cast<float>(ckpt::float8_e5m2{0x3c}) == 1.0f);
  CHECK(static_cast<float>(ckpt::float8_e5m2{0x7b}) == 57344.0f);
  CHECK(static_cast<float>(ckpt::float8_e5m2{0x7c}) == HUGE_VALF);
  CHECK(static_cast<float>(ckpt::float8_e5m2{0xfc}) == -HUGE_VALF);
  CHECK(std::isnan(static_cast<float>(ckpt::float8_e5m2{0x7d})));
  CHECK(static_cast<float>(ckpt::float8_e5m2{0x01}) == std::ldexp(1.0f, -16));
  static_assert(ckpt::float8_e4m3::to_float(0x38) == 1.0f);  // usable in constant expressions
}

TEST_CASE("u16, u32, u64 and FP8 round-trip bit-exact with every codec") {
  round_trip<ckpt::raw>("raw");
  round_trip<ckpt::zstd>("zstd");
  round_trip<ckpt::zstd_bytegroup>("zstd_bytegroup");
  round_trip<ckpt::auto_codec>("auto_codec");
}

TEST_CASE("the new dtypes round-trip through the memory storage and read in parts") {
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, mem, {.chunk_bytes = 24}};
  wide_state saved(9);
  cp.save(1, saved);
  wide_state loaded(1);
  cp.load(loaded);
  CHECK(loaded == saved);

  // A slice that crosses chunks: rows 3..8 of w, and the middle of the u64s.
  ckpt::reader r{mem};
  std::vector<std::uint32_t> part(5 * 3);
  r.read("w", ckpt::view(part.data(), {5, 3}).sharded({.global_shape = {10, 3}, .offset = {3, 0}}));
  CHECK(std::equal(part.begin(), part.end(), saved.w.begin() + 9));
  std::vector<std::uint64_t> mid(4);
  r.read("u64", ckpt::view(mid.data(), {4}).sharded({.global_shape = {saved.u64.size()}, .offset = {3}}));
  CHECK(std::equal(mid.begin(), mid.end(), saved.u64.begin() + 3));
  std::vector<ckpt::float8_e4m3> row(16);
  r.read("fp8.e4m3", ckpt::view(row.data(), {1, 16}).sharded({.global_shape = {16, 16}, .offset = {7, 0}}));
  CHECK(std::equal(row.begin(), row.end(), saved.e4m3.begin() + 7 * 16));
}

TEST_CASE("the new dtypes survive a tp change: saved at tp=3, loaded at tp=2 and whole") {
  test::temp_dir dir;
  auto errors = test::on_ranks(3, [&](ckpt::in_process comm, std::uint32_t r) {
    ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::posix, ckpt::zstd_bytegroup> cp{
        {.tp = 3, .comm = comm}, dir.path(), {.chunk_bytes = 8}};
    wide_state s(4, r, 3);
    cp.save(10, s);
  });
  for (const auto& e : errors) CHECK(e == "");
  errors = test::on_ranks(2, [&](ckpt::in_process comm, std::uint32_t r) {
    ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::posix, ckpt::zstd_bytegroup> cp{{.tp = 2, .comm = comm},
                                                                                              dir.path()};
    wide_state want(4, r, 2), got(77, r, 2);
    cp.load(got, {.on_topology_change = ckpt::topology_change::from_rank_0});
    if (!(got == want)) throw std::runtime_error("rank " + std::to_string(r) + " loaded other values");
  });
  for (const auto& e : errors) CHECK(e == "");
  ckpt::checkpointer<ckpt::single_process, ckpt::posix> whole{{}, dir.path()};
  wide_state want(4), got(78);
  whole.load(got, {.on_topology_change = ckpt::topology_change::from_rank_0});
  CHECK(got == want);
}

TEST_CASE("FP8 validation logits compare as their exact values") {
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, mem};
  wide_state s(2);
  std::vector<ckpt::float8_e5m2> logits(64);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i].bits = static_cast<std::uint8_t>(0x30 + i);  // finite values
  cp.save(1, s, {.validation_logits = ckpt::view(logits, {64})});
  wide_state back(5);
  auto same = logits;
  CHECK_NOTHROW(cp.load(back, {.validation_logits = ckpt::view(same, {64})}));
  auto moved = logits;
  moved[10].bits = static_cast<std::uint8_t>(moved[10].bits + 4);  // 4 steps: well beyond any tolerance
  const auto e = test::catch_error([&] { cp.load(back, {.validation_logits = ckpt::view(moved, {64})}); });
  CHECK(e.kind() == ckpt::error_kind::mismatch);
}

TEST_CASE("a dtype id this ckpt does not know is refused, naming the id and the tensor") {
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, mem};
  wide_state s(2);
  cp.save(1, s);
  // metadata.json names dtypes: one from a newer ckpt is refused as corrupt, naming it.
  const std::string tag = "global_step1";
  auto& text = mem.bytes(tag + "/metadata.json");
  std::string j(reinterpret_cast<const char*>(text.data()), text.size());
  const auto at = j.find("\"f8_e5m2\"");
  REQUIRE(at != std::string::npos);
  j.replace(at, 9, "\"f4_e2m1\"");
  namespace d = ckpt::detail;  // and the envelope's checksum made right again
  const std::size_t doc_begin = d::envelope_head.size() + 16 + d::envelope_mid.size();
  const std::string sum = d::to_hex(d::xxh3(std::string_view(j).substr(doc_begin, j.size() - doc_begin - d::envelope_tail.size())));
  j.replace(d::envelope_head.size(), 16, sum);
  text.assign(reinterpret_cast<const std::byte*>(j.data()), reinterpret_cast<const std::byte*>(j.data()) + j.size());
  const auto e = test::catch_error([&] { ckpt::reader{mem}; });
  CHECK(e.kind() == ckpt::error_kind::corrupt);
  INFO(std::string(e.what()));
  CHECK(test::mentions(e.what(), "unknown dtype 'f4_e2m1' of tensor 'fp8.e5m2'"));
  // The ids: 1 to last_dtype_id are assigned, the next is not.
  CHECK(ckpt::dtype_from_id(ckpt::last_dtype_id) == dtype::f8_e5m2);
  CHECK_FALSE(ckpt::dtype_from_id(ckpt::last_dtype_id + 1));
}
