#pragma once
// The load stage that opens a tag on a thread of its own while the caller's thread visits the
// state. Opening (reading metadata.json and chunk_map.bin, parsing and checking them, indexing
// the tensors by name) and visiting (the state's `checkpoint` recording each tensor) need
// nothing of each other unless the state asks `visitor::saved`; for a model of 100,000 tensors
// each takes tens of milliseconds, one after the other, before the first byte of a tensor is
// read (docs/performance.md, "Many tensors on the disk").
//
// The state's own code stays on the caller's thread (an engine may keep per-thread state, such
// as a CUDA device, that its `checkpoint` relies on); only ckpt's opening moves. A question to
// `visitor::saved` waits for the opening and, where it failed, throws its error, so the state
// never acts on an answer the checkpoint could not give.

#include <cstddef>
#include <exception>
#include <functional>
#include <optional>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "../visitor.hpp"
#include "metadata.hpp"
#include "restore_plan.hpp"

namespace ckpt::detail {

/// A tag's metadata being opened in the background, and the answers `visitor::saved` gets from
/// it meanwhile. Not movable: the index and the thread refer to the metadata it holds.
class background_open final : public saved_contents {
 public:
  /// `expected_tensors`: how many tensors the visitor makes room for before the count is known
  /// (the last save's or load's, 0 for none).
  explicit background_open(std::size_t expected_tensors = 0) : expected_(expected_tensors) {}
  background_open(const background_open&) = delete;
  background_open& operator=(const background_open&) = delete;
  ~background_open() { join(); }

  /// Runs `open()`, which returns the metadata, then indexes it and calls `then(md, index)`, on a
  /// thread of its own (on this one if no thread can start). An error of either is kept for
  /// `wait` and for every question asked meanwhile. `open` and `then` must not use the
  /// Communicator: the caller's thread may be in it.
  void start(std::function<metadata()> open, std::function<void(const metadata&, const stored_index&)> then) {
    open_ = std::move(open);
    then_ = std::move(then);
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::system_error&) {
      run();
    }
  }

  /// Waits for the opening to finish; throws its error, if it failed.
  void wait() const {
    join();
    if (failed_) std::rethrow_exception(failed_);
  }

  /// The metadata and its index, once `wait` returned.
  metadata& md() noexcept { return md_; }
  const stored_index& index() const noexcept { return *index_; }

  std::optional<saved_tensor> tensor(std::string_view name) const override {
    wait();
    return index_->tensor(name);
  }
  bool value(std::string_view name) const override {
    wait();
    return index_->value(name);
  }
  std::size_t tensor_count() const override { return expected_; }

 private:
  void run() noexcept {
    try {
      md_ = open_();
      index_.emplace(md_);
      then_(md_, *index_);
    } catch (...) {
      failed_ = std::current_exception();
    }
  }
  void join() const {
    if (thread_.joinable()) thread_.join();
  }

  std::size_t expected_;
  std::function<metadata()> open_;
  std::function<void(const metadata&, const stored_index&)> then_;
  metadata md_;
  std::optional<stored_index> index_;
  std::exception_ptr failed_;
  mutable std::thread thread_;  // joined (by the caller's thread) before any of the above is read
};

}  // namespace ckpt::detail
