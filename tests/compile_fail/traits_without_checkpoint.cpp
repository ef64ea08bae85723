// expect: ckpt: checkpoint_traits<T> is specialised for this type but has no `static void checkpoint(ckpt::visitor& v, T& x)`
// checkpoint_traits specialised for a foreign type, but with the function misnamed; passed to load.
#include <ckpt/ckpt.hpp>

#include <vector>

struct foreign {
  std::vector<float> w;
};
template <>
struct ckpt::checkpoint_traits<foreign> {
  static void save(ckpt::visitor& v, foreign& f) { v.tensor("w", f.w); }
};

void use() {
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, ckpt::memory_storage{}};
  foreign f;
  cp.load(f);
}
