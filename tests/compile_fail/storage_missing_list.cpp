// expect: ckpt: Storage needs `std::vector<std::string> list(std::string_view prefix) const`
// A Storage with everything but list(), used as the checkpointer's Storage parameter.
#include <ckpt/ckpt.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

struct my_store {
  struct writer {
    void write(std::span<const std::byte>) {}
    void sync() {}
    void publish() {}
  };
  writer create(std::string_view) { return {}; }
  void read(std::string_view, std::uint64_t, std::span<std::byte>) const {}
  std::optional<std::uint64_t> size(std::string_view) const { return std::nullopt; }
  void remove(std::string_view) {}
  void remove_all(std::string_view) {}
  std::string describe(std::string_view key) const { return std::string(key); }
};

ckpt::checkpointer<ckpt::single_process, my_store> cp{{}, my_store{}};
