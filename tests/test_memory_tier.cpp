// The memory tier (ckpt/memory_tier.hpp) on four ranks as threads, laid out as two emulated
// nodes ("a": ranks 0 and 1, "b": ranks 2 and 3), each node with its own directory: what a save
// leaves on each node, recovery after a node is lost, the fall-back to a durable checkpointer,
// and the faults (a file on no node, a flipped byte in a replica, a full directory while
// writing or replicating). Preemption's agreement is at the end. The same under mpirun, with
// real processes, is in tests/mpi/test_mpi.cpp; examples/peer_recovery kills a node for real.

#include "failing_storage.hpp"
#include "helpers.hpp"
#include "on_ranks.hpp"

#include <ckpt/ckpt.hpp>
#include <ckpt/in_process.hpp>
#include <ckpt/memory_tier.hpp>
#include <ckpt/preemption.hpp>

#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using test::mentions;

namespace {

using policy = ckpt::megatron<ckpt::in_process>;

/// A rank's share of a tp=2, dp=2 model: a weight split by rows, a replicated bias, Adam
/// moments in the optimizer group, and a per-rank RNG and step.
struct shard {
  std::vector<float> w, b, m;
  std::mt19937_64 rng;
  std::uint64_t step = 0;
  std::uint32_t tp = 0;

  shard(std::uint32_t rank, std::uint64_t seed) : w(8 * 16), b(16), m(8 * 16), rng(seed * 100 + rank), tp(rank % 2) {
    std::mt19937 g(static_cast<std::uint32_t>(seed * 10 + tp));  // tp peers share their slice
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto& x : w) x = u(g);
    for (auto& x : m) x = u(g);
    std::mt19937 gb(static_cast<std::uint32_t>(seed));
    for (auto& x : b) x = u(gb);
    step = seed;
  }
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", ckpt::view(w, {8, 16}).sharded({.global_shape = {16, 16}, .offset = {tp * 8, 0}}));
    v.tensor("b", ckpt::view(b, {16}).sharded(ckpt::shard_spec::replica()));
    v.group("optimizer", [&](auto& g) { g.tensor("m", ckpt::view(m, {8, 16}).sharded({.global_shape = {16, 16}, .offset = {tp * 8, 0}})); });
    v.value("rng", rng);
    v.value("step", step);
  }
  bool operator==(const shard& o) const { return w == o.w && b == o.b && m == o.m && rng == o.rng && step == o.step; }
};

struct big_weights {
  std::vector<float> w = std::vector<float>(1 << 20, 1.5f);
  template <class V>
  void checkpoint(V& v) { v.tensor("w", w); }
};

struct nodes {
  test::temp_dir root;
  std::string dir(std::uint32_t rank) const { return (root.path() / (rank < 2 ? "a" : "b")).string(); }
  std::string node(std::uint32_t rank) const { return rank < 2 ? "a" : "b"; }
  std::string durable() const { return (root.path() / "disk").string(); }
  void wipe(const std::string& n) const {
    fs::remove_all(root.path() / n);
    fs::create_directories(root.path() / n);
  }
};

ckpt::memory_tier_options opts_for(const nodes& n, std::uint32_t rank) { return {.keep = 2, .replicas = 1, .node = n.node(rank), .piece_bytes = 4096}; }

/// Saves iterations `steps` into the tier from all four ranks.
void save_steps(const nodes& n, std::vector<std::uint64_t> steps) {
  const auto errors = test::on_ranks(4, [&](ckpt::in_process comm, std::uint32_t r) {
    ckpt::memory_tier<policy> tier{{.tp = 2, .comm = comm}, ckpt::posix(n.dir(r)), opts_for(n, r)};
    for (auto s : steps) tier.save(s, shard(r, s));
  });
  for (const auto& e : errors) REQUIRE(e == "");
}



}  // namespace

TEST_CASE("memory_tier: each rank's file is on its node and on the other; the tag is committed on both") {
  nodes n;
  save_steps(n, {10, 20, 30});
  for (const char* node : {"a", "b"}) {
    const auto d = n.root.path() / node;
    CAPTURE(node);
    // keep = 2: the oldest tag is gone from both nodes
    CHECK_FALSE(fs::exists(d / "global_step10"));
    for (const char* tag : {"global_step20", "global_step30"}) {
      CHECK(fs::exists(d / tag / "metadata.json"));
      CHECK(fs::exists(d / tag / "chunk_map.bin"));
      for (const char* f : {"mp_rank_00", "mp_rank_01", "mp_rank_00_dp001", "mp_rank_01_dp001"})
        CHECK(fs::exists(d / tag / f / "model_optim_rng.ckpt"));
    }
    std::ifstream latest(d / "latest");
    std::string text((std::istreambuf_iterator<char>(latest)), {});
    CHECK(mentions(text, "global_step30"));
  }
  // Every node's directory is a checkpoint root of its own: a plain checkpointer loads it.
  const auto errors = test::on_ranks(4, [&](ckpt::in_process comm, std::uint32_t r) {
    ckpt::checkpointer<policy, ckpt::posix> cp{{.tp = 2, .comm = comm}, (n.root.path() / "b").string()};
    shard s(r, 0);
    CHECK(cp.load(s).iteration == 30);
    CHECK(s == shard(r, 30));
  });
  for (const auto& e : errors) CHECK(e == "");
}

TEST_CASE("memory_tier: the ranks of a lost node take their files from their peers' replicas, bit for bit") {
  for (const char* lost : {"b", "a"}) {  // "a" holds rank 0, which reads the metadata
    CAPTURE(lost);
    nodes n;
    save_steps(n, {10, 20});
    n.wipe(lost);
    std::vector<ckpt::load_result> results(4);
    std::vector<std::uint64_t> held(4);
    const auto errors = test::on_ranks(4, [&](ckpt::in_process comm, std::uint32_t r) {
      ckpt::memory_tier<policy> tier{{.tp = 2, .comm = comm}, ckpt::posix(n.dir(r)), opts_for(n, r)};
      shard s(r, 0);
      results[r] = tier.load(s);
      CHECK(s == shard(r, 20));
      held[r] = tier.bytes_held();
    });
    for (const auto& e : errors) REQUIRE(e == "");
    const auto& res = results[2];
    CHECK(res.tier == "memory");
    CHECK(res.iteration == 20);
    std::string all;
    for (const auto& line : res.recovery) all += line + "\n";
    CAPTURE(all);
    CHECK(mentions(all, "loaded global_step20 from memory"));
    CHECK(mentions(all, std::string("was lost on node '") + lost + "'"));
    CHECK(mentions(all, "took global_step20/mp_rank_0"));
    // The lost node holds its own ranks' files again (and the metadata): ready for the next loss.
    for (const char* f : {"mp_rank_00", "mp_rank_01", "mp_rank_00_dp001", "mp_rank_01_dp001"})
      if ((std::string(lost) == "a") == (std::string(f).find("dp") == std::string::npos))
        CHECK(fs::exists(n.root.path() / lost / "global_step20" / f / "model_optim_rng.ckpt"));
    CHECK(fs::exists(n.root.path() / lost / "global_step20" / "metadata.json"));
    CHECK(held[0] > 0);
  }
}

TEST_CASE("memory_tier: load_or falls back to the durable tier, and says why") {
  nodes n;
  save_steps(n, {10, 20});
  // The durable tier has step 15.
  auto errors = test::on_ranks(4, [&](ckpt::in_process comm, std::uint32_t r) {
    ckpt::checkpointer<policy, ckpt::posix> disk{{.tp = 2, .comm = comm}, n.durable()};
    disk.save(15, shard(r, 15));
  });
  for (const auto& e : errors) REQUIRE(e == "");

  const auto load_all = [&](std::vector<ckpt::load_result>& out, std::vector<shard>& states) {
    auto errs = test::on_ranks(4, [&](ckpt::in_process comm, std::uint32_t r) {
      ckpt::memory_tier<policy> tier{{.tp = 2, .comm = comm}, ckpt::posix(n.dir(r)), opts_for(n, r)};
      ckpt::checkpointer<policy, ckpt::posix> disk{{.tp = 2, .comm = ckpt::in_process(comm)}, n.durable()};
      out[r] = tier.load_or(disk, states[r]);
    });
    for (const auto& e : errs) REQUIRE(e == "");
  };
  std::vector<ckpt::load_result> res(4);
  std::vector<shard> st;
  for (std::uint32_t r = 0; r < 4; ++r) st.emplace_back(r, 0);

  SUBCASE("memory newer than disk: memory") {
    load_all(res, st);
    CHECK(res[0].tier == "memory");
    CHECK(res[0].iteration == 20);
    for (std::uint32_t r = 0; r < 4; ++r) CHECK(st[r] == shard(r, 20));
  }
  SUBCASE("a file of the newest tag is on no node: memory's next tag is older than disk's") {
    fs::remove(n.root.path() / "a/global_step20/mp_rank_01/model_optim_rng.ckpt");
    fs::remove(n.root.path() / "b/global_step20/mp_rank_01/model_optim_rng.ckpt");
    load_all(res, st);
    CHECK(res[1].tier == "durable");
    CHECK(res[1].iteration == 15);
    std::string all;
    for (const auto& line : res[1].recovery) all += line + "\n";
    CAPTURE(all);
    CHECK(mentions(all, "global_step20 cannot be restored: no node holds 'mp_rank_01/model_optim_rng.ckpt'"));
    CHECK(mentions(all, "its newest complete tag global_step10 is older than the durable tier's latest (iteration 15)"));
    for (std::uint32_t r = 0; r < 4; ++r) CHECK(st[r] == shard(r, 15));
  }
  SUBCASE("node b lost and a flipped byte in a's replica of its file: the durable tier, naming the file") {
    n.wipe("b");
    const auto replica = n.root.path() / "a/global_step20/mp_rank_00_dp001/model_optim_rng.ckpt";
    {
      std::fstream f(replica, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(4096);
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x10);
      f.seekp(4096);
      f.write(&c, 1);
    }
    load_all(res, st);
    CHECK(res[3].tier == "durable");
    CHECK(res[3].iteration == 15);
    std::string all;
    for (const auto& line : res[3].recovery) all += line + "\n";
    CAPTURE(all);
    CHECK(mentions(all, "global_step20 could not be restored"));
    CHECK(mentions(all, "mp_rank_00_dp001/model_optim_rng.ckpt"));
    CHECK(mentions(all, "loaded global_step15 from the durable tier"));
    for (std::uint32_t r = 0; r < 4; ++r) CHECK(st[r] == shard(r, 15));
  }
  SUBCASE("both nodes lost: the durable tier") {
    n.wipe("a");
    n.wipe("b");
    load_all(res, st);
    CHECK(res[0].tier == "durable");
    for (std::uint32_t r = 0; r < 4; ++r) CHECK(st[r] == shard(r, 15));
  }
}

TEST_CASE("memory_tier: a save that fails while writing or replicating commits nothing on any node") {
  using failing = test::failing_storage<ckpt::posix>;
  // Operation k of rank 2's directory fails with ENOSPC: while it prepares the tag, while it
  // writes its own file, while it stores the replica it receives from rank 0, and while it
  // publishes `latest` on node b (the commit's last step).
  const std::vector<std::pair<long, std::string>> faults = {
      {3, "open global_step20/.ckpt_tag"},
      {12, "write global_step20/mp_rank_00_dp001/model_optim_rng.ckpt"},
      {20, "replicating global_step20: injected fault: write global_step20/mp_rank_00/model_optim_rng.ckpt"},
      {40, "rename latest"}};
  for (const auto& fault : faults) {
    const long k = fault.first;
    const std::string& where = fault.second;
    CAPTURE(k);
    nodes n;
    save_steps(n, {10});
    std::vector<std::string> errors = test::on_ranks(4, [&](ckpt::in_process comm, std::uint32_t r) {
      failing store(ckpt::posix(n.dir(r)));
      ckpt::memory_tier<policy, failing> tier{{.tp = 2, .comm = comm}, store, opts_for(n, r)};
      if (r == 2) store.fail_at(k);
      tier.save(20, shard(r, 20));
    });
    // Every rank fails with rank 2's error.
    for (const auto& e : errors) {
      CHECK(mentions(e, "rank 2: "));
      CHECK(mentions(e, where));
    }
    // Failing before the commit leaves the tag uncommitted on every node. (Failing while node b
    // publishes, after every file and replica is in place and node a has committed, leaves a
    // complete tag committed on node a, as a checkpointer's save that fails while replacing
    // `latest` leaves its tag committed; the load below then restores it.)
    if (k < 40)
      for (const char* node : {"a", "b"}) CHECK_FALSE(fs::exists(n.root.path() / node / "global_step20/metadata.json"));
    // Whatever happened, the newest committed tag loads, after node b is lost too.
    n.wipe("b");
    auto load_errors = test::on_ranks(4, [&](ckpt::in_process comm, std::uint32_t r) {
      ckpt::memory_tier<policy> tier{{.tp = 2, .comm = comm}, ckpt::posix(n.dir(r)), opts_for(n, r)};
      shard s(r, 0);
      const auto res = tier.load(s);
      CHECK(s == shard(r, res.iteration));
      CHECK(res.iteration == (k < 40 ? 10u : 20u));
    });
    for (const auto& e : load_errors) CHECK(e == "");
  }
}

TEST_CASE("memory_tier: a rank that cannot read its file while replicating says why, and its receiver's error carries it") {
  using failing = test::failing_storage<ckpt::posix>;
  // Rank 2 sends its file to rank 0, which then reports first (the lowest failing rank). The
  // first operation of rank 2's that fails a read of its own file while it is replicated:
  bool found = false;
  for (long k = 10; k < 60 && !found; ++k) {
    nodes n;
    save_steps(n, {10});
    const auto errors = test::on_ranks(4, [&](ckpt::in_process comm, std::uint32_t r) {
      failing store(ckpt::posix(n.dir(r)));
      ckpt::memory_tier<policy, failing> tier{{.tp = 2, .comm = comm}, store, opts_for(n, r)};
      if (r == 2) store.fail_at(k, EIO);
      tier.save(20, shard(r, 20));
    });
    if (!mentions(errors[2], "injected fault: read global_step20/mp_rank_00_dp001")) continue;
    found = true;
    CAPTURE(k);
    for (const auto& e : errors) {
      CHECK(mentions(e, "rank 0: replicating global_step20: rank 2 could not send global_step20/mp_rank_00_dp001/model_optim_rng.ckpt: "));
      CHECK(mentions(e, "injected fault: read global_step20/mp_rank_00_dp001/model_optim_rng.ckpt: Input/output error"));
    }
    for (const char* node : {"a", "b"}) CHECK_FALSE(fs::exists(n.root.path() / node / "global_step20/metadata.json"));
  }
  CHECK(found);
}

TEST_CASE("memory_tier: too few nodes for the replicas asked is refused, on every rank") {
  test::temp_dir d;
  const auto errors = test::on_ranks(2, [&](ckpt::in_process comm, std::uint32_t) {
    ckpt::memory_tier<policy> tier{{.tp = 2, .comm = comm}, ckpt::posix(d.str()), {.replicas = 1, .node = "one"}};
  });
  for (const auto& e : errors) CHECK(mentions(e, "replicas=1 needs at least 2 nodes; this job has 1"));
}

TEST_CASE("preemption: a signal on any rank makes should_save true on every rank at the same step") {
  ckpt::preemption::install({SIGUSR1});
  ckpt::preemption::clear();
  test::temp_dir d;
  std::vector<std::vector<int>> saved(4);
  const auto errors = test::on_ranks(4, [&](ckpt::in_process comm, std::uint32_t r) {
    ckpt::checkpointer<policy, ckpt::posix> cp{{.tp = 2, .comm = comm}, d.str()};
    for (std::uint64_t step = 1; step <= 12; ++step) {
      // Rank 3 is signalled during step 7 (the flag is the process's: threads stand in for
      // ranks, so only rank 3 raises it, after the others have agreed on step 6).
      if (r == 3 && step == 7) std::raise(SIGUSR1);
      const bool save = cp.should_save(step, 5);
      if (save) {
        saved[r].push_back(static_cast<int>(step));
        cp.save(step, shard(r, step));
      }
      if (cp.preempted()) break;
    }
  });
  ckpt::preemption::clear();
  std::signal(SIGUSR1, SIG_DFL);
  for (const auto& e : errors) CHECK(e == "");
  for (std::uint32_t r = 0; r < 4; ++r) CHECK(saved[r] == std::vector<int>{5, 7});
}

TEST_CASE("preemption: a signal during a save does not disturb it; the next should_save says stop") {
  ckpt::preemption::install({SIGTERM});
  ckpt::preemption::clear();
  test::temp_dir d;
  ckpt::checkpointer<> cp{{}, d.str()};
  big_weights state;
  auto pending = cp.save_async(1, state);
  std::raise(SIGTERM);  // the handler only sets the flag
  pending.wait();
  CHECK(cp.latest() == "global_step1");
  CHECK(ckpt::preemption::signal_number() == SIGTERM);
  CHECK(cp.should_save(2));
  CHECK(cp.preempted());
  ckpt::preemption::clear();
  std::signal(SIGTERM, SIG_DFL);
}

TEST_CASE("held_commit: latest, metadata.json and chunk_map.bin are held back; the rest goes through; capabilities kept") {
  using namespace ckpt::detail;
  using held = held_commit<ckpt::posix>;
  static_assert(concurrent_reads<held> && lockable_root<held> && opens_readers<held> && has_read_depth<held>);
  static_assert(announces_reads<reader_of<held>::type>);
  static_assert(concurrent_reads<held_commit<ckpt::memory_storage>> && !lockable_root<held_commit<ckpt::memory_storage>> &&
                !has_read_depth<held_commit<ckpt::memory_storage>>);
  ckpt::memory_storage mem;
  held_commit<ckpt::memory_storage> store(mem);
  const auto put = [&](const std::string& key, const std::string& text) {
    auto w = store.create(key);
    w.write(std::as_bytes(std::span(text.data(), text.size())));
    w.sync();
    w.publish();
  };
  put("global_step1/.ckpt_tag", "marker");
  put("global_step1/mp_rank_00/model_optim_rng.ckpt", "shard");
  put("global_step1/chunk_map.bin", "map");
  put("global_step1/metadata.json", "{}");
  put("latest", "global_step1");
  CHECK(mem.keys() == std::vector<std::string>{"global_step1/.ckpt_tag", "global_step1/mp_rank_00/model_optim_rng.ckpt"});
  const auto h = store.take_held();
  REQUIRE(h.size() == 3);
  CHECK(h[0].key == "global_step1/chunk_map.bin");
  CHECK(h[1].key == "global_step1/metadata.json");
  CHECK(h[2].key == "latest");
  CHECK(std::string(reinterpret_cast<const char*>(h[2].bytes.data()), h[2].bytes.size()) == "global_step1");
  CHECK(store.take_held().empty());
  // An unpublished held writer holds nothing.
  { auto w = store.create("global_step2/metadata.json"); }
  CHECK(store.take_held().empty());
}
