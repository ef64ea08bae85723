// ckpt::cuda::basic_device_copy on the fake runtime (fake_runtime.hpp): round trips of
// "device" tensors of every dtype and many sizes, loads into host memory, ordering with the
// user's stream, save_async, bounded and reused pinned memory, pieces in flight, and errors
// from any runtime call. The same policy runs on the real runtime as ckpt::cuda::device_copy;
// bench/gpu/run.sh exercises that on a GPU.

#include "fake_runtime.hpp"

#include <doctest/doctest.h>

#include <ckpt/ckpt.hpp>
#include <ckpt/cuda/basic_device_copy.hpp>
#include <ckpt/reader.hpp>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

using policy = ckpt::cuda::basic_device_copy<fake::runtime>;
// The capabilities the pipelines look for: pinned buffers lent, and copies left in flight.
static_assert(ckpt::detail::lends_buffers<policy> && ckpt::detail::starts_copies<policy>);
static_assert(std::is_same_v<ckpt::detail::started_copy<policy>, policy::host_copy>);
using gpu_checkpointer = ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage, ckpt::raw, policy>;

// The ring alone (nothing lent to the pipelines), so every copy goes through it.
constexpr ckpt::cuda::device_copy_options small_ring{.slot_bytes = 4096, .slots = 3, .lend_bytes = 0};

/// "Device memory": bytes the fake treats as on cuda:N.
struct device_tensor {
  ckpt::dtype type;
  ckpt::shape_t shape;
  int gpu = 0;
  std::vector<std::byte> bytes;
  device_tensor(ckpt::dtype t, ckpt::shape_t s, int g, std::uint64_t seed) : type(t), shape(std::move(s)), gpu(g) {
    std::uint64_t n = ckpt::size_of(t);
    for (auto d : shape) n *= d;
    bytes.resize(n);
    std::mt19937_64 r(seed);
    for (auto& b : bytes) b = static_cast<std::byte>(r());
  }
  ckpt::tensor_ref ref() { return ckpt::tensor_ref(type, shape, bytes.data(), ckpt::device::cuda(gpu)); }
};

/// A state of device tensors (and one host tensor, which device_copy handles too).
struct gpu_state {
  std::vector<device_tensor> tensors;
  std::vector<float> host = std::vector<float>(100, 1.5f);
  template <class V>
  void checkpoint(V& v) {
    for (std::size_t i = 0; i < tensors.size(); ++i) v.tensor("t" + std::to_string(i), tensors[i].ref());
    v.tensor("host", host);
  }
};

gpu_state every_dtype_and_size(std::uint64_t seed, int gpus = 1) {
  gpu_state s;
  const ckpt::dtype types[] = {ckpt::dtype::f64, ckpt::dtype::f32, ckpt::dtype::f16, ckpt::dtype::bf16,
                               ckpt::dtype::i64,   ckpt::dtype::i32,   ckpt::dtype::i16,   ckpt::dtype::i8,
                               ckpt::dtype::u8,   ckpt::dtype::boolean};
  // 0 and 1 elements, under one slot, exactly one slot, one byte over, many slots.
  const std::uint64_t sizes[] = {0, 1, 1000, 4096, 4097, 100'000};
  int k = 0;
  for (auto t : types)
    for (auto n : sizes) {
      const auto elems = t == ckpt::dtype::boolean ? n : std::max<std::uint64_t>(n / ckpt::size_of(t), n ? 1 : 0);
      s.tensors.emplace_back(t, ckpt::shape_t{elems}, k % gpus, seed + static_cast<std::uint64_t>(k));
      ++k;
    }
  for (auto& t : s.tensors)
    if (t.type == ckpt::dtype::boolean)
      for (auto& b : t.bytes) b &= std::byte{1};
  return s;
}

void scramble(gpu_state& s) {
  for (auto& t : s.tensors) std::fill(t.bytes.begin(), t.bytes.end(), std::byte{0xAB});
  std::fill(s.host.begin(), s.host.end(), -1.f);
}

/// A host-only state, for a first checkpoint written without the GPU policy.
struct host_only {
  std::vector<float> w = std::vector<float>(10, 2.f);
  template <class V>
  void checkpoint(V& v) {
    v.tensor("t0", w);
  }
};

bool same(const gpu_state& a, const gpu_state& b) {
  if (a.host != b.host || a.tensors.size() != b.tensors.size()) return false;
  for (std::size_t i = 0; i < a.tensors.size(); ++i)
    if (a.tensors[i].bytes != b.tensors[i].bytes) return false;
  return true;
}

}  // namespace

TEST_CASE("device tensors of every dtype and size round-trip through the pinned ring, on one GPU and two") {
  for (int gpus : {1, 2}) {
    CAPTURE(gpus);
    fake::runtime rt;
    ckpt::memory_storage mem;
    gpu_checkpointer cp{{}, mem, {.chunk_bytes = 10'000}, {}, policy{rt, nullptr, small_ring}};
    auto saved = every_dtype_and_size(1, gpus);
    cp.save(1, saved);
    auto back = every_dtype_and_size(1, gpus);
    scramble(back);
    cp.load(back);
    CHECK(same(back, saved));
    // Pinned memory: one ring per GPU, allocated once.
    CHECK(rt.st->pinned_peak == static_cast<std::size_t>(gpus) * 3 * 4096);
    CHECK(rt.st->pinned_allocs == static_cast<std::size_t>(gpus) * 3);
  }
}

TEST_CASE("a checkpoint of device tensors loads into host memory, with no GPU policy at all") {
  fake::runtime rt;
  ckpt::memory_storage mem;
  auto saved = every_dtype_and_size(2);
  {
    gpu_checkpointer cp{{}, mem, {}, {}, policy{rt, nullptr, small_ring}};
    cp.save(1, saved);
  }
  for (std::size_t i : {std::size_t{4}, std::size_t{11}, std::size_t{59}}) {
    std::vector<std::byte> into(saved.tensors[i].bytes.size());
    ckpt::reader<ckpt::memory_storage> r{mem};
    r.read("t" + std::to_string(i), ckpt::tensor_ref(saved.tensors[i].type, saved.tensors[i].shape, into.data()));
    CHECK(into == saved.tensors[i].bytes);
  }
}

TEST_CASE("save waits for the kernels already on the user's stream; load's bytes are there for the next ones") {
  fake::runtime rt;
  ckpt::memory_storage mem;
  gpu_checkpointer cp{{}, mem, {}, {}, policy{rt, nullptr, small_ring}};
  gpu_state s;
  s.tensors.emplace_back(ckpt::dtype::f32, ckpt::shape_t{50'000}, 0, 3);
  auto& t = s.tensors[0];
  // A "kernel" that writes the tensor 50 ms from now, enqueued just before the save.
  rt.launch(nullptr, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::fill(t.bytes.begin(), t.bytes.end(), std::byte{7});
  });
  cp.save(1, s);
  scramble(s);
  cp.load(s);
  CHECK(std::all_of(t.bytes.begin(), t.bytes.end(), [](std::byte b) { return b == std::byte{7}; }));
  // ckpt's stream waited on the user's before copying; after the load the user's stream
  // waits on ckpt's.
  const auto& calls = rt.st->calls;
  const auto first_copy = std::find(calls.begin(), calls.end(), "copy_async");
  CHECK(std::find(calls.begin(), first_copy, "wait ckpt") != first_copy);
  CHECK(std::find(calls.begin(), first_copy, "record legacy") != first_copy);
  CHECK(calls.back() == "wait legacy");
}

TEST_CASE("save_async returns once the device snapshot is taken: the tensor may change at once") {
  fake::runtime rt;
  ckpt::memory_storage mem;
  gpu_checkpointer cp{{}, mem, {}, {}, policy{rt, nullptr, small_ring}};
  auto s = every_dtype_and_size(4);
  const auto before = s;
  auto h = cp.save_async(1, s);
  for (auto& t : s.tensors) rt.launch(nullptr, [&t] { std::fill(t.bytes.begin(), t.bytes.end(), std::byte{0x55}); });
  rt.finish(nullptr);
  h.wait();
  auto back = every_dtype_and_size(4);
  scramble(back);
  cp.load(back);
  CHECK(same(back, before));
}

TEST_CASE("pinned memory stays bounded and is reused; copies overlap with draining") {
  fake::runtime rt;
  ckpt::memory_storage mem;
  gpu_checkpointer cp{{}, mem, {.keep_last_n = 1, .chunk_bytes = 1 << 20}, {}, policy{rt, nullptr, small_ring}};
  gpu_state s;
  for (int i = 0; i < 4; ++i) s.tensors.emplace_back(ckpt::dtype::f32, ckpt::shape_t{256 * 1024}, 0, 10 + static_cast<std::uint64_t>(i));
  cp.save(1, s);
  cp.save(2, s);
  CHECK(rt.st->pinned_peak == 3 * 4096);  // 4 MiB of tensors through 12 KiB of pinned memory
  CHECK(rt.st->pinned_allocs == 3);       // allocated by the first save, reused by the second
  CHECK(rt.st->max_copies_in_flight >= 2);
}

TEST_CASE("a failing runtime call is a ckpt::error naming the call, the error and the tensor; nothing leaks") {
  struct failing_call {
    const char* call;
    int nth;
    const char* expect;
  };
  for (const auto& f : {failing_call{"copy_async", 5, "cudaMemcpyAsync (device to host) failed"},
                        failing_call{"host_alloc", 2, "cudaHostAlloc (4096 bytes) failed"},
                        failing_call{"make_stream", 1, "cudaStreamCreateWithFlags failed"},
                        failing_call{"sync event", 3, "cudaEventSynchronize failed"}}) {
    CAPTURE(f.call);
    fake::runtime rt;
    {
      ckpt::memory_storage mem;
      gpu_state s;
      s.tensors.emplace_back(ckpt::dtype::bf16, ckpt::shape_t{3, 10'000}, 0, 5);
      gpu_checkpointer cp{{}, mem, {}, {}, policy{rt, nullptr, small_ring}};
      // A first checkpoint through a policy of its own, so the failure hits a fresh one.
      ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> host{{}, mem};
      host_only first;
      host.save(1, first);
      rt.st->fail_on[f.call] = {f.nth, "cudaErrorIllegalAddress: an illegal memory access was encountered"};
      try {
        cp.save(2, s);
        FAIL("no error");
      } catch (const ckpt::error& e) {
        const std::string m = e.what();
        CHECK(e.kind() == ckpt::error_kind::io);
        CHECK(m.find(f.expect) != std::string::npos);
        CHECK(m.find("cudaErrorIllegalAddress: an illegal memory access was encountered") != std::string::npos);
        CHECK(m.find("bf16[3,10000] on cuda:0") != std::string::npos);
      }
      CHECK(cp.latest() == "global_step1");  // the last good checkpoint is untouched
    }
    CHECK(rt.st->pinned_now == 0);
    CHECK(rt.st->streams_alive == 0);
    CHECK(rt.st->events_alive == 0);
  }
}

TEST_CASE("device_copy's options are checked") {
  CHECK_THROWS_AS(policy(fake::runtime{}, nullptr, {.slot_bytes = 0, .slots = 3}), ckpt::error);
  CHECK_THROWS_AS(policy(fake::runtime{}, nullptr, {.slot_bytes = 4096, .slots = 1}), ckpt::error);
}

namespace {
std::size_t count_calls(const fake::runtime& rt, const std::string& name, std::size_t from = 0) {
  std::lock_guard lock(rt.st->mu);
  return static_cast<std::size_t>(std::count(rt.st->calls.begin() + static_cast<std::ptrdiff_t>(from), rt.st->calls.end(), name));
}
std::size_t calls_so_far(const fake::runtime& rt) {
  std::lock_guard lock(rt.st->mu);
  return rt.st->calls.size();
}
}  // namespace

TEST_CASE("pinned buffers lent to the pipelines: one copy per chunk, bounded, reused, in order with the user's stream") {
  fake::runtime rt;
  constexpr std::size_t lend = std::size_t{1} << 20;
  {
    ckpt::memory_storage mem;
    // 64 KiB chunks, 4 of them in flight: 256 KiB of staging buffers, lent.
    gpu_checkpointer cp{{}, mem, {.keep_last_n = 2, .chunk_bytes = 64 << 10, .buffer_bytes = 256 << 10}, {},
                        policy{rt, nullptr, {.slot_bytes = 4096, .slots = 3, .lend_bytes = lend}}};
    gpu_state s;
    for (int i = 0; i < 4; ++i) s.tensors.emplace_back(ckpt::dtype::f32, ckpt::shape_t{256 * 1024}, 0, 20 + static_cast<std::uint64_t>(i));
    auto& first = s.tensors[0];
    // A "kernel" enqueued just before the save writes the first tensor 30 ms later.
    rt.launch(nullptr, [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      std::fill(first.bytes.begin(), first.bytes.end(), std::byte{9});
    });
    auto mark = calls_so_far(rt);
    cp.save(1, s);
    // 4 MiB in 64 chunks: one copy each, where the ring would make 16 pieces of each chunk.
    CHECK(count_calls(rt, "copy_async", mark) == 64);
    const auto allocs = rt.st->pinned_allocs;
    CHECK(allocs == 3 + 4);  // the ring, and one staging buffer per slot of the pipeline
    mark = calls_so_far(rt);
    cp.save(2, s);
    CHECK(count_calls(rt, "copy_async", mark) == 64);
    CHECK(rt.st->pinned_allocs == allocs);  // the second save reused every buffer
    CHECK(rt.st->pinned_peak <= lend + 3 * 4096);

    const auto saved = s;
    scramble(s);
    cp.load(s, {.tag = "global_step1"});  // the first save waited for the kernel before copying
    CHECK(std::all_of(first.bytes.begin(), first.bytes.end(), [](std::byte b) { return b == std::byte{9}; }));
    scramble(s);
    mark = calls_so_far(rt);
    cp.load(s);
    CHECK(same(s, saved));
    CHECK(count_calls(rt, "copy_async", mark) == 64);  // host to device: one copy per chunk read
    CHECK(rt.st->calls.back() == "wait legacy");       // the user's stream waits for the loaded bytes
  }
  CHECK(rt.st->pinned_now == 0);
}

TEST_CASE("save_async into lent pinned memory: one copy per tensor, then the tensors may change") {
  fake::runtime rt;
  {
    ckpt::memory_storage mem;
    gpu_checkpointer cp{{}, mem, {}, {}, policy{rt, nullptr, {.slot_bytes = 4096, .slots = 3, .lend_bytes = 64 << 20}}};
    auto s = every_dtype_and_size(8);
    const auto before = s;
    // Tensors of 64 KiB and more are copied straight into the lent snapshot in one copy;
    // smaller ones (not worth pinning) go through the ring in 4 KiB pieces.
    std::size_t copies = 0, lent = 0;
    for (const auto& t : s.tensors) {
      if (t.bytes.size() >= policy::min_lend_bytes) {
        ++copies;
        ++lent;
      } else {
        copies += (t.bytes.size() + 4095) / 4096;
      }
    }
    REQUIRE(lent >= 8);
    const auto mark = calls_so_far(rt);
    auto h = cp.save_async(1, s);
    CHECK(count_calls(rt, "copy_async", mark) == copies);
    for (auto& t : s.tensors) rt.launch(nullptr, [&t] { std::fill(t.bytes.begin(), t.bytes.end(), std::byte{0x66}); });
    rt.finish(nullptr);
    h.wait();
    auto back = every_dtype_and_size(8);
    scramble(back);
    cp.load(back);
    CHECK(same(back, before));
  }
  CHECK(rt.st->pinned_now == 0);
}

TEST_CASE("lending stops at lend_bytes: past it, buffers are ordinary memory and copies go through the ring") {
  fake::runtime rt;
  ckpt::memory_storage mem;
  // Room for two 64 KiB staging buffers of the four the pipeline wants.
  gpu_checkpointer cp{{}, mem, {.chunk_bytes = 64 << 10, .buffer_bytes = 256 << 10}, {},
                      policy{rt, nullptr, {.slot_bytes = 4096, .slots = 3, .lend_bytes = 128 << 10}}};
  gpu_state s;
  s.tensors.emplace_back(ckpt::dtype::f32, ckpt::shape_t{256 * 1024}, 0, 31);
  const auto saved = s;
  const auto mark = calls_so_far(rt);
  cp.save(1, s);
  // 16 chunks: the 8 staged into lent buffers take one copy, the 8 others 16 ring pieces each.
  CHECK(count_calls(rt, "copy_async", mark) == 8 + 8 * 16);
  CHECK(rt.st->pinned_peak <= (128 << 10) + 3 * 4096);
  scramble(s);
  cp.load(s);
  CHECK(same(s, saved));
}

// ----- the CUDA contract a host engine relies on (issue 20) -------------------------------------

namespace {
std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& e : v) s += (s.empty() ? "" : "; ") + e;
  return s;
}
}  // namespace

TEST_CASE("save and load put back the caller's current device; a thread with none is left with none") {
  fake::runtime rt;
  ckpt::memory_storage mem;
  gpu_checkpointer cp{{}, mem, {}, {}, policy{rt, nullptr, small_ring}};
  auto s = every_dtype_and_size(6, 2);  // tensors on cuda:0 and cuda:1
  rt.set_device(3);                     // the engine's own GPU
  cp.save(1, s);
  CHECK(rt.current_device_now() == 3);
  scramble(s);
  cp.load(s);
  CHECK(rt.current_device_now() == 3);
  CHECK(same(s, every_dtype_and_size(6, 2)));
  // A thread that never chose a device (a worker of the engine's, say) has none afterwards:
  // putting back "device 0" would make a context on GPU 0 on a real one.
  int after = 99;
  std::thread([&] {
    cp.save(2, s);
    after = rt.current_device_now();
  }).join();
  CHECK(after == -1);
  CHECK(rt.errors_left().empty());
}

TEST_CASE("nothing is left in the last-error slot: not after a refused pinned allocation, not after a reported failure") {
  fake::runtime rt;
  policy p{rt, nullptr, {.slot_bytes = 4096, .slots = 3, .lend_bytes = 1 << 20}};
  rt.st->fail_on["host_alloc"] = {1, "cudaErrorMemoryAllocation: out of memory"};
  const auto b = p.lend(256 << 10);
  CHECK(b.data() == nullptr);  // refused: the borrower uses ordinary memory
  CAPTURE(joined(rt.errors_left()));
  CHECK(rt.errors_left().empty());
  const auto again = p.lend(256 << 10);  // the system may pin more later
  CHECK(again.data() != nullptr);

  // A failure that becomes a ckpt::error is reported once, there, and not left for the engine's
  // next launch check to report as its own.
  ckpt::memory_storage mem;
  gpu_checkpointer cp{{}, mem, {}, {}, policy{rt, nullptr, small_ring}};
  gpu_state s;
  s.tensors.emplace_back(ckpt::dtype::f32, ckpt::shape_t{10'000}, 0, 5);
  rt.st->fail_on["copy_async"] = {rt.st->uses["copy_async"] + 2, "cudaErrorLaunchFailure: unspecified launch failure"};
  CHECK_THROWS_WITH_AS(cp.save(1, s), doctest::Contains("cudaErrorLaunchFailure"), ckpt::error);
  CAPTURE(joined(rt.errors_left()));
  CHECK(rt.errors_left().empty());
  // Nor are copies left queued that would read the tensor after the failed save returned
  // (`s` is destroyed before `cp` here: TSan saw such a copy read freed memory).
  CHECK(rt.st->copies_in_flight == 0);
}

TEST_CASE("a user stream on another GPU than the tensors: ckpt's copies still wait for it, and it waits for the loaded bytes") {
  fake::runtime rt;
  rt.set_device(1);
  std::unique_ptr<fake::stream_impl> user(rt.user_stream("user"));  // the engine's stream, on cuda:1
  rt.set_device(0);
  ckpt::memory_storage mem;
  gpu_checkpointer cp{{}, mem, {}, {}, policy{rt, user.get(), small_ring}};
  gpu_state s;
  s.tensors.emplace_back(ckpt::dtype::f32, ckpt::shape_t{50'000}, 0, 3);  // on cuda:0
  s.tensors.emplace_back(ckpt::dtype::f16, ckpt::shape_t{7'000}, 1, 4);   // on cuda:1, the stream's own
  auto& t = s.tensors[0];
  rt.launch(user.get(), [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::fill(t.bytes.begin(), t.bytes.end(), std::byte{7});
  });
  cp.save(1, s);  // an event of cuda:0 recorded on this stream would be refused, as CUDA refuses it
  const auto saved = s;
  CHECK(std::all_of(saved.tensors[0].bytes.begin(), saved.tensors[0].bytes.end(), [](std::byte b) { return b == std::byte{7}; }));
  scramble(s);
  cp.load(s);
  CHECK(same(s, saved));
  // The event ckpt records on the user's stream was made on the stream's GPU.
  const auto& calls = rt.st->calls;
  CHECK(std::count(calls.begin(), calls.end(), "record user") >= 2);
  CHECK(calls.back() == "wait user");
  CHECK(rt.current_device_now() == 0);
  CHECK(rt.errors_left().empty());
}

TEST_CASE("copies into lent buffers stay in flight: a save enqueues the next chunk before the last has landed") {
  fake::runtime rt;
  rt.st->copy_delay = std::chrono::microseconds(2000);  // a worker that read before the copy landed would hash stale bytes
  {
    ckpt::memory_storage mem;
    gpu_checkpointer cp{{}, mem, {.keep_last_n = 2, .chunk_bytes = 64 << 10, .buffer_bytes = 512 << 10}, {},
                        policy{rt, nullptr, {.slot_bytes = 4096, .slots = 3, .lend_bytes = 4 << 20}}};
    gpu_state s;
    for (int i = 0; i < 2; ++i) s.tensors.emplace_back(ckpt::dtype::f32, ckpt::shape_t{128 * 1024}, 0, 40 + static_cast<std::uint64_t>(i));
    const auto saved = s;
    const auto events_before = rt.st->events_alive;
    rt.set_device(0);  // the engine's GPU: a call made without one below is a worker's
    cp.save(1, s);
    // Before, each chunk's copy was waited for before the next was enqueued: one at a time.
    CHECK(rt.st->max_copies_in_flight >= 2);
    // The context's 5 events (ring and ordering), and one per copy in flight, reused: at most
    // the pipeline's 8 slots and one more, where one per chunk would be 16.
    CHECK(rt.st->events_alive - events_before <= 5 + 8 + 1);
    CHECK(rt.st->calls_without_device == 0);  // the workers waited on the tensors' GPU
    CHECK(rt.errors_left().empty());
    scramble(s);
    cp.load(s);
    CHECK(same(s, saved));  // every chunk was hashed and written after its bytes landed
  }
  CHECK(rt.st->pinned_now == 0);
  CHECK(rt.st->events_alive == 0);
}

TEST_CASE("start_to_host: wait, a handle destroyed unwaited, memory not lent, and a failure naming the tensor") {
  fake::runtime rt;
  rt.st->copy_delay = std::chrono::milliseconds(50);  // long enough that two starts come before either lands
  policy p{rt, nullptr, {.slot_bytes = 4096, .slots = 3, .lend_bytes = 1 << 20}};
  device_tensor t(ckpt::dtype::i32, ckpt::shape_t{2, 32 * 1024}, 0, 77);  // 256 KiB
  const auto n = t.bytes.size() / 2;
  auto buf = p.lend(t.bytes.size());
  REQUIRE(buf.data() != nullptr);
  auto lands = [&](std::size_t from) { return std::equal(t.bytes.begin() + from, t.bytes.begin() + from + n, buf.data() + from); };

  SUBCASE("waited for on a thread that never chose a GPU") {
    auto first = p.start_to_host(t.ref(), 0, {buf.data(), n});
    auto second = p.start_to_host(t.ref(), n, {buf.data() + n, n});
    CHECK(rt.st->copies_in_flight == 2);  // both enqueued, neither landed yet
    int device_after = 99;
    const std::uint64_t without_before = rt.st->calls_without_device;
    std::thread([&] {
      first.wait();
      second.wait();
      device_after = rt.current_device_now();
    }).join();
    CHECK(lands(0));
    CHECK(lands(n));
    CHECK(device_after == -1);  // put back: no GPU made current on the waiting thread
    CHECK(rt.st->calls_without_device == without_before);  // and none of its calls ran without one
    first.wait();  // a second wait returns at once
  }
  SUBCASE("destroyed unwaited: it waits, so the buffer is never written after it") {
    { auto h = p.start_to_host(t.ref(), n, {buf.data() + n, n}); }
    CHECK(rt.st->copies_in_flight == 0);
    CHECK(lands(n));
  }
  SUBCASE("into memory not lent: done before it returns") {
    std::vector<std::byte> plain(n);
    auto h = p.start_to_host(t.ref(), 0, plain);
    CHECK(std::equal(plain.begin(), plain.end(), t.bytes.begin()));
    h.wait();
  }
  SUBCASE("a copy that fails in flight is a ckpt::error naming the tensor and the bytes when waited for") {
    auto h = p.start_to_host(t.ref(), n, {buf.data() + n, n});
    rt.st->fail_on["sync event"] = {rt.st->uses["sync event"] + 1, "cudaErrorIllegalAddress: an illegal memory access was encountered"};
    try {
      h.wait();
      FAIL("no error");
    } catch (const ckpt::error& e) {
      const std::string m = e.what();
      CHECK(e.kind() == ckpt::error_kind::io);
      CHECK(m.find("cudaEventSynchronize (device to host) failed: cudaErrorIllegalAddress") != std::string::npos);
      CHECK(m.find("i32[2,32768] on cuda:0") != std::string::npos);
      CHECK(m.find("bytes [131072, 262144)") != std::string::npos);
    }
    CAPTURE(joined(rt.errors_left()));
    CHECK(rt.errors_left().empty());
    // The fake's copy still lands later (a real GPU's context is lost after such an error):
    // the buffer must outlive it here.
    while (rt.st->copies_in_flight != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST_CASE("save_async's snapshot enqueues every tensor's copy before it waits for the first") {
  fake::runtime rt;
  rt.st->copy_delay = std::chrono::microseconds(2000);
  {
    ckpt::memory_storage mem;
    gpu_checkpointer cp{{}, mem, {}, {}, policy{rt, nullptr, {.slot_bytes = 4096, .slots = 3, .lend_bytes = 64 << 20}}};
    gpu_state s;
    for (int i = 0; i < 6; ++i) s.tensors.emplace_back(ckpt::dtype::bf16, ckpt::shape_t{64 * 1024}, 0, 60 + static_cast<std::uint64_t>(i));
    const auto before = s;
    auto h = cp.save_async(1, s);
    CHECK(rt.st->max_copies_in_flight >= 6);
    for (auto& t : s.tensors) std::fill(t.bytes.begin(), t.bytes.end(), std::byte{0x5A});  // the snapshot is taken
    h.wait();
    scramble(s);
    cp.load(s);
    CHECK(same(s, before));
  }
  CHECK(rt.st->pinned_now == 0);
}

TEST_CASE("an item of many small chunks keeps at most 8 copies, and their events, in flight") {
  fake::runtime rt;
  {
    ckpt::memory_storage mem;
    // 64 tensors of 16 KiB: small chunks travel together, one item of 1 MiB, 64 copies.
    gpu_checkpointer cp{{}, mem, {}, {}, policy{rt, nullptr, {.slot_bytes = 4096, .slots = 3, .lend_bytes = 16 << 20}}};
    gpu_state s;
    for (int i = 0; i < 64; ++i) s.tensors.emplace_back(ckpt::dtype::u8, ckpt::shape_t{16 * 1024}, 0, 80 + static_cast<std::uint64_t>(i));
    const auto saved = s;
    cp.save(1, s);
    CHECK(rt.st->max_copies_in_flight >= 2);
    CHECK(rt.st->max_copies_in_flight <= 8);
    CHECK(rt.st->events_alive <= 5 + 8);  // the context's 5, and one per copy in flight, where one per chunk would be 64
    scramble(s);
    cp.load(s);
    CHECK(same(s, saved));
  }
  CHECK(rt.st->events_alive == 0);
}

TEST_CASE("a copy that cannot be enqueued into a lent buffer: a ckpt::error, nothing left in flight, nothing leaked") {
  fake::runtime rt;
  {
    ckpt::memory_storage mem;
    ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> host{{}, mem};
    host_only first;
    host.save(1, first);
    gpu_checkpointer cp{{}, mem, {.chunk_bytes = 64 << 10}, {}, policy{rt, nullptr, {.slot_bytes = 4096, .slots = 3, .lend_bytes = 8 << 20}}};
    gpu_state s;
    for (int i = 0; i < 2; ++i) s.tensors.emplace_back(ckpt::dtype::f32, ckpt::shape_t{128 * 1024}, 0, 90 + static_cast<std::uint64_t>(i));
    rt.st->fail_on["copy_async"] = {5, "cudaErrorLaunchFailure: unspecified launch failure"};
    CHECK_THROWS_WITH_AS(cp.save(2, s), doctest::Contains("cudaMemcpyAsync (device to host) failed: cudaErrorLaunchFailure"), ckpt::error);
    CHECK(rt.st->copies_in_flight == 0);  // the four before it were waited for before their buffers went back
    CAPTURE(joined(rt.errors_left()));
    CHECK(rt.errors_left().empty());
    CHECK(cp.latest() == "global_step1");
  }
  CHECK(rt.st->pinned_now == 0);
  CHECK(rt.st->events_alive == 0);
}

TEST_CASE("copies in flight from tensors on two GPUs: each waited for on its own GPU, the caller's device put back") {
  fake::runtime rt;
  rt.st->copy_delay = std::chrono::microseconds(1000);
  {
    ckpt::memory_storage mem;
    gpu_checkpointer cp{{}, mem, {.chunk_bytes = 64 << 10, .buffer_bytes = 512 << 10}, {},
                        policy{rt, nullptr, {.slot_bytes = 4096, .slots = 3, .lend_bytes = 8 << 20}}};
    gpu_state s;
    // Alternating GPUs, so one pipeline item holds chunks of both: an event of cuda:1 recorded on
    // cuda:0's stream would be refused (cudaErrorInvalidResourceHandle) by the fake.
    for (int i = 0; i < 4; ++i) s.tensors.emplace_back(ckpt::dtype::f32, ckpt::shape_t{64 * 1024}, i % 2, 70 + static_cast<std::uint64_t>(i));
    for (int i = 0; i < 16; ++i) s.tensors.emplace_back(ckpt::dtype::i8, ckpt::shape_t{8 * 1024}, i % 2, 100 + static_cast<std::uint64_t>(i));
    const auto saved = s;
    rt.set_device(1);  // the engine's GPU
    const std::uint64_t without_before = rt.st->calls_without_device;
    cp.save(1, s);
    CHECK(rt.current_device_now() == 1);
    CHECK(rt.st->calls_without_device == without_before);  // the workers waited on the tensors' GPUs
    CHECK(rt.st->max_copies_in_flight >= 2);
    CAPTURE(joined(rt.errors_left()));
    CHECK(rt.errors_left().empty());
    auto h = cp.save_async(2, s);  // the snapshot's copies, from both GPUs, in flight together
    h.wait();
    scramble(s);
    cp.load(s, {.tag = "global_step1"});
    CHECK(same(s, saved));
    scramble(s);
    cp.load(s);
    CHECK(same(s, saved));
  }
  CHECK(rt.st->events_alive == 0);
  CHECK(rt.st->pinned_now == 0);
}
