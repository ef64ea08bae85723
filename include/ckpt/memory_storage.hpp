#pragma once
/// @file memory_storage.hpp
/// `ckpt::memory_storage`: a Storage in process memory, for tests and for checkpoints that
/// only need to survive within a process (e.g. a quick rollback point).

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "detail/keys.hpp"
#include "error.hpp"

namespace ckpt {

/// Keys map to byte vectors. Copies share the same contents, so a test can hand one copy to a
/// checkpointer and inspect or damage the bytes through another.
///
/// @code
/// ckpt::memory_storage mem;
/// ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, mem};
/// cp.save(1, state);
/// auto keys = mem.keys();  // {"global_step1/.ckpt_tag", "global_step1/metadata.json", ...}
/// @endcode
class memory_storage {
  struct files {
    std::mutex mu;
    std::map<std::string, std::vector<std::byte>, std::less<>> data;
  };

 public:
  /// Every access takes the lock: loads may read chunks from several threads.
  static constexpr bool concurrent_reads = true;

  class writer {
   public:
    void write(std::span<const std::byte> b) { bytes_.insert(bytes_.end(), b.begin(), b.end()); }
    void sync() noexcept {}
    void publish() {
      std::lock_guard lock(files_->mu);
      files_->data[key_] = std::move(bytes_);
    }

   private:
    friend class memory_storage;
    writer(std::shared_ptr<files> f, std::string key) : files_(std::move(f)), key_(std::move(key)) {}
    std::shared_ptr<files> files_;
    std::string key_;
    std::vector<std::byte> bytes_;
  };

  writer create(std::string_view key) {
    detail::check_key(key);
    return writer(files_, std::string(key));
  }

  void read(std::string_view key, std::uint64_t offset, std::span<std::byte> out) const {
    detail::check_key(key);
    std::lock_guard lock(files_->mu);
    auto it = files_->data.find(key);
    if (it == files_->data.end()) throw error(error_kind::not_found, "no such file: " + describe(key));
    const auto& b = it->second;
    if (offset > b.size() || out.size() > b.size() - offset)
      throw error(error_kind::corrupt, describe(key) + " is truncated: needed bytes [" + std::to_string(offset) + ", " +
                                           std::to_string(offset + out.size()) + "), the file ends at " +
                                           std::to_string(b.size()));
    if (!out.empty()) std::memcpy(out.data(), b.data() + offset, out.size());
  }

  std::optional<std::uint64_t> size(std::string_view key) const {
    detail::check_key(key);
    std::lock_guard lock(files_->mu);
    auto it = files_->data.find(key);
    if (it == files_->data.end()) return std::nullopt;
    return it->second.size();
  }

  std::vector<std::string> list(std::string_view prefix) const {
    detail::check_key(prefix, true);
    const std::string p = prefix.empty() ? std::string() : std::string(prefix) + "/";
    std::set<std::string> names;
    std::lock_guard lock(files_->mu);
    for (auto it = files_->data.lower_bound(p); it != files_->data.end() && it->first.starts_with(p); ++it) {
      const auto rest = std::string_view(it->first).substr(p.size());
      names.insert(std::string(rest.substr(0, rest.find('/'))));
    }
    return {names.begin(), names.end()};
  }

  void remove(std::string_view key) {
    detail::check_key(key);
    std::lock_guard lock(files_->mu);
    if (auto it = files_->data.find(key); it != files_->data.end()) files_->data.erase(it);
  }

  void remove_all(std::string_view prefix) {
    detail::check_key(prefix);
    const std::string p = std::string(prefix) + "/";
    std::lock_guard lock(files_->mu);
    for (auto it = files_->data.begin(); it != files_->data.end();)
      it = (it->first == prefix || it->first.starts_with(p)) ? files_->data.erase(it) : std::next(it);
  }

  std::string describe(std::string_view key) const { return "memory:" + std::string(key); }

  /// Every key, sorted (for tests).
  std::vector<std::string> keys() const {
    std::lock_guard lock(files_->mu);
    std::vector<std::string> k;
    for (const auto& [name, _] : files_->data) k.push_back(name);
    return k;
  }
  /// Direct access to a file's bytes (for tests that damage them); throws not_found.
  std::vector<std::byte>& bytes(std::string_view key) {
    std::lock_guard lock(files_->mu);
    auto it = files_->data.find(key);
    if (it == files_->data.end()) throw error(error_kind::not_found, "no such file: " + describe(key));
    return it->second;
  }

 private:
  std::shared_ptr<files> files_ = std::make_shared<files>();
};

}  // namespace ckpt
