// ckpt::cuda::basic_nccl on the fake CUDA runtime and the fake NCCL (fake_nccl.hpp), with ranks
// as threads: every collective at 1, 3 and 4 ranks with messages smaller and larger than the
// transfer buffer; point-to-point transfers between GPU tensors and host memory; ordering with
// the user's stream; the bootstrap overload; refused arguments; failed NCCL calls, NCCL's
// asynchronous errors and silent peers (the watchdog), each aborting the communicator; and
// nothing leaked. The same class runs on real CUDA and NCCL as ckpt::cuda::nccl
// (test_nccl_real.cpp on a GPU).

#include "fake_nccl.hpp"
#include "fake_runtime.hpp"

#include <doctest/doctest.h>

#include <ckpt/ckpt.hpp>
#include <ckpt/concepts.hpp>
#include <ckpt/cuda/basic_device_copy.hpp>
#include <ckpt/cuda/basic_nccl.hpp>
#include <ckpt/error.hpp>
#include <ckpt/tensor.hpp>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using comm_t = ckpt::cuda::basic_nccl<fake::runtime, fake::nccl_api>;
static_assert(ckpt::Transport<comm_t>);
static_assert(ckpt::Communicator<comm_t>);
static_assert(std::movable<comm_t> && std::default_initializable<comm_t>);

/// Small pieces, so that every transfer of a few KB is many NCCL calls.
constexpr ckpt::cuda::nccl_options small{.transfer_bytes = 1000, .timeout = std::chrono::seconds{20}};
/// For the tests where a peer is missing on purpose.
constexpr ckpt::cuda::nccl_options impatient{.transfer_bytes = 1000, .timeout = std::chrono::milliseconds{300}};

std::vector<std::byte> pattern(std::size_t n, int seed) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((i * 31 + static_cast<std::size_t>(seed) * 7 + 1) & 0xff);
  return b;
}

/// "Device memory" of cuda:gpu: bytes the fake runtime copies with memcpy.
struct device_tensor {
  std::vector<std::byte> bytes;
  ckpt::shape_t shape;
  int gpu = 0;
  device_tensor(std::uint64_t floats, int seed, int g = 0) : bytes(pattern(floats * 4, seed)), shape{floats}, gpu(g) {}
  ckpt::tensor_ref ref() { return ckpt::tensor_ref(ckpt::dtype::f32, shape, bytes.data(), ckpt::device::cuda(gpu)); }
};

/// A world of fake GPUs: one fake runtime per rank, one fake NCCL shared by all.
struct world {
  fake::nccl_api api;
  std::vector<fake::runtime> runtimes;
  std::vector<std::string> errors;  // per rank: what it threw ("" if nothing)
  std::vector<ckpt::error_kind> kinds;
  std::vector<std::chrono::steady_clock::duration> took;  // per rank: until it returned or threw
  comm_t::unique_id id{};
  /// Runs on each rank's thread before it constructs its communicator; returns the user stream
  /// to give it (nullptr: the legacy default stream), or throws to keep the rank from joining.
  std::function<fake::stream_impl*(fake::runtime&, int)> before_join;

  /// Runs body(comm, runtime, rank) on n threads, each with its communicator; `opts` has one
  /// entry for every rank, or one for all.
  template <class F>
  void run(int n, std::vector<ckpt::cuda::nccl_options> opts, F body) {
    runtimes.clear();
    runtimes.resize(static_cast<std::size_t>(n));  // one fake GPU (runtime state) each
    errors.assign(static_cast<std::size_t>(n), "");
    kinds.assign(static_cast<std::size_t>(n), ckpt::error_kind::io);
    took.assign(static_cast<std::size_t>(n), {});
    id = api.make_unique_id();
    std::vector<std::thread> ranks;
    for (int r = 0; r < n; ++r)
      ranks.emplace_back([&, r] {
        const auto i = static_cast<std::size_t>(r);
        const auto start = std::chrono::steady_clock::now();
        struct timer {
          std::chrono::steady_clock::duration& out;
          std::chrono::steady_clock::time_point start;
          ~timer() { out = std::chrono::steady_clock::now() - start; }
        } t{took[i], start};
        try {
          fake::stream_impl* user = before_join ? before_join(runtimes[i], r) : nullptr;
          comm_t c{r, n, 0, id, user, opts.size() == 1 ? opts[0] : opts[i], runtimes[i], api};
          body(c, runtimes[i], r);
        } catch (const ckpt::error& e) {
          errors[i] = e.what();
          kinds[i] = e.kind();
        } catch (const std::exception& e) {
          errors[i] = std::string("not a ckpt::error: ") + e.what();
        }
      });
    for (auto& t : ranks) t.join();
  }

  bool all_fine() const {
    return std::all_of(errors.begin(), errors.end(), [](const std::string& e) { return e.empty(); });
  }
};

/// After every communicator is gone: no pinned or device memory, stream, event or NCCL
/// communicator is left.
void check_nothing_left(const world& w) {
  for (std::size_t r = 0; r < w.runtimes.size(); ++r) {
    CAPTURE(r);
    const auto& st = *w.runtimes[r].st;
    CHECK(st.pinned_now == 0);
    CHECK(st.device_now == 0);
    CHECK(st.streams_alive == 0);
    CHECK(st.events_alive == 0);
  }
  CHECK(w.api.comms_alive() == 0);
}

/// The same, and each rank allocated its two buffers once.
void check_released(const world& w) {
  check_nothing_left(w);
  for (std::size_t r = 0; r < w.runtimes.size(); ++r) {
    CAPTURE(r);
    CHECK(w.runtimes[r].st->pinned_allocs == 1);
    CHECK(w.runtimes[r].st->device_allocs == 1);
  }
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("barrier, broadcast, all_gather, gather and all_reduce_max at 1, 3 and 4 ranks, in pieces of transfer_bytes") {
  for (int n : {1, 3, 4}) {
    CAPTURE(n);
    const auto un = static_cast<std::size_t>(n);
    const int far_root = std::min(2, n - 1);
    // What each rank contributes to all_gather and gather: uneven, one empty, one larger than
    // transfer_bytes (many rounds).
    auto mine = [](int r) { return pattern(r == 1 ? 0 : static_cast<std::size_t>(r) * 900 + 3, r); };
    struct seen {
      std::vector<std::vector<std::byte>> broadcasts, gathered, gathered_far, gathered_zero;
      std::vector<std::vector<std::byte>> all;
      std::uint64_t max = 0;
      int rank = -1, size = -1;
    };
    std::vector<seen> got(un);
    world w;
    w.run(n, {small}, [&](comm_t& c, fake::runtime&, int r) {
      auto& g = got[static_cast<std::size_t>(r)];
      g.rank = c.rank();
      g.size = c.size();
      c.barrier();
      for (std::size_t len : {std::size_t{0}, std::size_t{7}, std::size_t{1000}, std::size_t{2500}}) {
        auto b = r == far_root ? pattern(len, 9) : pattern(r == 0 ? 5 : 3, r);  // receivers' contents are replaced
        c.broadcast(b, far_root);
        g.broadcasts.push_back(b);
      }
      g.all = c.all_gather(mine(r));
      g.gathered = c.gather(mine(r), 0);
      g.gathered_far = c.gather(mine(r), far_root);
      g.gathered_zero = c.gather({}, 0);
      g.max = c.all_reduce_max(static_cast<std::uint64_t>(r) * 10 + 5);
      c.barrier();
    });
    REQUIRE(w.all_fine());
    std::vector<std::vector<std::byte>> expected;
    for (int r = 0; r < n; ++r) expected.push_back(mine(r));
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      const auto& g = got[static_cast<std::size_t>(r)];
      CHECK(g.rank == r);
      CHECK(g.size == n);
      REQUIRE(g.broadcasts.size() == 4);
      CHECK(g.broadcasts[0].empty());
      CHECK(g.broadcasts[1] == pattern(7, 9));
      CHECK(g.broadcasts[2] == pattern(1000, 9));
      CHECK(g.broadcasts[3] == pattern(2500, 9));
      CHECK(g.all == expected);
      CHECK(g.gathered == (r == 0 ? expected : std::vector<std::vector<std::byte>>{}));
      CHECK(g.gathered_far == (r == far_root ? expected : std::vector<std::vector<std::byte>>{}));
      CHECK(g.gathered_zero == (r == 0 ? std::vector<std::vector<std::byte>>(un) : std::vector<std::vector<std::byte>>{}));
      CHECK(g.max == static_cast<std::uint64_t>(n - 1) * 10 + 5);
    }
    check_released(w);
  }
}

TEST_CASE("send_tensor and recv_tensor move GPU tensors straight, and meet recv_host and send_host, in matching pieces") {
  device_tensor a(777, 1);              // 3108 bytes: three full pieces and a partial one
  device_tensor a_in(777, 2);           // rank 1 receives a here
  device_tensor b_in(600, 3);           // rank 2 receives host bytes into a GPU tensor
  std::vector<std::byte> host_in(2001); // rank 2 receives bytes [100, 2101) of a into host memory
  std::vector<float> host_tensor(300, 2.5f);
  std::vector<float> host_tensor_in(300, 0.f);
  world w;
  w.run(3, {small}, [&](comm_t& c, fake::runtime&, int r) {
    if (r == 0) {
      c.send_tensor(a.ref(), 0, a.ref().nbytes(), 1);
      c.send_tensor(a.ref(), 100, 2001, 2);
      c.send_host(pattern(2400, 4), 2);
      c.send_tensor(ckpt::view(host_tensor.data(), {300}), 0, 1200, 1);
      c.send_tensor(a.ref(), 0, 0, 1);  // nothing, on either side
    } else if (r == 1) {
      c.recv_tensor(a_in.ref(), 0, a_in.ref().nbytes(), 0);
      c.recv_tensor(ckpt::view(host_tensor_in.data(), {300}), 0, 1200, 0);
      c.recv_tensor(a_in.ref(), 5, 0, 0);
    } else {
      c.recv_host(host_in, 0);
      c.recv_tensor(b_in.ref(), 0, 2400, 0);
    }
    c.barrier();
  });
  REQUIRE(w.all_fine());
  CHECK(a_in.bytes == a.bytes);
  CHECK(host_in == std::vector<std::byte>(a.bytes.begin() + 100, a.bytes.begin() + 2101));
  CHECK(b_in.bytes == pattern(2400, 4));
  CHECK(host_tensor_in == host_tensor);
  // 3108 + 2001 + 2400 + 1200 bytes in pieces of at most 1000: 4 + 3 + 3 + 2 sends, each
  // matched by one receive of the same size (the fake checks the sizes).
  CHECK(w.api.calls("ncclSend") == 12);
  CHECK(w.api.calls("ncclRecv") == 12);
  CHECK(w.api.st->bytes_sent == 3108 + 2001 + 2400 + 1200);
  // GPU tensors go to NCCL directly: only host bytes are staged (2400 + 1200 sent, 2001 + 1200
  // received), and the collectives' few bytes.
  check_released(w);
}

TEST_CASE("send_tensor waits for the kernels already on the user's stream; recv_tensor orders the user's stream after it") {
  device_tensor t(5000, 1);  // 20000 bytes: 20 pieces
  std::vector<std::byte> got(t.bytes.size());
  device_tensor into(5000, 2);
  world w;
  w.run(2, {small}, [&](comm_t& c, fake::runtime& rt, int r) {
    if (r == 0) {
      // A "kernel" on the user's stream (the legacy default stream here) that writes the tensor
      // 50 ms from now, enqueued just before the send: the receiver must see its 7s.
      rt.launch(nullptr, [&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        std::fill(t.bytes.begin(), t.bytes.end(), std::byte{7});
      });
      c.send_tensor(t.ref(), 0, t.ref().nbytes(), 1);
      c.send_tensor(t.ref(), 0, t.ref().nbytes(), 1);
    } else {
      c.recv_host(got, 0);
      c.recv_tensor(into.ref(), 0, into.ref().nbytes(), 0);
    }
  });
  REQUIRE(w.all_fine());
  CHECK(std::all_of(got.begin(), got.end(), [](std::byte b) { return b == std::byte{7}; }));
  CHECK(into.bytes == t.bytes);
  // The sender recorded an event on the user's stream and made ckpt's wait for it before its
  // first NCCL call; after receiving into a GPU tensor, the user's stream waits for ckpt's.
  const auto& sent = w.runtimes[0].st->calls;
  REQUIRE(std::find(sent.begin(), sent.end(), "wait ckpt") != sent.end());
  CHECK(std::find(sent.begin(), sent.end(), "record legacy") < std::find(sent.begin(), sent.end(), "wait ckpt"));
  const auto& received = w.runtimes[1].st->calls;
  CHECK(std::find(received.begin(), received.end(), "wait legacy") != received.end());
  check_released(w);
}

TEST_CASE("the bootstrap overload: rank 0 makes the id and share carries it to every rank") {
  fake::nccl_api api;
  std::array<std::byte, 128> board{};
  std::barrier sync(3);
  std::vector<std::uint64_t> max(3);
  std::vector<fake::runtime> runtimes(3);
  for (auto& rt : runtimes) rt = fake::runtime{};
  std::vector<std::string> errors(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.emplace_back([&, r] {
      const auto i = static_cast<std::size_t>(r);
      try {
        auto share = [&](std::span<std::byte> id) {
          if (r == 0) std::copy(id.begin(), id.end(), board.begin());
          sync.arrive_and_wait();
          std::copy(board.begin(), board.end(), id.begin());
        };
        comm_t c{r, 3, 0, share, nullptr, small, runtimes[i], api};
        max[i] = c.all_reduce_max(static_cast<std::uint64_t>(100 - r));
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  CHECK(errors == std::vector<std::string>(3));
  CHECK(max == std::vector<std::uint64_t>(3, 100));
  CHECK(api.calls("ncclGetUniqueId") == 1);
  CHECK(api.comms_alive() == 0);
}

TEST_CASE("ranks that disagree on transfer_bytes are refused, naming both values") {
  world w;
  auto other = small;
  other.transfer_bytes = 2000;
  bool constructed = false;
  w.run(2, {small, other}, [&](comm_t&, fake::runtime&, int) { constructed = true; });
  CHECK(!constructed);
  for (std::size_t r = 0; r < 2; ++r) {
    CAPTURE(w.errors[r]);
    CHECK(w.kinds[r] == ckpt::error_kind::invalid_argument);
    CHECK(contains(w.errors[r], "transfer_bytes"));
    CHECK(contains(w.errors[r], "smallest: 1000"));
    CHECK(contains(w.errors[r], "largest: 2000"));
  }
  check_released(w);
  // Too small to carry the constructor's agreement (two 8-byte words), even at one rank.
  world tiny;
  auto eight = small;
  eight.transfer_bytes = 8;
  tiny.run(1, {eight}, [&](comm_t&, fake::runtime&, int) { constructed = true; });
  CHECK(!constructed);
  CHECK(contains(tiny.errors[0], "must be at least 16 bytes"));
}

TEST_CASE("bad arguments are refused with the tensor named, and leave the communicator usable") {
  device_tensor t(10, 1);
  device_tensor elsewhere(10, 1, 1);
  const std::vector<float> read_only(10);
  std::vector<std::string> refused;
  world w;
  w.run(2, {small}, [&](comm_t& c, fake::runtime&, int r) {
    if (r == 0) {
      auto attempt = [&](const std::function<void()>& f) {
        try {
          f();
          refused.push_back("accepted");
        } catch (const ckpt::error& e) {
          refused.push_back(std::string(to_string(e.kind())) + ": " + e.what());
        }
      };
      attempt([&] { c.send_tensor(t.ref(), 36, 8, 1); });
      attempt([&] { c.recv_tensor(t.ref(), 41, 0, 1); });
      attempt([&] { c.send_tensor(elsewhere.ref(), 0, 4, 1); });
      attempt([&] { c.recv_tensor(ckpt::tensor_ref(ckpt::dtype::f32, {10}, static_cast<const void*>(read_only.data())), 0, 4, 1); });
      attempt([&] { c.send_host(pattern(4, 1), 0); });
      attempt([&] { c.recv_host(std::span<std::byte>{}, 2); });
      std::vector<std::byte> b;
      attempt([&] { c.broadcast(b, 5); });
    }
    c.barrier();  // still sound
  });
  REQUIRE(w.all_fine());
  REQUIRE(refused.size() == 7);
  for (const auto& e : refused) CHECK(contains(e, "invalid_argument: cuda::nccl: "));
  CHECK(contains(refused[0], "send_tensor: bytes [36, +8) are outside tensor f32[10] on cuda:0 of 40 bytes"));
  CHECK(contains(refused[1], "recv_tensor: bytes [41, +0) are outside tensor f32[10] on cuda:0"));
  CHECK(contains(refused[2], "tensor f32[10] on cuda:1 is not on cuda:0"));
  CHECK(contains(refused[3], "read-only tensor f32[10] on host"));
  CHECK(contains(refused[4], "cannot exchange bytes with rank 0"));
  CHECK(contains(refused[5], "cannot exchange bytes with rank 2 in a world of 2"));
  CHECK(contains(refused[6], "cannot use root 5"));
  check_released(w);
}

TEST_CASE("a default-constructed communicator says it is not initialised; copies share one") {
  comm_t unbound;
  CHECK_THROWS_WITH_AS(unbound.barrier(), doctest::Contains("cuda::nccl: not initialised"), ckpt::error);
  CHECK_THROWS_AS((void)unbound.rank(), ckpt::error);
  CHECK(unbound.thread_safe());
  world w;
  std::vector<std::uint64_t> max(2);
  w.run(2, {small}, [&](comm_t& c, fake::runtime&, int r) {
    comm_t copy = c;
    comm_t moved = std::move(c);
    copy.barrier();
    max[static_cast<std::size_t>(r)] = moved.all_reduce_max(static_cast<std::uint64_t>(r) + 1);
  });
  REQUIRE(w.all_fine());
  CHECK(max == std::vector<std::uint64_t>{2, 2});
  check_released(w);
}

TEST_CASE("a failed ncclSend becomes a ckpt::error naming the call, NCCL's error and the peer; its peer in this process aborts at once") {
  world w;
  const std::string nccl_error = "unhandled system error (run with NCCL_DEBUG=INFO for details)";
  w.api.fail("ncclSend", 2, nccl_error, 0);  // the second piece
  std::string later;
  std::chrono::steady_clock::duration peer_took{};
  // A long timeout: the peer must not wait it out, since the failing rank is a thread of this
  // process and tells it (a peer in another process would time out, or see NCCL's error).
  w.run(2, {small}, [&](comm_t& c, fake::runtime&, int r) {
    if (r == 0) {
      try {
        c.send_host(pattern(2500, 1), 1);
      } catch (const ckpt::error&) {
        try {
          c.barrier();
        } catch (const ckpt::error& e) {
          later = e.what();
        }
        throw;
      }
    } else {
      std::vector<std::byte> into(2500);
      const auto start = std::chrono::steady_clock::now();
      try {
        c.recv_host(into, 0);  // the first piece may arrive, then nothing more
      } catch (const ckpt::error&) {
        peer_took = std::chrono::steady_clock::now() - start;
        throw;
      }
    }
  });
  CAPTURE(w.errors[0]);
  CAPTURE(w.errors[1]);
  CHECK(w.kinds[0] == ckpt::error_kind::communication);
  CHECK(contains(w.errors[0], "cuda::nccl: ncclSend failed: " + nccl_error));
  CHECK(contains(w.errors[0], "send_host, peer 1, bytes [1000, 2000) of 2500"));
  CHECK(contains(w.errors[0], "aborted"));
  CHECK(contains(later, "cuda::nccl: the communicator was aborted after ncclSend failed"));
  CHECK(w.kinds[1] == ckpt::error_kind::communication);
  CHECK(contains(w.errors[1], "cuda::nccl: recv_host failed: rank 0: ncclSend failed: " + nccl_error));
  CHECK(contains(w.errors[1], "(recv_host, peer 0, bytes ["));
  CHECK(contains(w.errors[1], "the NCCL communicator was aborted"));
  CHECK(peer_took < std::chrono::seconds(5));
  CHECK(w.api.was_aborted(0));
  CHECK(w.api.was_aborted(1));
  check_released(w);
}

TEST_CASE("an asynchronous NCCL error aborts the communicator; later calls fail at once") {
  world w;
  w.api.inject_async_error(0, "remote process exited or there was a network error (ncclResult_t 6)");
  bool constructed = false;
  w.run(1, {small}, [&](comm_t&, fake::runtime&, int) { constructed = true; });
  CAPTURE(w.errors[0]);
  CHECK(w.kinds[0] == ckpt::error_kind::communication);
  // The constructor's own collective meets the error first.
  CHECK(!constructed);
  CHECK(contains(w.errors[0], "NCCL reported remote process exited or there was a network error"));
  CHECK(w.api.was_aborted(0));
  check_released(w);

  // Injected after construction: the next call reports it, and the one after fails at once.
  std::string later;
  std::chrono::steady_clock::duration later_took{};
  world v;
  v.run(1, {small}, [&](comm_t& c, fake::runtime&, int) {
    c.barrier();
    v.api.inject_async_error(0, "remote process exited or there was a network error (ncclResult_t 6)");
    try {
      c.barrier();
    } catch (const ckpt::error&) {
      const auto start = std::chrono::steady_clock::now();
      try {
        (void)c.all_reduce_max(1);
      } catch (const ckpt::error& e) {
        later = e.what();
      }
      later_took = std::chrono::steady_clock::now() - start;
      throw;
    }
  });
  CAPTURE(v.errors[0]);
  CHECK(contains(v.errors[0], "cuda::nccl: barrier failed: NCCL reported remote process exited"));
  CHECK(contains(later, "cuda::nccl: the communicator was aborted after barrier failed"));
  CHECK(later_took < std::chrono::milliseconds(100));
  CHECK(v.api.was_aborted(0));
  check_released(v);
}

TEST_CASE("a receive from a peer that never sends fails after the timeout, naming the peer") {
  world w;
  std::chrono::steady_clock::duration took{};
  w.run(2, {impatient}, [&](comm_t& c, fake::runtime&, int r) {
    if (r != 0) return;
    const auto start = std::chrono::steady_clock::now();
    try {
      device_tensor t(100, 1);
      c.recv_tensor(t.ref(), 0, 400, 1);
    } catch (const ckpt::error&) {
      took = std::chrono::steady_clock::now() - start;
      throw;
    }
  });
  CAPTURE(w.errors[0]);
  CHECK(w.errors[1].empty());
  CHECK(w.kinds[0] == ckpt::error_kind::communication);
  CHECK(contains(w.errors[0], "cuda::nccl: recv_tensor failed: no answer within 300 ms: is rank 1 still running"));
  CHECK(contains(w.errors[0], "peer 1, bytes [0, 400) of 400, tensor f32[100] on cuda:0"));
  CHECK(took >= std::chrono::milliseconds(300));
  CHECK(took < std::chrono::seconds(10));
  CHECK(w.api.was_aborted(0));
  CHECK(!w.api.was_aborted(1));
  check_released(w);
}

TEST_CASE("a failed CUDA call while staging becomes an io error naming the call") {
  world w;
  std::vector<std::byte> got(1500);
  w.run(2, {impatient}, [&](comm_t& c, fake::runtime& rt, int r) {
    if (r == 0) {
      // Every copy_async so far was the constructor's (2) and nothing else; fail the next.
      std::lock_guard lock(rt.st->mu);
      rt.st->fail_on["copy_async"] = {rt.st->uses["copy_async"] + 1, "cudaErrorIllegalAddress: an illegal memory access was encountered"};
    }
    if (r == 0)
      c.send_host(pattern(1500, 1), 1);
    else
      c.recv_host(got, 0);
  });
  CAPTURE(w.errors[0]);
  CHECK(w.kinds[0] == ckpt::error_kind::io);
  CHECK(contains(w.errors[0], "cuda::nccl: cudaMemcpyAsync (host to device) failed: cudaErrorIllegalAddress"));
  CHECK(contains(w.errors[0], "(send_host, peer 1, bytes [0, 1000) of 1500)"));
  CHECK(w.kinds[1] == ckpt::error_kind::communication);
  check_released(w);
}

namespace {

/// One rank's slice of a GPU weight split by rows (unevenly), a replicated host bias and a
/// per-rank value.
struct sharded_state {
  static constexpr std::uint64_t rows = 1001;
  std::uint64_t lo = 0, hi = 0;
  device_tensor w;
  std::vector<float> bias = std::vector<float>(9, 0.5f);
  std::uint64_t seen = 0;
  sharded_state(int r, int n, int seed)
      : lo(rows * static_cast<std::uint64_t>(r) / static_cast<std::uint64_t>(n)),
        hi(rows * static_cast<std::uint64_t>(r + 1) / static_cast<std::uint64_t>(n)), w(hi - lo, seed * 10 + r),
        seen(static_cast<std::uint64_t>(seed * 100 + r)) {}
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", w.ref().sharded({.global_shape = {rows}, .offset = {lo}}));
    v.tensor("bias", ckpt::view(bias, {9}).sharded(ckpt::shard_spec::replica()));
    v.value("seen", seen);
  }
};

}  // namespace

TEST_CASE("gather_to_root over basic_nccl: GPU shards travel to rank 0 and back, with a GPU DevicePolicy") {
  using device_policy = ckpt::cuda::basic_device_copy<fake::runtime>;
  using gpu_gather = ckpt::checkpointer<ckpt::gather_to_root<comm_t>, ckpt::memory_storage, ckpt::raw, device_policy>;
  ckpt::memory_storage mem;  // copies share the files: rank 0 writes, every rank can read
  std::vector<std::string> mismatch(3);
  world w;
  w.run(3, {small}, [&](comm_t& c, fake::runtime&, int r) {
    gpu_gather cp{{.comm = c}, mem, {.chunk_bytes = 1000}, {}, device_policy{fake::runtime{}, nullptr, {.slot_bytes = 4096, .slots = 3}}};
    sharded_state saved(r, 3, 1);
    cp.save(3, saved);
    sharded_state got(r, 3, 2);
    const auto res = cp.load(got);
    if (got.w.bytes != saved.w.bytes || got.bias != saved.bias || got.seen != saved.seen)
      mismatch[static_cast<std::size_t>(r)] = "rank " + std::to_string(r) + " loaded different bytes";
    // Rank 0 read everything and sent the others theirs (scatter_on_load).
    if ((r == 0) != (res.bytes_read > 0)) mismatch[static_cast<std::size_t>(r)] += " read storage: " + std::to_string(res.bytes_read);
    // save_async: returns once rank 0 holds every rank's bytes; the GPU tensors change at once.
    sharded_state later(r, 3, 4);
    auto h = cp.save_async(4, later);
    const auto snapshot = later.w.bytes;
    std::fill(later.w.bytes.begin(), later.w.bytes.end(), std::byte{0x5A});
    h.wait();
    sharded_state back(r, 3, 5);
    cp.load(back);
    if (back.w.bytes != snapshot || back.seen != later.seen)
      mismatch[static_cast<std::size_t>(r)] += " rank " + std::to_string(r) + ": save_async did not keep its snapshot";
  });
  CAPTURE(w.errors[0]);
  CAPTURE(w.errors[1]);
  CAPTURE(w.errors[2]);
  REQUIRE(w.all_fine());
  CHECK(mismatch == std::vector<std::string>(3));
  CHECK(w.api.calls("ncclSend") > 0);  // the shards went point to point
  // save_async used the communicators from background threads: each call made its GPU current
  // there first, so no call ran where a real GPU would make a context on GPU 0.
  for (const auto& rt : w.runtimes) CHECK(rt.st->calls_without_device == 0);
  check_released(w);
}

// ----- joining, bounded; and the CUDA contract a host engine relies on (issue 20) -------------

namespace {
std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& e : v) s += (s.empty() ? "" : "; ") + e;
  return s;
}
struct not_joining : std::runtime_error {
  using std::runtime_error::runtime_error;
};
}  // namespace

TEST_CASE("joining is bounded by the timeout: a rank that never comes leaves its peers with an error, not a hang") {
  world w;
  w.before_join = [](fake::runtime&, int r) -> fake::stream_impl* {
    if (r == 2) throw not_joining("rank 2 stays away, and tells nobody");
    return nullptr;
  };
  w.run(3, {impatient}, [&](comm_t&, fake::runtime&, int) { throw std::runtime_error("constructed without rank 2"); });
  int timed_out_itself = 0;
  for (int r : {0, 1}) {
    const auto i = static_cast<std::size_t>(r);
    CAPTURE(w.errors[i]);
    CHECK(w.kinds[i] == ckpt::error_kind::communication);
    // The first to time out says so; the other may hear it from that one first (same process).
    CHECK(contains(w.errors[i], "cuda::nccl: constructor (ncclCommInitRank: waiting for every rank to join) failed: "));
    CHECK(contains(w.errors[i], "no answer within 300 ms: is every rank still running and making the same calls?"));
    // Only a rank that waited out the timeout itself has waited 300 ms by its own clock: one
    // released by its peer's timeout may have started its clock after the peer started waiting.
    if (!contains(w.errors[i], "failed: rank ")) {
      ++timed_out_itself;
      CHECK(w.took[i] >= std::chrono::milliseconds(300));
    }
    CHECK(w.took[i] < std::chrono::seconds(10));
    CHECK(w.api.was_aborted(r));
  }
  CHECK(timed_out_itself >= 1);
  CHECK(contains(w.errors[2], "rank 2 stays away"));
  check_nothing_left(w);
}

TEST_CASE("give_up: a rank that fails before it can construct its communicator releases its peers in this process at once") {
  world w;
  w.before_join = [&](fake::runtime&, int r) -> fake::stream_impl* {
    if (r == 2) {
      comm_t::give_up(w.id, 2, "cudaStreamCreate failed: out of memory");
      throw not_joining("rank 2 failed before joining");
    }
    return nullptr;
  };
  w.run(3, {small}, [&](comm_t&, fake::runtime&, int) { throw std::runtime_error("constructed without rank 2"); });
  for (int r : {0, 1}) {
    const auto i = static_cast<std::size_t>(r);
    CAPTURE(w.errors[i]);
    CHECK(w.kinds[i] == ckpt::error_kind::communication);
    CHECK(contains(w.errors[i], "failed: rank 2: cudaStreamCreate failed: out of memory"));
    CHECK(w.took[i] < std::chrono::seconds(5));  // the timeout is 20 s
    CHECK(w.api.was_aborted(r));
  }
  check_nothing_left(w);
}

TEST_CASE("a rank whose constructor fails aborts its peers' constructors in this process at once") {
  world w;
  w.before_join = [](fake::runtime& rt, int r) -> fake::stream_impl* {
    if (r == 1) rt.st->fail_on["device_alloc"] = {1, "cudaErrorMemoryAllocation: out of memory"};
    return nullptr;
  };
  w.run(3, {small}, [&](comm_t&, fake::runtime&, int) { throw std::runtime_error("constructed without rank 1"); });
  CAPTURE(w.errors[0]);
  CAPTURE(w.errors[1]);
  CAPTURE(w.errors[2]);
  CHECK(w.kinds[1] == ckpt::error_kind::io);
  CHECK(contains(w.errors[1], "cuda::nccl: cudaMalloc (1000 bytes) failed: cudaErrorMemoryAllocation"));
  for (int r : {0, 2}) {
    const auto i = static_cast<std::size_t>(r);
    CHECK(w.kinds[i] == ckpt::error_kind::communication);
    CHECK(contains(w.errors[i], "failed: rank 1: cudaMalloc (1000 bytes) failed: cudaErrorMemoryAllocation"));
    CHECK(w.took[i] < std::chrono::seconds(5));
  }
  check_nothing_left(w);
}

TEST_CASE("no NCCL call is made while the communicator is still joining or connecting to a peer") {
  // The fake refuses a call on a communicator in progress, as NCCL does: every test above would
  // fail if one were made. Here: the waits happened (joining, then each first transfer to a peer).
  // GPU tensors go to NCCL piece after piece with no wait for the stream in between: the
  // first piece to a new peer leaves the communicator connecting, and the next must wait.
  world w;
  w.api.st->connect_polls = 5;
  device_tensor t(700, 3);  // 2800 bytes: three pieces
  // A buffer per receiving rank: two ranks writing one buffer at once is a data race (TSan
  // reported it once the test build changed its timing), even when both write the same bytes.
  std::vector<std::vector<std::byte>> got(3, std::vector<std::byte>(2800));
  w.run(3, {small}, [&](comm_t& c, fake::runtime&, int r) {
    if (r == 0) {
      c.send_tensor(t.ref(), 0, t.ref().nbytes(), 1);
      c.send_tensor(t.ref(), 0, t.ref().nbytes(), 2);
    } else {
      c.recv_host(got[static_cast<std::size_t>(r)], 0);
    }
    c.barrier();
  });
  CAPTURE(w.errors[0]);
  REQUIRE(w.all_fine());
  CHECK(got[1] == t.bytes);
  CHECK(got[2] == t.bytes);
  // At least the five polls of each of rank 0's two new connections said "in progress".
  CHECK(w.api.st->in_progress_answers >= 10);
  check_released(w);
}

TEST_CASE("every call puts back the caller's current device and leaves nothing in its last-error slot") {
  world w;
  std::vector<int> device_after(3, 99);
  w.before_join = [](fake::runtime& rt, int r) -> fake::stream_impl* {
    if (r != 2) rt.set_device(5 + r);  // the engine's own GPU; rank 2's thread chose none
    return nullptr;
  };
  device_tensor t(3000, 1), into(3000, 2);
  w.run(3, {small}, [&](comm_t& c, fake::runtime& rt, int r) {
    const auto expected = r == 2 ? -1 : 5 + r;
    if (rt.current_device_now() != expected) throw std::runtime_error("the constructor changed the caller's device");
    c.barrier();
    if (r == 0) c.send_tensor(t.ref(), 0, t.ref().nbytes(), 1);
    if (r == 1) c.recv_tensor(into.ref(), 0, into.ref().nbytes(), 0);
    (void)c.all_gather(pattern(1500, r));
    device_after[static_cast<std::size_t>(r)] = rt.current_device_now();
  });
  REQUIRE(w.all_fine());
  CHECK(device_after == std::vector<int>{5, 6, -1});
  CHECK(into.bytes == t.bytes);
  for (const auto& rt : w.runtimes) {
    CHECK(rt.st->not_ready_answers > 0);  // the watchdog did meet "not ready"
    CAPTURE(joined(rt.errors_left()));
    CHECK(rt.errors_left().empty());
  }
  check_released(w);
}

TEST_CASE("a failed CUDA call is reported as a ckpt::error and not left in the last-error slot") {
  world w;
  std::vector<std::byte> got(1500);
  w.run(2, {impatient}, [&](comm_t& c, fake::runtime& rt, int r) {
    if (r == 0) {
      std::lock_guard lock(rt.st->mu);
      rt.st->fail_on["copy_async"] = {rt.st->uses["copy_async"] + 1, "cudaErrorLaunchFailure: unspecified launch failure"};
    }
    if (r == 0)
      c.send_host(pattern(1500, 1), 1);
    else
      c.recv_host(got, 0);
  });
  CHECK(contains(w.errors[0], "cudaErrorLaunchFailure"));
  CAPTURE(joined(w.runtimes[0].errors_left()));
  CHECK(w.runtimes[0].errors_left().empty());
  check_released(w);
}

TEST_CASE("a user stream on another GPU than the communicator's: transfers still wait for it, and it waits for received bytes") {
  world w;
  device_tensor t(5000, 1), into(5000, 2);  // before the streams: a kernel still queued on one writes t
  std::vector<std::unique_ptr<fake::stream_impl>> streams(2);
  w.before_join = [&](fake::runtime& rt, int r) -> fake::stream_impl* {
    rt.set_device(1);  // the engine's stream is on cuda:1; the communicator works on cuda:0
    streams[static_cast<std::size_t>(r)].reset(rt.user_stream("user"));
    return streams[static_cast<std::size_t>(r)].get();
  };
  w.run(2, {small}, [&](comm_t& c, fake::runtime& rt, int r) {
    auto* user = streams[static_cast<std::size_t>(r)].get();
    if (r == 0) {
      rt.launch(user, [&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        std::fill(t.bytes.begin(), t.bytes.end(), std::byte{7});
      });
      c.send_tensor(t.ref(), 0, t.ref().nbytes(), 1);
    } else {
      c.recv_tensor(into.ref(), 0, into.ref().nbytes(), 0);
    }
  });
  CAPTURE(w.errors[0]);
  CAPTURE(w.errors[1]);
  REQUIRE(w.all_fine());
  CHECK(std::all_of(into.bytes.begin(), into.bytes.end(), [](std::byte b) { return b == std::byte{7}; }));
  const auto& sent = w.runtimes[0].st->calls;
  CHECK(std::find(sent.begin(), sent.end(), "record user") != sent.end());
  const auto& received = w.runtimes[1].st->calls;
  CHECK(std::find(received.begin(), received.end(), "wait user") != received.end());
  check_released(w);
}
