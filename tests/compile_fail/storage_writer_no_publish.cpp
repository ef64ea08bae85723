// expect: ckpt: the writer returned by Storage::create needs `void write(std::span<const std::byte>)`, `void sync()` and `void publish()`
// A Storage whose writer cannot publish: the atomic rename is the point of the protocol.
#include <ckpt/ckpt.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

struct my_store {
  struct writer {
    void write(std::span<const std::byte>) {}
    void sync() {}
  };
  writer create(std::string_view) { return {}; }
  void read(std::string_view, std::uint64_t, std::span<std::byte>) const {}
  std::optional<std::uint64_t> size(std::string_view) const { return std::nullopt; }
  std::vector<std::string> list(std::string_view) const { return {}; }
  void remove(std::string_view) {}
  void remove_all(std::string_view) {}
  std::string describe(std::string_view key) const { return std::string(key); }
};

ckpt::checkpointer<ckpt::single_process, my_store> cp{{}, my_store{}};
