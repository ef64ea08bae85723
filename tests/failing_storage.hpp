#pragma once
// A Storage decorator that fails the k-th storage operation (counting every operation of every
// kind: create, write, sync, publish, read, size, list, remove, remove_all), the way a full
// disk, a dying device or a permission change would. A failing write writes half its bytes
// first (a short write).

#include <ckpt/ckpt.hpp>

#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

namespace test {

template <class Inner>
class failing_storage {
  struct shared {
    long ops = 0;
    long fail_at = -1;  // -1: never
    int err = ENOSPC;
    std::string last_failure;
  };

 public:
  explicit failing_storage(Inner inner) : inner_(std::move(inner)), s_(std::make_shared<shared>()) {}

  /// Fail the k-th operation from now on (0-based) with `err`; k < 0 disables faults.
  void fail_at(long k, int err = ENOSPC) {
    s_->ops = 0;
    s_->fail_at = k;
    s_->err = err;
    s_->last_failure.clear();
  }
  long operations() const { return s_->ops; }
  const std::string& last_failure() const { return s_->last_failure; }

  class writer {
   public:
    void write(std::span<const std::byte> b) {
      // A failing write is a short one: half the bytes reach the file before the error, as
      // when a disk fills in the middle of a write.
      failing_storage::step(*s_, "write", key_, [&] { w_.write(b.first(b.size() / 2)); });
      w_.write(b);
    }
    void sync() {
      step("fsync", key_);
      w_.sync();
    }
    void publish() {
      step("rename", key_);
      w_.publish();
    }

   private:
    friend class failing_storage;
    writer(typename std::remove_cvref_t<decltype(std::declval<Inner&>().create(""))> w, std::shared_ptr<shared> s,
           std::string key)
        : w_(std::move(w)), s_(std::move(s)), key_(std::move(key)) {}
    void step(const char* op, const std::string& key) { failing_storage::step(*s_, op, key); }
    std::remove_cvref_t<decltype(std::declval<Inner&>().create(""))> w_;
    std::shared_ptr<shared> s_;
    std::string key_;
  };

  writer create(std::string_view key) {
    step(*s_, "open", key);
    return writer(inner_.create(key), s_, std::string(key));
  }
  void read(std::string_view key, std::uint64_t offset, std::span<std::byte> out) const {
    step(*s_, "read", key);
    inner_.read(key, offset, out);
  }
  std::optional<std::uint64_t> size(std::string_view key) const {
    step(*s_, "stat", key);
    return inner_.size(key);
  }
  std::vector<std::string> list(std::string_view prefix) const {
    step(*s_, "list", prefix);
    return inner_.list(prefix);
  }
  void remove(std::string_view key) {
    step(*s_, "remove", key);
    inner_.remove(key);
  }
  void remove_all(std::string_view prefix) {
    step(*s_, "remove", prefix);
    inner_.remove_all(prefix);
  }
  std::string describe(std::string_view key) const { return inner_.describe(key); }
  /// The inner storage's writer lock, when it has one (not counted as an operation).
  auto lock_writer(bool wait)
    requires ckpt::detail::lockable_root<Inner>
  {
    return inner_.lock_writer(wait);
  }

  Inner& inner() { return inner_; }

 private:
  static void step(shared& s, const char* op, std::string_view key, const std::function<void()>& before_failing = {}) {
    if (s.ops++ == s.fail_at) {
      if (before_failing) before_failing();
      s.last_failure = std::string(op) + " " + std::string(key);
      throw ckpt::error(ckpt::error_kind::io, "injected fault: " + std::string(op) + " " + std::string(key) + ": " +
                                                  std::strerror(s.err));
    }
  }
  Inner inner_;
  std::shared_ptr<shared> s_;
};

}  // namespace test
