// expect: std::vector<bool> is not contiguous: use std::vector<std::uint8_t>
// v.tensor with std::vector<bool>, whose bits cannot be viewed as bytes.
#include <ckpt/ckpt.hpp>

#include <vector>

struct state {
  std::vector<bool> mask = std::vector<bool>(8);
  template <class V>
  void checkpoint(V& v) {
    v.tensor("mask", mask);
  }
};

void use() {
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, ckpt::memory_storage{}};
  cp.save(1, state{});
}
