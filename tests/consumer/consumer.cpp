// A program as a user of the installed ckpt would write it: it sees ckpt only through the
// include path and link flags that pkg-config or CMake's find_package(ckpt) give it.
//
//   consumer <dir>   saves a small state under <dir> (posix) and in memory, loads it back
//                    into a blank state and checks every value; exit 0 on success.

#include <ckpt/ckpt.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

namespace {

struct model {
  std::vector<float> weight = std::vector<float>(64);
  std::vector<std::int64_t> counts = std::vector<std::int64_t>(8);
  std::uint64_t step = 0;
  std::mt19937 rng;

  template <class V>
  void checkpoint(V& v) {
    v.tensor("fc.weight", ckpt::view(weight.data(), {8, 8}));
    v.tensor("counts", counts);
    v.value("step", step);
    v.value("rng", rng);
  }
};

model trained() {
  model m;
  for (std::size_t i = 0; i < m.weight.size(); ++i) m.weight[i] = 0.5f * static_cast<float>(i) - 3.0f;
  for (std::size_t i = 0; i < m.counts.size(); ++i) m.counts[i] = -static_cast<std::int64_t>(i * i);
  m.step = 42;
  m.rng.seed(7);
  m.rng.discard(100);
  return m;
}

int failures = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "consumer: FAILED: %s\n", what);
    ++failures;
  }
}

void check_same(model& loaded, const model& saved, const ckpt::load_result& r, const char* storage) {
  std::fprintf(stderr, "consumer: checking %s round trip (tag %s)\n", storage, r.tag.c_str());
  check(r.iteration == 42, "load_result::iteration");
  check(r.tag == "global_step42", "load_result::tag");
  check(loaded.weight == saved.weight, "tensor fc.weight");
  check(loaded.counts == saved.counts, "tensor counts");
  check(loaded.step == saved.step, "value step");
  check(loaded.rng == saved.rng, "value rng");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <empty directory for the checkpoint>\n", argv[0]);
    return 2;
  }
  try {
    const model saved = trained();

    ckpt::checkpointer cp{ckpt::single_process{}, ckpt::posix{std::string(argv[1])}};
    cp.save(42, saved);
    model loaded;
    auto r = cp.load(loaded);
    check_same(loaded, saved, r, "posix");
    check(cp.latest() == "global_step42", "latest");

    ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> mem{{}, ckpt::memory_storage{}};
    mem.save(42, saved);
    model loaded2;
    auto r2 = mem.load(loaded2);
    check_same(loaded2, saved, r2, "memory_storage");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: FAILED with exception: %s\n", e.what());
    return 1;
  }
  if (failures) return 1;
  std::printf("consumer: ckpt %s OK\n", ckpt::version);
  return 0;
}
