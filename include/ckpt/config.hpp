#pragma once
/// @file config.hpp
/// `ckpt::config`: the run's hyper-parameters, stored with every checkpoint and compared on
/// load (GPT-NeoX's `check_checkpoint_args`).

#include <charconv>
#include <concepts>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <cereal/cereal.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/string.hpp>

namespace ckpt {

/// One config value, kept as text so any engine's arguments fit: integers in decimal, floating
/// point in the shortest form that reads back exactly, bools as true/false.
struct config_value {
  std::string text;

  config_value(std::string s) : text(std::move(s)) {}  // NOLINT: implicit on purpose
  config_value(const char* s) : text(s) {}              // NOLINT
  config_value(std::string_view s) : text(s) {}         // NOLINT
  config_value(bool b) : text(b ? "true" : "false") {}  // NOLINT
  template <std::integral T>
    requires(!std::same_as<T, bool> && !std::same_as<T, char>)
  config_value(T v) : text(std::to_string(v)) {}  // NOLINT
  template <std::floating_point T>
  config_value(T v) {  // NOLINT
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    text.assign(buf, r.ptr);
  }
};

/// Key/value configuration of a run.
///
/// @code
/// ckpt::config args{{"hidden_size", 1024}, {"num_layers", 24}, {"lr", 3e-4}, {"precision", "bf16"}};
/// cp.save(step, state, {.config = args});
/// cp.load(state, {.config = args, .ignore_config_keys = {"lr"}});
/// @endcode
class config {
 public:
  config() = default;
  config(std::initializer_list<std::pair<std::string, config_value>> entries) {
    for (const auto& [k, v] : entries) set(k, v);
  }

  /// Sets (or replaces) one key.
  config& set(std::string key, config_value value) {
    entries_[std::move(key)] = std::move(value.text);
    return *this;
  }
  /// The value of `key`, or nullptr.
  const std::string* find(std::string_view key) const {
    auto it = entries_.find(std::string(key));
    return it == entries_.end() ? nullptr : &it->second;
  }
  const std::map<std::string, std::string>& entries() const noexcept { return entries_; }
  bool empty() const noexcept { return entries_.empty(); }
  friend bool operator==(const config&, const config&) = default;

  // metadata.json holds the config as a plain JSON object {"key": "value", ...} (impl/metadata.ipp).
  // Through cereal (a config kept as a checkpoint value, `v.value("args", cfg)`) it is the map, as
  // cereal stores one.
  template <class A>
  void serialize(A& ar) {
    ar(entries_);
  }

 private:
  std::map<std::string, std::string> entries_;
};

}  // namespace ckpt
