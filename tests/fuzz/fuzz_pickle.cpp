// libFuzzer target: the restricted unpickler (interop/unpickle.hpp) on arbitrary bytes. It must
// refuse with a ckpt::error, never crash, read out of bounds or allocate without bound; and
// what it accepts is pickled again and read back, which exercises the pickler on odd trees.
// (No equality check: a NaN in the tree never equals itself.)

#include <ckpt/interop/pickle.hpp>
#include <ckpt/interop/unpickle.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ckpt::interop;
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  py_object o;
  try {
    o = unpickle(in, "fuzz/data.pkl", {.max_depth = 200, .max_objects = 1 << 16, .max_result_bytes = 1 << 24, .max_rank = 64});
  } catch (const ckpt::error&) {
    return 0;
  }
  try {
    (void)unpickle(pickle(o), "fuzz/again.pkl");
  } catch (const ckpt::error&) {
    // a tree Python could not load either (e.g. a tensor without its storage) is refused
  }
  return 0;
}
