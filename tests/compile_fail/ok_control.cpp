// expect: compiles
// The positive control: everything the negative snippets get wrong, done right, with the same
// compiler and flags. If this fails, the include path or flags are broken and the other
// snippets' failures would prove nothing.
#include <ckpt/ckpt.hpp>

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

struct state {
  std::vector<float> w = std::vector<float>(4);
  std::uint64_t step = 0;
  std::mt19937 rng;
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", w);
    v.value("step", step);
    v.value("rng", rng);
  }
};

struct foreign {
  std::vector<double> m;
};
template <>
struct ckpt::checkpoint_traits<foreign> {
  static void checkpoint(ckpt::visitor& v, foreign& f) { v.tensor("m", f.m); }
};

struct my_store {
  struct writer {
    void write(std::span<const std::byte>) {}
    void sync() {}
    void publish() {}
  };
  writer create(std::string_view) { return {}; }
  void read(std::string_view, std::uint64_t, std::span<std::byte>) const {}
  std::optional<std::uint64_t> size(std::string_view) const { return std::nullopt; }
  std::vector<std::string> list(std::string_view) const { return {}; }
  void remove(std::string_view) {}
  void remove_all(std::string_view) {}
  std::string describe(std::string_view key) const { return std::string(key); }
};

struct my_codec {
  static constexpr std::uint8_t id = 130;
  std::size_t max_encoded_size(std::size_t n) const { return n; }
  std::size_t encode(std::span<const std::byte> in, ckpt::dtype, std::span<std::byte>) const { return in.size(); }
  void decode(std::span<const std::byte>, ckpt::dtype, std::span<std::byte>) const {}
};

static_assert(ckpt::Checkpointable<state>);
static_assert(ckpt::Checkpointable<foreign>);
static_assert(ckpt::Storage<my_store>);
static_assert(ckpt::Codec<my_codec>);

void use() {
  state s;
  foreign f;
  ckpt::checkpointer<ckpt::single_process, my_store, my_codec> cp{{}, my_store{}};
  cp.save(1, s);
  cp.save(2, f);
  cp.load(s);
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> mem{{}, ckpt::memory_storage{}};
  mem.save(1, s);
}
