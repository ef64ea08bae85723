// Built twice by tests/meson.build: header-only (the default) and with CKPT_SEPARATE_COMPILATION
// against the ckpt_impl library. Both save the same state under the same root layout, so
// tests/separate/check.py can compare what they wrote byte for byte and load each one's
// checkpoint with the other.
//
//   roundtrip save DIR   writes tags global_step3 (raw), global_step4 (zstd) and global_step5
//                        (zstd_bytegroup) under DIR
//   roundtrip load DIR   loads all three and checks every tensor and value
//
// The first two checkpointers are among those impl/instances.hpp lists: built separately, this
// program uses the library's. The third is not, so this file includes impl/checkpointer.ipp,
// as docs/architecture.md ("Two ways to compile") asks of such a translation unit; without it
// the separate build would fail to link.
#include <ckpt/ckpt.hpp>
#include <ckpt/impl/checkpointer.ipp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

struct state {
  std::vector<float> weights;
  std::vector<std::uint16_t> bf16_bits;
  std::vector<std::int64_t> counts;
  std::uint64_t step = 0;
  double lr = 0;
  std::mt19937_64 rng;
  std::vector<std::string> names;

  template <class V>
  void checkpoint(V& v) {
    v.tensor("model.weights", ckpt::view(weights.data(), {64, 48}));
    v.tensor("model.embed_bf16", ckpt::tensor_ref(ckpt::dtype::bf16, {32, 16}, bf16_bits.data()));
    v.group("optimizer", [&](auto& g) { g.tensor("counts", counts); });
    v.value("step", step);
    v.value("lr", lr);
    v.value("rng", rng);
    v.value("names", names);
  }
};

state filled(std::uint64_t seed) {
  state s;
  std::mt19937_64 gen(seed);
  s.weights.resize(64 * 48);
  for (auto& w : s.weights) w = static_cast<float>(gen() % 10007) / 97.0f;
  s.bf16_bits.resize(32 * 16);
  for (auto& b : s.bf16_bits) b = static_cast<std::uint16_t>(gen());
  s.counts.resize(100);
  for (auto& c : s.counts) c = static_cast<std::int64_t>(gen() % 1000) - 500;
  s.step = seed;
  s.lr = 3e-4 * static_cast<double>(seed);
  s.rng.seed(seed * 31);
  s.names = {"alpha", "beta", std::to_string(seed)};
  return s;
}

bool same(const state& a, const state& b) {
  return a.weights == b.weights && a.bf16_bits == b.bf16_bits && a.counts == b.counts && a.step == b.step && a.lr == b.lr &&
         a.rng == b.rng && a.names == b.names;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s save|load DIR\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1], root = argv[2];
  try {
    const ckpt::config args{{"hidden", 48}, {"lr", 3e-4}, {"precision", "bf16"}};
    const ckpt::checkpointer_options opts{.chunk_bytes = 4096};
    // One writer per root at a time (each checkpointer holds the root's lock from its first save).
    using raw_checkpointer = ckpt::checkpointer<>;
    using zstd_checkpointer = ckpt::checkpointer<ckpt::single_process, ckpt::posix, ckpt::zstd>;
    using bytegroup_checkpointer = ckpt::checkpointer<ckpt::single_process, ckpt::posix, ckpt::zstd_bytegroup>;
    if (mode == "save") {
      raw_checkpointer{{}, ckpt::posix(root), opts}.save(3, filled(3), {.config = args});
      zstd_checkpointer{{}, ckpt::posix(root), opts}.save(4, filled(4), {.config = args});
      bytegroup_checkpointer{{}, ckpt::posix(root), opts}.save(5, filled(5), {.config = args});
      return 0;
    }
    if (mode != "load") return 2;
    raw_checkpointer raw_cp{{}, ckpt::posix(root), opts};
    zstd_checkpointer zstd_cp{{}, ckpt::posix(root), opts};
    bytegroup_checkpointer bytegroup_cp{{}, ckpt::posix(root), opts};
    for (std::uint64_t it : {3, 4, 5}) {
      state s = filled(99);
      const ckpt::load_options how{.iteration = it, .config = args};
      const auto r = it == 3 ? raw_cp.load(s, how) : it == 4 ? zstd_cp.load(s, how) : bytegroup_cp.load(s, how);
      if (r.iteration != it || !same(s, filled(it))) {
        std::fprintf(stderr, "iteration %llu did not load back as saved\n", static_cast<unsigned long long>(it));
        return 1;
      }
    }
    std::puts("loaded all three tags");
    return 0;
  } catch (const ckpt::error& e) {
    std::fprintf(stderr, "ckpt error: %s\n", e.what());
    return 1;
  }
}
