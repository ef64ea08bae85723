// expect: ckpt: v.value(name, x) needs x to be cereal-serialisable
// v.value with a struct that has neither serialize() nor << and >>.
#include <ckpt/ckpt.hpp>

struct schedule {
  double lr = 0.1;
  int warmup = 10;
};

struct state {
  schedule sched;
  template <class V>
  void checkpoint(V& v) {
    v.value("sched", sched);
  }
};

void use() {
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, ckpt::memory_storage{}};
  cp.save(1, state{});
}
