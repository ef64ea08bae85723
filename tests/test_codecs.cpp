// Every codec passes the same suite: round trips of every dtype through save and load, stored
// chunks that are standard zstd frames, and damaged or hostile frames rejected as corrupt.

#include "helpers.hpp"

#include <zstd.h>

using test::catch_error;
using test::every_dtype_state;

TEST_CASE_TEMPLATE("every codec round-trips every dtype exactly", C, ckpt::raw, ckpt::zstd, ckpt::zstd_bytegroup) {
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
    std::vector<std::byte> out(c.raw_size[0]);
    const auto n = ZSTD_decompress(out.data(), out.size(), file.data() + c.file_offset[0], c.stored_size[0]);
    CHECK_FALSE(ZSTD_isError(n));
    CHECK(n == out.size());
    return md;
  }();
  const auto& c = md.tensors.at(0).chunks;
  CHECK(c.codec[0] == C::id);
  CHECK(c.stored_size[0] * 10 < c.raw_size[0] * 9);  // at least 10% smaller
}

TEST_CASE("zstd_bytegroup compresses normal floats better than plain zstd") {
  std::vector<ckpt::bfloat16> w(256 * 1024);
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
