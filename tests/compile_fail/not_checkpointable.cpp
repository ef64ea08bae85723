// expect: ckpt: this type is not Checkpointable. Add a member `template <class V> void checkpoint(V& v)
// A state with no checkpoint member and no checkpoint_traits, passed to save.
#include <ckpt/ckpt.hpp>

#include <vector>

struct state {
  std::vector<float> w;
};

void use() {
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, ckpt::memory_storage{}};
  cp.save(1, state{});
}
