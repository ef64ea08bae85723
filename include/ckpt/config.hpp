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

// Named for config's own JSON form, defined only where metadata.json is read and written
// (impl/metadata.ipp).
namespace cereal {
class JSONInputArchive;
class JSONOutputArchive;
}  // namespace cereal

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

  // In metadata.json the config is a plain JSON object {"key": "value", ...}; other archives
  // store the map as cereal does.
  template <class A>
  void save(A& ar) const {
    if constexpr (std::is_same_v<A, cereal::JSONOutputArchive>) {
      for (const auto& [k, v] : entries_) ar(cereal::make_nvp(k.c_str(), v));
    } else {
      ar(entries_);
    }
  }
  template <class A>
  void load(A& ar) {
    entries_.clear();
    if constexpr (std::is_same_v<A, cereal::JSONInputArchive>) {
      while (const char* key = ar.getNodeName()) {
        std::string k(key), v;
        ar(v);
        entries_[std::move(k)] = std::move(v);
      }
    } else {
      ar(entries_);
    }
  }

 private:
  std::map<std::string, std::string> entries_;
};

}  // namespace ckpt
