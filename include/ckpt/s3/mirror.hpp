#pragma once
/// @file s3/mirror.hpp
/// `ckpt::s3_mirror`: save to local disk as usual, then copy each committed tag to a bucket in
/// the background, without stalling training. What GPT-NeoX's `upload_checkpoint` does from
/// rank 0 after the fact, done so that the bucket is always a loadable checkpoint root:
///
/// - a tag's data files go up first, then its `metadata.json` (the commit point), then `latest`:
///   a reader of the bucket sees the previous tag until the new one is whole;
/// - every file is read back from local disk through the same size check the upload makes, and
///   every object carries Content-MD5 (see `ckpt::s3`);
/// - uploads run on one background thread (each file's parts `upload_concurrency` at a time),
///   optionally limited to `bytes_per_second`;
/// - `status()` tells what is done and what failed; `wait()` rethrows a failure.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../checkpointer.hpp"
#include "../detail/keys.hpp"
#include "../error.hpp"
#include "../s3.hpp"
#include "../single_process.hpp"

namespace ckpt {

struct s3_mirror_options {
  /// 0: as fast as the store takes it. Otherwise the upload sleeps so that its average rate
  /// stays under this many bytes per second (training's own traffic keeps the rest).
  std::uint64_t bytes_per_second = 0;
  /// Bytes read from local disk and handed to the upload at a time.
  std::size_t block_bytes = std::size_t{8} << 20;
  /// After a tag is uploaded, delete the bucket's oldest committed tags beyond this many
  /// (0: keep all). Never the tag `latest` names.
  std::size_t keep_last_n = 0;
};

/// Where one tag's upload stands.
struct s3_mirror_status {
  enum class state { queued, uploading, done, failed };
  std::string tag{};
  state now = state::queued;
  std::uint64_t bytes_total = 0, bytes_done = 0;
  std::string error{};  ///< why it failed (state::failed)
};

/// @code
/// ckpt::checkpointer<> cp{{}, "/local/run7"};
/// ckpt::s3_mirror mirror{"/local/run7", ckpt::s3{{.bucket = "runs", .prefix = "run7"}}};
/// cp.save(step, model);
/// mirror.upload(*cp.latest());   // returns at once; training goes on
/// ...
/// mirror.wait();                 // at exit: throws if any upload failed
/// @endcode
class s3_mirror {
 public:
  s3_mirror(std::filesystem::path local_root, s3 store, s3_mirror_options options = {})
      : root_(std::move(local_root)), store_(std::move(store)), options_(options), worker_([this] { run(); }) {}

  s3_mirror(const s3_mirror&) = delete;
  s3_mirror& operator=(const s3_mirror&) = delete;

  /// Finishes the uploads already queued (errors stay in status()), then stops.
  ~s3_mirror() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    worker_.join();
  }

  /// Queues a committed local tag for upload and returns at once. Throws invalid_argument if
  /// the tag is not committed locally (its metadata.json is missing).
  void upload(const std::string& tag) {
    detail::check_key(tag);
    if (tag.find('/') != std::string::npos || !std::filesystem::exists(root_ / tag / "metadata.json"))
      throw error(error_kind::invalid_argument, "s3_mirror: " + (root_ / tag).string() + " is not a committed tag");
    {
      std::lock_guard lock(mu_);
      jobs_.push_back({.tag = tag});
    }
    wake_.notify_all();
  }

  /// Every tag queued so far, oldest first, with where its upload stands.
  std::vector<s3_mirror_status> status() const {
    std::lock_guard lock(mu_);
    return {jobs_.begin(), jobs_.end()};
  }

  /// Blocks until every queued upload has finished; throws the first failure (once).
  void wait() {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [&] { return std::none_of(jobs_.begin(), jobs_.end(), [](const auto& j) { return pending(j); }); });
    for (auto& j : jobs_)
      if (j.now == s3_mirror_status::state::failed && !reported_.contains(j.tag)) {
        reported_.insert(j.tag);
        throw error(error_kind::io, "s3_mirror: uploading " + j.tag + " to " + store_.describe(j.tag) + " failed: " + j.error);
      }
  }

 private:
  static bool pending(const s3_mirror_status& j) {
    return j.now == s3_mirror_status::state::queued || j.now == s3_mirror_status::state::uploading;
  }

  void run() {
    for (;;) {
      std::size_t index = 0;
      {
        std::unique_lock lock(mu_);
        wake_.wait(lock, [&] { return stopping_ || std::any_of(jobs_.begin(), jobs_.end(), [](const auto& j) { return j.now == s3_mirror_status::state::queued; }); });
        auto it = std::find_if(jobs_.begin(), jobs_.end(), [](const auto& j) { return j.now == s3_mirror_status::state::queued; });
        if (it == jobs_.end()) return;  // stopping, nothing left
        it->now = s3_mirror_status::state::uploading;
        index = static_cast<std::size_t>(it - jobs_.begin());
      }
      std::string failure;
      try {
        upload_tag(index);
      } catch (const std::exception& e) {
        failure = e.what();
      }
      {
        std::lock_guard lock(mu_);
        jobs_[index].now = failure.empty() ? s3_mirror_status::state::done : s3_mirror_status::state::failed;
        jobs_[index].error = failure;
      }
      idle_.notify_all();
    }
  }

  void upload_tag(std::size_t index) {
    std::string tag;
    {
      std::lock_guard lock(mu_);
      tag = jobs_[index].tag;
    }
    const auto dir = root_ / tag;
    // Everything but metadata.json first (the marker too: a tag the bucket's retention finds
    // half-uploaded is recognisably ckpt's and is cleaned up), then metadata.json.
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
      if (e.is_regular_file()) files.push_back(std::filesystem::relative(e.path(), dir).generic_string());
    std::sort(files.begin(), files.end());
    std::erase(files, std::string("metadata.json"));
    files.push_back("metadata.json");
    std::uint64_t total = 0;
    for (const auto& f : files) total += std::filesystem::file_size(dir / f);
    {
      std::lock_guard lock(mu_);
      jobs_[index].bytes_total = total;
    }
    started_ = std::chrono::steady_clock::now();
    sent_ = 0;
    for (const auto& f : files) upload_file(dir / f, detail::join_key(tag, f), index);
    // `latest` last, and only if it still names this tag locally: an older tag's upload that
    // finishes after a newer one must not move the bucket's `latest` backwards.
    std::ifstream latest(root_ / "latest", std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(latest)), std::istreambuf_iterator<char>());
    if (text.substr(0, text.find('\n')) == tag) {
      auto w = store_.create("latest");
      w.write(std::as_bytes(std::span(text.data(), text.size())));
      w.sync();
      w.publish();
    }
    if (options_.keep_last_n) apply_retention();
  }

  void upload_file(const std::filesystem::path& path, const std::string& key, std::size_t index) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw error(error_kind::io, "s3_mirror: cannot open " + path.string());
    const auto size = std::filesystem::file_size(path);
    auto w = store_.create(key);
    std::vector<std::byte> block(std::min<std::uint64_t>(options_.block_bytes, std::max<std::uint64_t>(size, 1)));
    for (std::uint64_t done = 0; done < size;) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(block.size(), size - done));
      in.read(reinterpret_cast<char*>(block.data()), static_cast<std::streamsize>(n));
      if (static_cast<std::size_t>(in.gcount()) != n)
        throw error(error_kind::io, "s3_mirror: " + path.string() + " ended after " + std::to_string(done + static_cast<std::uint64_t>(in.gcount())) +
                                        " bytes, not the " + std::to_string(size) + " it had");
      w.write(std::span(block.data(), n));
      done += n;
      throttle(n);
      std::lock_guard lock(mu_);
      jobs_[index].bytes_done += n;
    }
    w.sync();
    w.publish();
  }

  /// Sleeps until the average rate since the tag's upload began is within bytes_per_second.
  void throttle(std::uint64_t n) {
    sent_ += n;
    if (options_.bytes_per_second == 0) return;
    const auto due = started_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(static_cast<double>(sent_) / static_cast<double>(options_.bytes_per_second)));
    std::this_thread::sleep_until(due);
  }

  /// The bucket's retention is the checkpointer's own rule (checkpointer::prune): committed
  /// tags beyond keep_last_n by iteration, never the one `latest` names, and leftovers of
  /// uploads that never committed.
  void apply_retention() {
    checkpointer<single_process, s3> bucket{{}, store_};
    bucket.prune(options_.keep_last_n);
  }

  std::filesystem::path root_;
  s3 store_;
  s3_mirror_options options_;
  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::deque<s3_mirror_status> jobs_;
  std::set<std::string> reported_;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point started_{};
  std::uint64_t sent_ = 0;
  std::thread worker_;  // last: starts once everything above is ready
};

}  // namespace ckpt
