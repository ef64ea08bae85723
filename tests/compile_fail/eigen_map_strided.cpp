// expect: this Eigen::Map has a fixed inner stride other than 1: its elements are not contiguous
// v.tensor with an Eigen::Map whose compile-time inner stride leaves gaps between elements.
#include <ckpt/adapters/eigen.hpp>
#include <ckpt/ckpt.hpp>

#include <vector>

struct state {
  std::vector<float> buf = std::vector<float>(16);
  template <class V>
  void checkpoint(V& v) {
    v.tensor("every_other", Eigen::Map<Eigen::VectorXf, 0, Eigen::InnerStride<2>>(buf.data(), 8));
  }
};

void use() {
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, ckpt::memory_storage{}};
  cp.save(1, state{});
}
