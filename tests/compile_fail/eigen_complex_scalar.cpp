// expect: this Eigen scalar type has no ckpt dtype
// v.tensor with an Eigen matrix of std::complex, which no ckpt dtype holds.
#include <ckpt/adapters/eigen.hpp>
#include <ckpt/ckpt.hpp>

struct state {
  Eigen::MatrixXcf z = Eigen::MatrixXcf::Zero(2, 2);
  template <class V>
  void checkpoint(V& v) {
    v.tensor("z", z);
  }
};

void use() {
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, ckpt::memory_storage{}};
  cp.save(1, state{});
}
