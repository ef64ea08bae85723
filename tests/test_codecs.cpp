// Every codec passes the same suite: round trips of every dtype through save and load, stored
// chunks that are standard zstd frames, and damaged or hostile frames rejected as corrupt.

#include "helpers.hpp"

#include <zstd.h>

#include <cstring>
#include <map>
#include <set>

using test::catch_error;
using test::every_dtype_state;

TEST_CASE_TEMPLATE("every codec round-trips every dtype exactly", C, ckpt::raw, ckpt::zstd, ckpt::zstd_bytegroup,
                   ckpt::auto_codec) {
  for (std::uint64_t chunk : {std::uint64_t{96}, std::uint64_t{4} << 20}) {
    CAPTURE(chunk);
    ckpt::memory_storage mem;
    ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage, C> cp{{}, mem, {.chunk_bytes = chunk}};
    every_dtype_state saved, loaded;
    saved.randomise(chunk + C::id);
    cp.save(1, saved);
    cp.load(loaded);
    CHECK(loaded == saved);
    // Any checkpointer reads ckpt's own codecs, whatever it writes with.
    ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> plain{{}, mem};
    every_dtype_state again;
    plain.load(again);
    CHECK(again == saved);
  }
}

TEST_CASE_TEMPLATE("compressing codecs shrink redundant data and store standard zstd frames", C, ckpt::zstd,
                   ckpt::zstd_bytegroup) {
  std::vector<float> w(64 * 1024);
  test::fill_random(w, 3);
  for (auto& x : w) x = static_cast<float>(ckpt::bfloat16(x));  // bf16-valued floats: low mantissa bytes are zero
  const auto md = [&] {
    ckpt::memory_storage mem;
    ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage, C> cp{{}, mem};
    struct s {
      std::vector<float>* w;
      void checkpoint(ckpt::visitor& v) { v.tensor("w", *w); }
    } st{&w};
    cp.save(1, st);
    auto md = test::read_metadata(mem, "global_step1");
    // The stored chunk decompresses with plain libzstd (concatenated frames are standard).
    const auto& c = md.tensors.at(0).chunks;
    const auto& file = mem.bytes("global_step1/mp_rank_00/model_optim_rng.ckpt");
    std::vector<std::byte> out(c.elements(0) * ckpt::size_of(md.tensors.at(0).type));
    const auto n = ZSTD_decompress(out.data(), out.size(), file.data() + c.file_offset[0], c.stored_size[0]);
    CHECK_FALSE(ZSTD_isError(n));
    CHECK(n == out.size());
    return md;
  }();
  const auto& c = md.tensors.at(0).chunks;
  CHECK(c.codec[0] == C::id);
  CHECK(c.stored_size[0] * 10 < c.elements(0) * ckpt::size_of(md.tensors.at(0).type) * 9);  // at least 10% smaller
}

TEST_CASE("zstd_bytegroup compresses normal floats better than plain zstd") {
  std::vector<ckpt::bfloat16> w(2 * 1024 * 1024);  // one default chunk of 4 MiB
  test::fill_random(w, 9);  // N(0, 0.02), like model weights
  auto stored = [&](auto codec) {
    using C = decltype(codec);
    ckpt::memory_storage mem;
    ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage, C> cp{{}, mem};
    struct s {
      std::vector<ckpt::bfloat16>* w;
      void checkpoint(ckpt::visitor& v) { v.tensor("w", *w); }
    } st{&w};
    cp.save(1, st);
    const auto md = test::read_metadata(mem, "global_step1");
    std::uint64_t total = 0;
    for (auto n : md.tensors.at(0).chunks.stored_size) total += n;
    return total;
  };
  const auto raw = w.size() * 2;
  const auto plain = stored(ckpt::zstd{});
  const auto grouped = stored(ckpt::zstd_bytegroup{});
  MESSAGE("bf16 N(0,0.02): zstd ratio " << static_cast<double>(raw) / plain << ", zstd_bytegroup ratio "
                                        << static_cast<double>(raw) / grouped);
  CHECK(grouped < plain);
  CHECK(static_cast<double>(raw) / grouped >= 1.45);  // issue 4's target; 1.51 on this chunk
}

TEST_CASE("zstd_bytegroup round-trips special floats and every element size, including odd byte counts") {
  std::vector<std::byte> in(4 * 8 * 1000 + 3);
  std::mt19937_64 g(4);
  for (auto& b : in) b = static_cast<std::byte>(g());
  // NaN, infinities, signed zeros and denormals in the first elements of each width.
  const std::uint64_t specials[] = {0x7ff8000000000001ull, 0xfff0000000000000ull, 0x8000000000000000ull, 1ull};
  std::memcpy(in.data(), specials, sizeof specials);
  for (auto t : {ckpt::dtype::f64, ckpt::dtype::f32, ckpt::dtype::f16, ckpt::dtype::bf16, ckpt::dtype::i64,
                 ckpt::dtype::i32, ckpt::dtype::i16, ckpt::dtype::u8}) {
    CAPTURE(ckpt::to_string(t));
    for (std::size_t n : {std::size_t{0}, ckpt::size_of(t), std::size_t{8 * 1000}, std::size_t{8 * 1000 + 3}, in.size() - 3}) {
      CAPTURE(n);
      const auto src = std::span<const std::byte>(in).first(n);
      ckpt::zstd_bytegroup c;
      std::vector<std::byte> enc(c.max_encoded_size(n)), back(n);
      enc.resize(c.encode(src, t, enc));
      c.decode(enc, t, back);
      CHECK(std::equal(back.begin(), back.end(), src.begin(), src.end()));
    }
  }
}

TEST_CASE("stored (uncompressed) zstd frames are standard: libzstd reads them, whatever their size") {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{128 * 1024}, std::size_t{128 * 1024 + 1}, std::size_t{1000000}}) {
    CAPTURE(n);
    std::vector<std::byte> in(n);
    std::mt19937_64 g(n);
    for (auto& b : in) b = static_cast<std::byte>(g());
    std::vector<std::byte> frame(ckpt::detail::zstd_stored_frame_size(n));
    CHECK(ckpt::detail::zstd_store(in, frame) == frame.size());
    CHECK(ZSTD_getFrameContentSize(frame.data(), frame.size()) == n);
    std::vector<std::byte> out(n + 1);
    const auto got = ZSTD_decompress(out.data(), out.size(), frame.data(), frame.size());
    REQUIRE_FALSE(ZSTD_isError(got));
    CHECK(got == n);
    CHECK(std::equal(in.begin(), in.end(), out.begin()));
  }
}

TEST_CASE("auto_codec chooses per tensor: floats byte-grouped, integers zstd, small tensors raw") {
  std::vector<float> weights(64 * 1024);
  std::vector<std::int64_t> ids(64 * 1024);
  std::vector<float> bias(100);
  test::fill_random(weights, 1);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i % 1000);
  test::fill_random(bias, 2);
  struct s {
    std::vector<float>* w;
    std::vector<std::int64_t>* ids;
    std::vector<float>* b;
    void checkpoint(ckpt::visitor& v) {
      v.tensor("w", *w);
      v.tensor("ids", *ids);
      v.tensor("b", *b);
    }
  } st{&weights, &ids, &bias};
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage, ckpt::auto_codec> cp{{}, mem, {.chunk_bytes = 100000}};
  cp.save(1, st);
  const auto md = test::read_metadata(mem, "global_step1");
  std::map<std::string, std::set<int>> codecs;
  for (const auto& t : md.tensors)
    for (auto c : t.chunks.codec) codecs[t.name].insert(c);
  CHECK(codecs["w"] == std::set<int>{2});
  CHECK(codecs["ids"] == std::set<int>{1});
  CHECK(codecs["b"] == std::set<int>{0});
  auto w2 = weights, b2 = bias;
  auto ids2 = ids;
  std::fill(w2.begin(), w2.end(), 0.f);
  std::fill(ids2.begin(), ids2.end(), 0);
  std::fill(b2.begin(), b2.end(), 0.f);
  s back{&w2, &ids2, &b2};
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> plain{{}, mem};
  plain.load(back);
  CHECK(w2 == weights);
  CHECK(ids2 == ids);
  CHECK(b2 == bias);
}

TEST_CASE("damaged and hostile zstd frames are corrupt, never a crash or a huge allocation") {
  std::vector<std::byte> out(1000);
  std::vector<std::byte> src(1000, std::byte{7});
  std::vector<std::byte> frame(ZSTD_compressBound(src.size()));
  frame.resize(ZSTD_compress(frame.data(), frame.size(), src.data(), src.size(), 1));
  ckpt::zstd z;
  z.decode(frame, ckpt::dtype::u8, out);
  CHECK(out == src);
  // A frame whose header claims a huge content size (decompression bomb).
  std::vector<std::byte> big(1 << 20, std::byte{0});
  std::vector<std::byte> bomb(ZSTD_compressBound(big.size()));
  bomb.resize(ZSTD_compress(bomb.data(), bomb.size(), big.data(), big.size(), 1));
  auto e = catch_error([&] { z.decode(bomb, ckpt::dtype::u8, out); });
  CHECK(e.kind() == ckpt::error_kind::corrupt);
  CHECK(std::string(e.what()).find("claim 1048576 bytes") != std::string::npos);
  // Truncated, garbage, and flipped frames.
  e = catch_error([&] { z.decode(std::span(frame).first(frame.size() / 2), ckpt::dtype::u8, out); });
  CHECK(e.kind() == ckpt::error_kind::corrupt);
  std::vector<std::byte> junk(64, std::byte{0x5a});
  e = catch_error([&] { z.decode(junk, ckpt::dtype::u8, out); });
  CHECK(e.kind() == ckpt::error_kind::corrupt);
  for (std::size_t i = 0; i < frame.size(); ++i) {
    auto bad = frame;
    bad[i] ^= std::byte{0x40};
    try {
      ckpt::zstd_bytegroup{}.decode(bad, ckpt::dtype::u8, out);
    } catch (const ckpt::error& err) {
      CHECK(err.kind() == ckpt::error_kind::corrupt);
    }
  }
}
