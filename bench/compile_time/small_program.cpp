// A small program that saves and loads one Checkpointable type.
#include <ckpt/ckpt.hpp>

#include <cstdint>
#include <vector>

struct model {
  std::vector<float> weights = std::vector<float>(1024, 1.0f);
  std::uint64_t step = 0;
  template <class V>
  void checkpoint(V& v) {
    v.tensor("weights", weights);
    v.value("step", step);
  }
};

int main(int argc, char** argv) {
  ckpt::checkpointer<> cp{{}, ckpt::posix(argc > 1 ? argv[1] : "/tmp/ckpt-small")};
  model m;
  cp.save(1, m);
  auto r = cp.load(m);
  return r.iteration == 1 ? 0 : 1;
}
