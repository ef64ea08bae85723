// expect: ckpt: v.tensor(name, x) needs x to be a ckpt::tensor_ref (ckpt::view(ptr, shape))
// v.tensor with a container of strings: not an element type, no tensor_traits.
#include <ckpt/ckpt.hpp>

#include <string>
#include <vector>

struct state {
  std::vector<std::string> vocab;
  template <class V>
  void checkpoint(V& v) {
    v.tensor("vocab", vocab);
  }
};

void use() {
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, ckpt::memory_storage{}};
  cp.save(1, state{});
}
