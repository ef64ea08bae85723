#pragma once
// A Storage adapter that holds back a tag's commit: writes of `latest`, metadata.json and
// chunk_map.bin stay in memory instead of reaching the Storage, and whoever drives the save
// publishes them later (`take_held`). Everything else goes straight through.
//
// The memory tier saves through it: a tag of the fast tier may only be committed once every
// rank's files and their replicas on other nodes are in place, so the checkpointer's own commit
// (rank 0's metadata.json and `latest`) must wait for the replication that follows it.

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "keys.hpp"
#include "tag_store.hpp"

namespace ckpt::detail {

/// One held file: its key and its bytes.
struct held_file {
  std::string key;
  std::vector<std::byte> bytes;
};

template <class S>
class held_commit {
  struct held_files {
    std::mutex mu;
    std::vector<held_file> files;
  };

 public:
  explicit held_commit(S base) : base_(std::move(base)) {}

  /// Forwarded capabilities (concepts.hpp): parallel reads, reusable readers, read depth and
  /// the writer lock are the base Storage's.
  static constexpr bool concurrent_reads = ckpt::detail::concurrent_reads<S>;

  using base_writer = decltype(std::declval<S&>().create(std::string_view{}));

  class writer {
   public:
    void write(std::span<const std::byte> b) {
      if (to_base_)
        to_base_->write(b);
      else
        bytes_.insert(bytes_.end(), b.begin(), b.end());
    }
    void sync() {
      if (to_base_) to_base_->sync();
    }
    void publish() {
      if (to_base_) {
        to_base_->publish();
        return;
      }
      std::lock_guard lock(held_->mu);
      held_->files.push_back({std::move(key_), std::move(bytes_)});
    }

   private:
    friend class held_commit;
    std::optional<base_writer> to_base_;
    std::shared_ptr<held_files> held_;
    std::string key_;
    std::vector<std::byte> bytes_;
  };

  writer create(std::string_view key) {
    writer w;
    if (holds(key)) {
      check_key(key);
      w.held_ = held_;
      w.key_ = std::string(key);
    } else {
      w.to_base_.emplace(base_.create(key));
    }
    return w;
  }

  void read(std::string_view key, std::uint64_t offset, std::span<std::byte> out) const { base_.read(key, offset, out); }
  std::optional<std::uint64_t> size(std::string_view key) const { return base_.size(key); }
  std::vector<std::string> list(std::string_view prefix) const { return base_.list(prefix); }
  void remove(std::string_view key) { base_.remove(key); }
  void remove_all(std::string_view prefix) { base_.remove_all(prefix); }
  std::string describe(std::string_view key) const { return base_.describe(key); }

  auto open_reader(std::string_view key) const
    requires opens_readers<S>
  {
    return base_.open_reader(key);
  }
  unsigned reads_in_flight() const
    requires has_read_depth<S>
  {
    return base_.reads_in_flight();
  }
  auto lock_writer(bool wait)
    requires lockable_root<S>
  {
    return base_.lock_writer(wait);
  }

  /// The files held since the last call, in the order they were published (chunk_map.bin,
  /// metadata.json, `latest` for a commit).
  std::vector<held_file> take_held() {
    std::lock_guard lock(held_->mu);
    return std::exchange(held_->files, {});
  }

  S& base() noexcept { return base_; }
  const S& base() const noexcept { return base_; }

 private:
  /// `latest`, and a tag's metadata.json and chunk_map.bin.
  static bool holds(std::string_view key) {
    if (key == latest_file) return true;
    const auto slash = key.rfind('/');
    if (slash == std::string_view::npos) return false;
    const auto name = key.substr(slash + 1);
    return name == metadata_file || name == "chunk_map.bin";
  }

  S base_;
  std::shared_ptr<held_files> held_ = std::make_shared<held_files>();
};

}  // namespace ckpt::detail
