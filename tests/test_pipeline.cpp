// The save and load pipeline: ordering, bounded buffers and failures of run_pipeline; files
// identical whatever the thread count; and save_async (snapshot, handle, errors, one in flight).

#include "failing_storage.hpp"
#include "helpers.hpp"

#include <ckpt/detail/copy_crew.hpp>

#include <algorithm>
#include <atomic>
#include <memory>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

using test::catch_error;
using test::every_dtype_state;

TEST_CASE("run_pipeline stages and finishes in order, works in parallel, and bounds the items in flight") {
  for (std::size_t slots : {1u, 3u, 8u})
    for (unsigned workers : {1u, 2u, 4u}) {
      CAPTURE(slots);
      CAPTURE(workers);
      const std::size_t n = 500;
      std::vector<std::size_t> staged, finished, value(slots);
      std::vector<std::size_t> results(n, 0);
      std::atomic<long> in_flight{0}, most{0};
      ckpt::detail::run_pipeline(
          n, slots, workers,
          [&](std::size_t i, std::size_t s) {
            staged.push_back(i);
            value[s] = i;
            const auto now = ++in_flight;
            for (long m = most; now > m && !most.compare_exchange_weak(m, now);) {
            }
          },
          [&](std::size_t i, std::size_t s) {
            if (i % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));  // out of order
            results[i] = value[s] * 3;
          },
          [&](std::size_t i, std::size_t) {
            finished.push_back(i);
            --in_flight;
          });
      REQUIRE(staged.size() == n);
      REQUIRE(finished.size() == n);
      for (std::size_t i = 0; i < n; ++i) {
        CHECK(staged[i] == i);
        CHECK(finished[i] == i);
        CHECK(results[i] == 3 * i);  // each item saw its own slot's contents
      }
      CHECK(most.load() <= static_cast<long>(slots));
    }
}

TEST_CASE("parallel_for runs every item once on the given threads and rethrows the lowest failure") {
  for (unsigned workers : {1u, 2u, 5u}) {
    CAPTURE(workers);
    const std::size_t n = 1000;
    std::vector<std::atomic<int>> runs(n);
    std::mutex mu;
    std::set<unsigned> numbers;
    std::set<std::thread::id> threads;
    // The threads parallel_for starts wait (up to a deadline) for the caller to take an item:
    // on a loaded machine they could otherwise take all 1000 before the caller starts, and the
    // check that the caller works too would fail by chance. If it never works, the wait ends at
    // the deadline and that check fails.
    const auto caller = std::this_thread::get_id();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    std::atomic<bool> caller_started{false};
    ckpt::detail::parallel_for(n, workers, [&](std::size_t i, unsigned w) {
      if (std::this_thread::get_id() == caller)
        caller_started = true;
      else
        while (!caller_started && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
      ++runs[i];
      if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));  // let others run
      std::lock_guard lock(mu);
      numbers.insert(w);
      threads.insert(std::this_thread::get_id());
    });
    for (std::size_t i = 0; i < n; ++i) CHECK(runs[i] == 1);
    CHECK(*numbers.rbegin() < workers);
    CHECK(threads.size() <= workers);
    CHECK(threads.count(std::this_thread::get_id()) == 1);  // the caller works too
  }
  // Failures: the lowest failing item's error, and no item starts long after a failure.
  std::atomic<std::size_t> started{0};
  try {
    ckpt::detail::parallel_for(100000, 3, [&](std::size_t i, unsigned) {
      ++started;
      if (i == 10 || i == 11 || i == 500) throw std::runtime_error("item " + std::to_string(i) + " failed");
    });
    FAIL("no exception");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "item 10 failed");
  }
  CHECK(started < 100000);
  bool called = false;
  ckpt::detail::parallel_for(0, 4, [&](std::size_t, unsigned) { called = true; });
  CHECK(!called);
}

TEST_CASE("run_pipeline rethrows the first failure after every thread stopped") {
  for (int where = 0; where < 3; ++where) {
    CAPTURE(where);
    std::mutex mu;
    std::vector<std::size_t> finished;
    auto fail_at = [&](int stage, std::size_t i) {
      if (stage == where && i == 37) throw std::runtime_error("item 37 failed");
    };
    try {
      ckpt::detail::run_pipeline(
          200, 4, 3, [&](std::size_t i, std::size_t) { fail_at(0, i); }, [&](std::size_t i, std::size_t) { fail_at(1, i); },
          [&](std::size_t i, std::size_t) {
            fail_at(2, i);
            std::lock_guard lock(mu);
            finished.push_back(i);
          });
      FAIL("no exception");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "item 37 failed");
    }
    // Nothing at or after the failing item was appended.
    for (auto i : finished) CHECK(i < 37);
  }
}

namespace {
struct big_state {
  std::vector<float> a = std::vector<float>(10000);
  std::vector<ckpt::bfloat16> b = std::vector<ckpt::bfloat16>(7777);
  std::vector<std::int32_t> c = std::vector<std::int32_t>(3000);
  std::uint64_t step = 0;
  template <class V>
  void checkpoint(V& v) {
    v.tensor("a", ckpt::view(a.data(), {100, 100}));
    v.tensor("b", b);
    v.tensor("c", c);
    v.value("step", step);
  }
  void randomise(std::uint64_t seed) {
    test::fill_random(a, seed);
    test::fill_random(b, seed + 1);
    test::fill_random(c, seed + 2);
    step = seed;
  }
  bool operator==(const big_state&) const = default;
};

template <class C>
std::vector<std::byte> saved_file(unsigned threads, std::uint64_t buffer_bytes, const big_state& s) {
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage, C> cp{
      {}, mem, {.chunk_bytes = 1000, .threads = threads, .buffer_bytes = buffer_bytes}};
  cp.save(1, s);
  big_state back;
  cp.load(back);
  CHECK(back == s);
  return mem.bytes("global_step1/mp_rank_00/model_optim_rng.ckpt");
}

/// A DevicePolicy that needs staging (like a GPU's) and counts the chunks staged.
struct counting_device {
  std::atomic<long>* staged;
  bool accepts(ckpt::device d) const noexcept { return d.type == ckpt::device::kind::host; }
  void to_host(const ckpt::tensor_ref& t, std::uint64_t off, std::span<std::byte> dst) {
    ++*staged;
    ckpt::host_copy{}.to_host(t, off, dst);
  }
  void from_host(std::span<const std::byte> src, const ckpt::tensor_ref& t, std::uint64_t off) {
    ckpt::host_copy{}.from_host(src, t, off);
  }
};

/// Storage whose writer counts chunk-sized writes, to see how many staged chunks are unwritten.
struct watching_storage : ckpt::memory_storage {
  std::atomic<long>* staged;
  std::atomic<long>* most_unwritten;
  std::shared_ptr<std::atomic<long>> written = std::make_shared<std::atomic<long>>(0);
  struct writer {
    ckpt::memory_storage::writer inner;
    watching_storage* s;
    void write(std::span<const std::byte> b) {
      const long unwritten = *s->staged - *s->written;
      for (long m = *s->most_unwritten; unwritten > m && !s->most_unwritten->compare_exchange_weak(m, unwritten);) {
      }
      if (b.size() == 4000) ++*s->written;  // a chunk (the header block is 4096, padding 96)
      inner.write(b);
    }
    void sync() { inner.sync(); }
    void publish() { inner.publish(); }
  };
  writer create(std::string_view key) { return {ckpt::memory_storage::create(key), this}; }
};
}  // namespace

TEST_CASE_TEMPLATE("shard files are identical whatever the threads and buffer memory", C, ckpt::raw, ckpt::zstd,
                   ckpt::zstd_bytegroup) {
  big_state s;
  s.randomise(5);
  const auto reference = saved_file<C>(1, std::uint64_t{256} << 20, s);
  for (unsigned threads : {2u, 3u, 8u})
    for (std::uint64_t buffer : {std::uint64_t{1}, std::uint64_t{10000}, std::uint64_t{256} << 20}) {
      CAPTURE(threads);
      CAPTURE(buffer);
      CHECK(saved_file<C>(threads, buffer, s) == reference);
    }
}

TEST_CASE("a save holds no more staged chunks than buffer_bytes allows") {
  std::atomic<long> staged{0}, most{0};
  watching_storage store;
  store.staged = &staged;
  store.most_unwritten = &most;
  std::vector<float> w(1000 * 200);  // 200 chunks of 4000 bytes
  test::fill_random(w, 1);
  struct one {
    std::vector<float>* w;
    void checkpoint(ckpt::visitor& v) { v.tensor("w", *w); }
  } st{&w};
  ckpt::checkpointer<ckpt::single_process, watching_storage, ckpt::raw, counting_device> cp{
      {}, store, {.chunk_bytes = 4000, .threads = 4, .buffer_bytes = 3 * 4000}, {}, counting_device{&staged}};
  cp.save(1, st);
  CHECK(staged == 200);
  CHECK(*store.written == 200);
  CHECK(most <= 3);  // three slots of one chunk each
  CHECK(most >= 1);
  std::vector<float> back(w.size());
  one lt{&back};
  cp.load(lt);
  CHECK(back == w);
}

TEST_CASE_TEMPLATE("loads read in parallel and verify every chunk", B, test::posix_backend, test::memory_backend) {
  B backend;
  for (unsigned threads : {1u, 4u}) {
    CAPTURE(threads);
    ckpt::checkpointer<ckpt::single_process, typename B::storage> cp{{}, backend.make(), {.chunk_bytes = 64, .threads = threads}};
    every_dtype_state saved, loaded;
    saved.randomise(threads);
    cp.save(threads, saved);
    const auto r = cp.load(loaded);
    CHECK(loaded == saved);
    CHECK(r.bytes_read > 0);
  }
}

TEST_CASE("a load keeps each worker's file open from one chunk to the next") {
  // posix storage that counts the files it opens for reading.
  struct counting_posix : ckpt::posix {
    using ckpt::posix::posix;
    std::shared_ptr<std::atomic<int>> opens = std::make_shared<std::atomic<int>>(0);
    reader open_reader(std::string_view key) const {
      ++*opens;
      return ckpt::posix::open_reader(key);
    }
  };
  struct many_tensors {
    std::vector<std::vector<float>> small = std::vector<std::vector<float>>(300, std::vector<float>(64));
    std::vector<float> big = std::vector<float>(std::size_t{1} << 18);  // 1 MiB: 256 chunks of 4 KiB
    void checkpoint(ckpt::visitor& v) {
      for (std::size_t i = 0; i < small.size(); ++i) v.tensor("bias." + std::to_string(i), small[i]);
      v.tensor("big", big);
    }
  } saved, loaded;
  for (std::size_t i = 0; i < saved.small.size(); ++i) std::fill(saved.small[i].begin(), saved.small[i].end(), static_cast<float>(i));
  for (std::size_t i = 0; i < saved.big.size(); ++i) saved.big[i] = static_cast<float>(i) * 0.5f;
  // 556 chunks, all in one shard file. Raw chunks are read in place, on parallel_for: at most
  // one open per worker, of which there are posix_options::reads_in_flight. zstd chunks go through the pipeline: at most one per slot (2 per
  // worker). (Metadata, chunk map and index are read through posix::read, not counted here.)
  auto load_counting = [&](auto codec, int most) {
    test::temp_dir dir;
    counting_posix store(dir.path());
    ckpt::checkpointer<ckpt::single_process, counting_posix, decltype(codec)> cp{{}, store, {.chunk_bytes = 4096, .threads = 2}};
    cp.save(1, saved);
    loaded = {};
    store.opens->store(0);
    cp.load(loaded);
    CHECK(loaded.small == saved.small);
    CHECK(loaded.big == saved.big);
    CHECK(*store.opens > 0);
    CHECK(*store.opens <= most);
  };
  load_counting(ckpt::raw{}, static_cast<int>(ckpt::posix_options{}.reads_in_flight));
  load_counting(ckpt::zstd{}, 4);
}

TEST_CASE("posix's O_DIRECT writes in flight: a file of many buffers, and a checkpoint of 40 MiB, come out exactly") {
  // The write queue's threads (detail/write_queue.hpp) under the thread sanitizer: many writes
  // of 1 MiB in flight while the caller fills the next buffer, and a save and load through them.
  test::temp_dir dir;
  for (unsigned depth : {2u, 32u}) {
    CAPTURE(depth);
    ckpt::posix disk(dir.path(), {.writes_in_flight = depth});
    std::vector<std::byte> bytes((std::size_t{40} << 20) + 4097);
    std::mt19937 rng(depth);
    test::fill_bytes(bytes, rng);
    {
      auto w = disk.create("blob");
      for (std::size_t at = 0; at < bytes.size();) {  // uneven pieces: some fill a buffer, some span two
        const auto n = std::min<std::size_t>(bytes.size() - at, 1 + rng() % (3 << 20));
        w.write(std::span<const std::byte>(bytes).subspan(at, n));
        at += n;
      }
      w.sync();
      w.publish();
    }
    REQUIRE(disk.size("blob") == bytes.size());
    std::vector<std::byte> back(bytes.size());
    disk.read("blob", 0, back);
    CHECK(back == bytes);
    {
      auto dropped = disk.create("dropped");  // destroyed with writes in flight: waits, then discards
      dropped.write(std::span<const std::byte>(bytes).first(std::size_t{8} << 20));
    }
    CHECK_FALSE(disk.size("dropped"));

    std::vector<float> w(std::size_t{10} << 20);  // 40 MiB
    test::fill_random(w, depth);
    struct one {
      std::vector<float>* w;
      void checkpoint(ckpt::visitor& v) { v.tensor("w", *w); }
    } st{&w};
    ckpt::checkpointer<ckpt::single_process, ckpt::posix> cp{{}, ckpt::posix(dir.path() / ("cp" + std::to_string(depth)),
                                                                               {.writes_in_flight = depth})};
    cp.save(1, st);
    std::vector<float> loaded(w.size());
    one lt{&loaded};
    cp.load(lt);
    CHECK(loaded == w);
  }
}

TEST_CASE("save_async returns after the snapshot: later changes to the tensors are not saved") {
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, mem, {.chunk_bytes = 1000}};
  big_state s;
  s.randomise(1);
  const big_state at_save = s;
  auto pending = cp.save_async(10, s);
  CHECK(pending.valid());
  s.randomise(2);  // the caller goes on training at once
  pending.wait();
  CHECK(pending.done());
  CHECK(cp.latest() == "global_step10");
  big_state back;
  cp.load(back);
  CHECK(back == at_save);
  CHECK_FALSE(back == s);
}

TEST_CASE("save_async: at most one in flight, the next save waits, buffers are reused") {
  test::temp_dir dir;
  ckpt::checkpointer<> cp{{}, dir.path(), {.chunk_bytes = 4096}};
  big_state s;
  std::vector<big_state> saved;
  for (std::uint64_t step = 1; step <= 4; ++step) {
    s.randomise(step);
    saved.push_back(s);
    auto h = cp.save_async(step, s);  // each waits for the one before
    (void)h;
  }
  cp.save(5, s);  // a synchronous save waits too
  CHECK(cp.tags().size() == 5);
  for (std::uint64_t step = 1; step <= 4; ++step) {
    big_state back;
    cp.load(back, {.iteration = step});
    CHECK(back == saved[step - 1]);
  }
}

TEST_CASE("save_async: a failure surfaces in wait(), or else in the next call, and the last good checkpoint stays") {
  ckpt::memory_storage mem;
  test::failing_storage<ckpt::memory_storage> store(mem);
  ckpt::checkpointer<ckpt::single_process, test::failing_storage<ckpt::memory_storage>> cp{{}, store, {.chunk_bytes = 4096}};
  big_state good, s;
  good.randomise(1);
  cp.save(1, good);

  // Reported by wait(); the next call goes ahead.
  s.randomise(2);
  store.fail_at(3, ENOSPC);
  auto h = cp.save_async(2, s);
  auto e = catch_error([&] { h.wait(); });
  CHECK(e.kind() == ckpt::error_kind::io);
  CHECK(std::string(e.what()).find("injected fault") != std::string::npos);
  CHECK(std::string(e.what()).find("No space left") != std::string::npos);
  CHECK(h.done());
  store.fail_at(-1);
  big_state back;
  cp.load(back);
  CHECK(back == good);

  // Never waited for: the next save throws it instead of saving, and the one after works.
  store.fail_at(3, EIO);
  (void)cp.save_async(3, s);
  e = catch_error([&] { cp.save(4, s); });
  CHECK(std::string(e.what()).find("Input/output error") != std::string::npos);
  store.fail_at(-1);
  CHECK(cp.latest() == "global_step1");
  cp.save(4, s);
  cp.load(back);
  CHECK(back == s);
}

TEST_CASE("a save_async's thread is joined by the next one's thread, not by the caller") {
  // The caller's save_async returns while the thread before still runs: joining it there cost
  // the time glibc takes to unmap the stacks its cache frees (docs/performance.md, "Async save").
  std::atomic<bool> release{false}, first_ended{false}, second_saw_it{false};
  ckpt::detail::background_save thread;
  thread.start({}, [&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!release && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    first_ended = true;
  });
  thread.start({}, [&] { second_saw_it = first_ended.load(); });
  CHECK_FALSE(first_ended);  // start did not wait for the first thread
  release = true;
  thread.finish(true);
  CHECK(first_ended);
  CHECK(second_saw_it);  // the second ran only once the first had ended

  // Through the checkpointer: a failed save_async never waited for is thrown by the next
  // save_async, which starts nothing; the one after saves, and the destructor joins them all.
  ckpt::memory_storage mem;
  test::failing_storage<ckpt::memory_storage> store(mem);
  big_state s;
  s.randomise(5);
  {
    ckpt::checkpointer<ckpt::single_process, test::failing_storage<ckpt::memory_storage>> cp{{}, store, {.chunk_bytes = 4096}};
    store.fail_at(3, EIO);
    (void)cp.save_async(1, s);
    const auto e = catch_error([&] { (void)cp.save_async(2, s); });
    CHECK(std::string(e.what()).find("Input/output error") != std::string::npos);
    store.fail_at(-1);
    (void)cp.save_async(3, s);
    (void)cp.save_async(4, s);
  }
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, mem};
  const auto tags = cp.tags();
  REQUIRE(tags.size() == 2);
  CHECK(tags[0].iteration == 3);
  CHECK(tags[1].iteration == 4);
  big_state back;
  CHECK(cp.load(back).iteration == 4);
  CHECK(back == s);
}

TEST_CASE("copy_crew copies every byte once, across copies and shares, with helpers kept between rounds") {
  // Odd sizes, an empty copy, and shares (of at least 5000 bytes) that split copies mid-way.
  const std::vector<std::size_t> sizes{1, 0, 12345, 4096, 70001, 3, 8191, 40000};
  std::vector<std::vector<std::byte>> from, to;
  std::mt19937 gen(7);
  for (const auto n : sizes) {
    auto& f = from.emplace_back(n);
    for (auto& b : f) b = static_cast<std::byte>(gen());
    to.emplace_back(n + 2, std::byte{0xEE});  // a guard byte on each side
  }
  std::vector<ckpt::detail::copy_job> jobs;
  for (std::size_t i = 0; i < sizes.size(); ++i) jobs.push_back({to[i].data() + 1, from[i].data(), sizes[i]});
  const auto check = [&] {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      CHECK(to[i].front() == std::byte{0xEE});
      CHECK(to[i].back() == std::byte{0xEE});
      CHECK(std::equal(from[i].begin(), from[i].end(), to[i].begin() + 1));
    }
  };
  ckpt::detail::copy_crew crew(4, 5000);
  crew.copy(jobs);  // 134,637 bytes: four shares, three of them the helpers'
  check();
  CHECK(crew.helpers() == 3);
  CHECK(crew.helper_shares() == 3);
  for (auto& t : to) std::fill(t.begin() + 1, t.end() - 1, std::byte{0});
  crew.copy(std::span(jobs).subspan(0, 3));  // 12,346 bytes: two shares, two helpers idle
  for (std::size_t i = 0; i < 3; ++i) CHECK(std::equal(from[i].begin(), from[i].end(), to[i].begin() + 1));
  CHECK(to[4][1] == std::byte{0});  // not in this round
  CHECK(crew.helper_shares() == 4);
  crew.copy(jobs);
  check();
  CHECK(crew.helpers() == 3);  // the same helpers, not new ones
  CHECK(crew.helper_shares() == 7);

  // The shares cut the bytes into consecutive pieces, each byte in exactly one, of equal sizes
  // but for the last (which takes the remainder).
  for (const std::size_t total : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{134637}, std::size_t{1} << 40})
    for (unsigned n = 1; n <= 9; ++n) {
      CHECK(ckpt::detail::copy_crew::share_begin(total, 0, n) == 0);
      CHECK(ckpt::detail::copy_crew::share_begin(total, n, n) == total);
      for (unsigned k = 0; k < n; ++k) {
        const auto lo = ckpt::detail::copy_crew::share_begin(total, k, n), hi = ckpt::detail::copy_crew::share_begin(total, k + 1, n);
        CHECK(lo <= hi);
        CHECK(hi - lo == (k + 1 < n ? total / n : total - total / n * (n - 1)));
      }
    }

  ckpt::detail::copy_crew alone(1, 1);
  for (auto& t : to) std::fill(t.begin() + 1, t.end() - 1, std::byte{0});
  alone.copy(jobs);
  check();
  CHECK(alone.helpers() == 0);
}

/// 100 MiB in three tensors: a snapshot splits it over three threads (shares of 32 MiB and
/// more), cutting the first tensor in the middle.
struct large_state {
  std::vector<float> a = std::vector<float>((std::size_t{64} << 20) / 4 + 3);
  std::vector<std::int32_t> b = std::vector<std::int32_t>((std::size_t{24} << 20) / 4 - 5);
  std::vector<std::uint8_t> c = std::vector<std::uint8_t>((std::size_t{12} << 20) + 1);
  template <class V>
  void checkpoint(V& v) {
    v.tensor("a", a);
    v.tensor("b", b);
    v.tensor("c", c);
  }
  bool operator==(const large_state&) const = default;
  /// Every element from `seed` (a cheap pattern: 26 million elements under the sanitizers).
  void fill(std::uint32_t seed) {
    std::uint32_t x = seed * 2654435761u + 1;
    const auto next = [&] { return x = x * 1664525u + 1013904223u; };
    for (auto& v : a) v = static_cast<float>(next() >> 8) / 65536.0f;
    for (auto& v : b) v = static_cast<std::int32_t>(next());
    for (auto& v : c) v = static_cast<std::uint8_t>(next() >> 24);
  }
};

TEST_CASE("save_async copies a large host state with several threads, and saves it as it was") {
  using large = large_state;
  auto s = std::make_unique<large>();
  s->fill(1);
  const auto at_save = std::make_unique<large>(*s);
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, mem, {.threads = 3}};
  auto pending = cp.save_async(1, *s);
  s->fill(2);  // training goes on
  pending.wait();
  auto back = std::make_unique<large>();
  cp.load(*back);
  CHECK(*back == *at_save);
}

TEST_CASE("destroying a checkpointer finishes its save_async") {
  test::temp_dir dir;
  big_state s;
  s.randomise(3);
  {
    ckpt::checkpointer<> cp{{}, dir.path()};
    (void)cp.save_async(7, s);
  }
  ckpt::checkpointer<> cp{{}, dir.path()};
  big_state back;
  CHECK(cp.load(back).iteration == 7);
  CHECK(back == s);
}

namespace {
/// memory_storage that notes each read of a shard file's trailer (which every check of its
/// footer reads once) with the thread that made it, and can refuse such a read made off the
/// thread that loads.
struct trailer_watching_storage : test::wrapped_memory_storage {
  static constexpr bool concurrent_reads = true;
  struct log {
    std::mutex mu;
    std::condition_variable read;
    std::vector<std::thread::id> by;  // the threads that read a trailer, in order
    std::thread::id loading;
    bool refuse_off_thread = false;
  };
  std::shared_ptr<log> seen = std::make_shared<log>();
  void read(std::string_view key, std::uint64_t offset, std::span<std::byte> out) const {
    if (key.ends_with(".ckpt") && out.size() == ckpt::detail::trailer_bytes && inner.size(key) == offset + out.size()) {
      std::lock_guard lock(seen->mu);
      seen->by.push_back(std::this_thread::get_id());
      seen->read.notify_all();
      if (seen->refuse_off_thread && std::this_thread::get_id() != seen->loading)
        throw ckpt::error(ckpt::error_kind::io, describe(key) + ": refused (test)");
    }
    inner.read(key, offset, out);
  }
};
static_assert(ckpt::Storage<trailer_watching_storage>);

/// Tensors in two groups; on load, its visit waits until a trailer was read (at most 10 s), and
/// notes whether one was: the footer is then read while the state is visited.
struct waits_for_trailer {
  std::vector<std::vector<float>> model = std::vector<std::vector<float>>(50, std::vector<float>(16)), optimizer = model;
  std::shared_ptr<trailer_watching_storage::log> seen;
  bool read_during_visit = false;
  void checkpoint(ckpt::visitor& v) {
    v.group("model", [&](ckpt::visitor& g) {
      for (std::size_t i = 0; i < model.size(); ++i) g.tensor("w" + std::to_string(i), model[i]);
    });
    v.group("optimizer", [&](ckpt::visitor& g) {
      for (std::size_t i = 0; i < optimizer.size(); ++i) g.tensor("m" + std::to_string(i), optimizer[i]);
    });
    if (v.loading()) {
      std::unique_lock lock(seen->mu);
      read_during_visit = seen->read.wait_for(lock, std::chrono::seconds(10), [&] { return !seen->by.empty(); });
    }
  }
};
}  // namespace

TEST_CASE("a load reads its own shard file's footer on a thread of its own while it visits the state, and once") {
  trailer_watching_storage st;
  waits_for_trailer saved, loaded;
  saved.seen = loaded.seen = st.seen;
  for (std::size_t i = 0; i < saved.model.size(); ++i) {
    std::fill(saved.model[i].begin(), saved.model[i].end(), static_cast<float>(i));
    std::fill(saved.optimizer[i].begin(), saved.optimizer[i].end(), -static_cast<float>(i));
  }
  ckpt::checkpointer<ckpt::single_process, trailer_watching_storage> cp{{}, st};
  cp.save(1, saved);
  const auto reset = [&](bool refuse) {
    std::lock_guard lock(st.seen->mu);
    st.seen->by.clear();
    st.seen->loading = std::this_thread::get_id();
    st.seen->refuse_off_thread = refuse;
    loaded.model.assign(50, std::vector<float>(16, 0.f));
    loaded.optimizer = loaded.model;
  };
  SUBCASE("the whole state") {
    reset(false);
    const auto r = cp.load(loaded);
    CHECK(loaded.read_during_visit);
    REQUIRE(st.seen->by.size() == 1);  // not read again after the visit
    CHECK(st.seen->by[0] != std::this_thread::get_id());
    CHECK(loaded.model == saved.model);
    CHECK(loaded.optimizer == saved.optimizer);
    CHECK(r.bytes_read > 0);
  }
  SUBCASE("without the optimizer: the details read for every tensor, taken for the ones loaded") {
    reset(false);
    cp.load(loaded, {.load_optimizer = false});
    CHECK(loaded.read_during_visit);
    CHECK(st.seen->by.size() == 1);
    CHECK(loaded.model == saved.model);
    CHECK(loaded.optimizer == std::vector<std::vector<float>>(50, std::vector<float>(16, 0.f)));
  }
  SUBCASE("a read that fails on that thread is made again by the load, which succeeds") {
    reset(true);
    cp.load(loaded);
    CHECK(loaded.read_during_visit);
    REQUIRE(st.seen->by.size() == 2);
    CHECK(st.seen->by[0] != std::this_thread::get_id());
    CHECK(st.seen->by[1] == std::this_thread::get_id());
    CHECK(loaded.model == saved.model);
    CHECK(loaded.optimizer == saved.optimizer);
  }
}
