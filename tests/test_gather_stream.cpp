// gather_to_root over a Transport: shards stream to rank 0 chunk by chunk while it writes, and
// rank 0 scatters them back at load. Ranks are threads of an in_process world (a Transport for
// host memory); the same code paths carry GPU tensors over ckpt::cuda::nccl.

#include "failing_storage.hpp"
#include "helpers.hpp"
#include "on_ranks.hpp"

#include <ckpt/in_process.hpp>
#include <ckpt/reader.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>

namespace fs = std::filesystem;

namespace {

using test::on_ranks;

using test::mentions;

/// The same world without the point-to-point calls: gather_to_root then packs each rank's state
/// into one gather, as it does over MPI.
struct packed_only {
  ckpt::in_process c;
  int rank() const { return c.rank(); }
  int size() const { return c.size(); }
  void barrier() { c.barrier(); }
  void broadcast(std::vector<std::byte>& b, int root) { c.broadcast(b, root); }
  std::vector<std::vector<std::byte>> all_gather(std::span<const std::byte> m) { return c.all_gather(m); }
  std::vector<std::vector<std::byte>> gather(std::span<const std::byte> m, int root) { return c.gather(m, root); }
  std::uint64_t all_reduce_max(std::uint64_t x) { return c.all_reduce_max(x); }
};
static_assert(ckpt::Transport<ckpt::in_process>);
static_assert(ckpt::Communicator<packed_only> && !ckpt::Transport<packed_only>);

/// A whole number from a salt that may be negative (a float's conversion to unsigned would not be).
std::uint64_t salt_bits(float salt) { return static_cast<std::uint64_t>(static_cast<std::int64_t>(salt * 4)); }

/// One rank's state: a weight split by rows (unevenly; at tp=3 rank 0 holds none of `e`), a
/// weight split by columns, a replicated bias, bf16 optimizer moments and a per-rank counter.
struct rank_state {
  std::uint32_t rank, tp;
  static constexpr std::uint64_t rows = 301, cols = 37, erows = 2;
  std::vector<float> w, c, b = std::vector<float>(9), e;
  std::vector<std::uint16_t> m;
  std::uint64_t seen;
  bool narrow_seen = false;  // declare `seen` as 4 bytes: a type the stored value does not load into
  std::uint32_t seen32 = 0;
  std::vector<float> on_gpu;  // when not empty: a tensor marked as GPU memory, which in_process cannot move

  rank_state(std::uint32_t r, std::uint32_t n, float salt) : rank(r), tp(n), seen(1000 + r + salt_bits(salt)) {
    for (std::uint64_t i = lo(rows); i < hi(rows); ++i)
      for (std::uint64_t j = 0; j < cols; ++j) w.push_back(salt + static_cast<float>(i * cols + j));
    for (std::uint64_t i = 0; i < cols; ++i)
      for (std::uint64_t j = lo(rows); j < hi(rows); ++j) c.push_back(salt - static_cast<float>(i * rows + j));
    for (std::size_t k = 0; k < b.size(); ++k) b[k] = salt + 0.25f * static_cast<float>(k);
    for (std::uint64_t i = lo(erows); i < hi(erows); ++i) e.push_back(salt * 3 + static_cast<float>(i));
    for (std::uint64_t i = lo(rows); i < hi(rows); ++i) m.push_back(static_cast<std::uint16_t>(i * 7 + salt_bits(salt)));
  }
  std::uint64_t lo(std::uint64_t n) const { return n * rank / tp; }
  std::uint64_t hi(std::uint64_t n) const { return n * (rank + 1) / tp; }
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", ckpt::view(w.data(), {hi(rows) - lo(rows), cols}).sharded({.global_shape = {rows, cols}, .offset = {lo(rows), 0}}));
    v.tensor("c", ckpt::view(c.data(), {cols, hi(rows) - lo(rows)}).sharded({.global_shape = {cols, rows}, .offset = {0, lo(rows)}}));
    v.tensor("b", ckpt::view(b, {9}).sharded(ckpt::shard_spec::replica()));
    v.tensor("e", ckpt::view(e.data(), {hi(erows) - lo(erows)}).sharded({.global_shape = {erows}, .offset = {lo(erows)}}));
    v.group("optimizer", [&](V& g) {
      g.tensor("m", ckpt::tensor_ref(ckpt::dtype::bf16, {hi(rows) - lo(rows)}, reinterpret_cast<std::byte*>(m.data()))
                        .sharded({.global_shape = {rows}, .offset = {lo(rows)}}));
    });
    if (narrow_seen)
      v.value("seen", seen32);
    else
      v.value("seen", seen);
    if (!on_gpu.empty())
      v.tensor("g", ckpt::tensor_ref(ckpt::dtype::f32, {on_gpu.size()}, on_gpu.data(), ckpt::device::cuda(0))
                        .sharded({.global_shape = {on_gpu.size()}, .offset = {0}}));  // all of it, on this rank
  }
  bool operator==(const rank_state& o) const { return w == o.w && c == o.c && b == o.b && e == o.e && m == o.m && seen == o.seen; }
};

template <class Comm>
using gather_cp = ckpt::checkpointer<ckpt::gather_to_root<Comm>, ckpt::posix>;

const ckpt::checkpointer_options small_chunks{.chunk_bytes = 1000};  // many chunks, many transfers

}  // namespace

TEST_CASE("gather_to_root over a Transport streams every shard to rank 0: the same file as one packed gather") {
  test::temp_dir streamed, packed;
  auto errors = on_ranks(3, [&](ckpt::in_process comm, std::uint32_t r) {
    gather_cp<ckpt::in_process> cp{{.comm = comm}, streamed.path(), small_chunks};
    rank_state s(r, 3, 1.5f);
    cp.save(7, s);
  });
  for (const auto& e : errors) CHECK(e == "");
  errors = on_ranks(3, [&](ckpt::in_process comm, std::uint32_t r) {
    gather_cp<packed_only> cp{{.comm = {comm}}, packed.path(), small_chunks};
    rank_state s(r, 3, 1.5f);
    cp.save(7, s);
  });
  for (const auto& e : errors) CHECK(e == "");
  const auto file = fs::path("global_step7") / "mp_rank_00" / "model_optim_rng.ckpt";
  const auto a = test::file_bytes(streamed.path() / file), b = test::file_bytes(packed.path() / file);
  CHECK(a.size() > 2 * rank_state::rows * rank_state::cols * 4);  // all of w and c, at least
  CHECK(a == b);  // byte for byte: streaming changes how bytes travel, not what is written

  // The consolidated file loads at any layout: here at tp=2 with megatron.
  errors = on_ranks(2, [&](ckpt::in_process comm, std::uint32_t r) {
    ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::posix> cp{{.tp = 2, .comm = comm}, streamed.path()};
    rank_state want(r, 2, 1.5f), got(r, 2, 0.0f);
    cp.load(got, {.on_topology_change = ckpt::topology_change::keep_live});
    got.seen = want.seen;  // per-rank values are not restored across layouts (keep_live)
    if (!(got == want)) throw std::runtime_error("rank " + std::to_string(r) + " loaded different bytes");
  });
  for (const auto& e : errors) CHECK(e == "");
}

TEST_CASE("gather_to_root over a Transport: rank 0 scatters the load, bit-exact, per-rank values rank for rank") {
  test::temp_dir dir;
  for (bool scatter : {true, false}) {
    CAPTURE(scatter);
    auto errors = on_ranks(4, [&](ckpt::in_process comm, std::uint32_t r) {
      gather_cp<ckpt::in_process> cp{{.comm = comm, .scatter_on_load = scatter}, dir.path(), small_chunks};
      rank_state saved(r, 4, 2.0f);
      cp.save(scatter ? 1 : 2, saved);
      rank_state got(r, 4, -9.0f);
      const auto res = cp.load(got);
      if (!(got == saved)) throw std::runtime_error("rank " + std::to_string(r) + " loaded different bytes");
      // With the scatter only rank 0 reads storage.
      if (scatter && r != 0 && res.bytes_read != 0) throw std::runtime_error("a receiving rank read storage");
      if (r == 0 && res.bytes_read == 0) throw std::runtime_error("rank 0 read nothing");
      // Optimizer left out: the others are told nothing about it and receive nothing for it.
      rank_state again(r, 4, -9.0f);
      cp.load(again, {.load_optimizer = false});
      if (again.w != saved.w || again.m != rank_state(r, 4, -9.0f).m) throw std::runtime_error("load_optimizer=false was ignored");
    });
    for (const auto& e : errors) CHECK(e == "");
  }
}

TEST_CASE("gather_to_root over a Transport: save_async returns once every rank's bytes reached rank 0") {
  test::temp_dir dir;
  auto errors = on_ranks(3, [&](ckpt::in_process comm, std::uint32_t r) {
    gather_cp<ckpt::in_process> cp{{.comm = comm}, dir.path(), small_chunks};
    rank_state s(r, 3, 4.0f);
    const rank_state saved = s;
    auto h = cp.save_async(3, s);
    s = rank_state(r, 3, 100.0f);  // training goes on at once
    h.wait();
    rank_state got(r, 3, 0.0f);
    cp.load(got);
    if (!(got == saved)) throw std::runtime_error("rank " + std::to_string(r) + ": the async save did not keep the snapshot");
    // Twice, so the snapshot buffers are reused with the other ranks' tensors in them.
    auto h2 = cp.save_async(4, s);
    h2.wait();
    cp.load(got);
    if (!(got == s)) throw std::runtime_error("rank " + std::to_string(r) + ": the second async save differs");
  });
  for (const auto& e : errors) CHECK(e == "");
}

TEST_CASE("gather_to_root over a Transport: rank 0's write failing part-way fails every rank, and the next save works") {
  test::temp_dir dir;
  using store = test::failing_storage<ckpt::posix>;
  store root_store{ckpt::posix(dir.path())};  // copies share the fault switch
  // Four chunks in flight at most: when the write fails, most chunks are still to be sent.
  const ckpt::checkpointer_options few_buffers{.chunk_bytes = 1000, .buffer_bytes = 4000};
  long ops = 0;
  std::vector<std::string> failures(3);
  std::string where;
  // One world for every save: what a failed save left in flight would reach the next one.
  auto errors = on_ranks(3, [&](ckpt::in_process comm, std::uint32_t r) {
    ckpt::checkpointer<ckpt::gather_to_root<ckpt::in_process>, store> cp{
        {.comm = comm}, r == 0 ? root_store : store{ckpt::posix(dir.path())}, few_buffers};
    cp.save(1, rank_state(r, 3, 1.0f));
    if (r == 0) {
      ops = root_store.operations();  // rank 0's storage operations in one save
      root_store.fail_at(ops / 2);    // in the middle of the chunks
    }
    comm.barrier();
    try {
      cp.save(2, rank_state(r, 3, 2.0f));
    } catch (const ckpt::error& e) {
      failures[r] = e.what();
    }
    if (r == 0) {
      where = root_store.last_failure();
      root_store.fail_at(-1);
    }
    comm.barrier();
    cp.save(3, rank_state(r, 3, 3.0f));
    rank_state got(r, 3, 0.0f);
    const auto res = cp.load(got);
    if (res.tag != "global_step3" || !(got == rank_state(r, 3, 3.0f))) throw std::runtime_error("wrong state after the failure");
  });
  for (const auto& e : errors) CHECK(e == "");
  CHECK(ops > 40);
  MESSAGE("rank 0 failed at " << where << ", operation " << ops / 2 << " of " << ops);
  CHECK(mentions(where, "model_optim_rng.ckpt"));
  for (const auto& e : failures) {
    CHECK(mentions(e, "rank 0: "));
    CHECK(mentions(e, "injected fault"));
  }
  CHECK_FALSE(fs::exists(dir.path() / "global_step2" / "metadata.json"));
}

TEST_CASE("gather_to_root over a Transport: a damaged chunk of one rank's slice fails every rank's load, and the next load works") {
  test::temp_dir dir;
  auto errors = on_ranks(3, [&](ckpt::in_process comm, std::uint32_t r) {
    gather_cp<ckpt::in_process> cp{{.comm = comm}, dir.path(), small_chunks};
    rank_state s(r, 3, 5.0f);
    cp.save(5, s);
    cp.save(6, s);
  });
  for (const auto& e : errors) CHECK(e == "");
  // Flip a byte of the last chunk of `m`: rows of rank 2 only, so rank 0's own load succeeds and
  // the failure comes while it serves rank 2.
  ckpt::reader rd{ckpt::posix(dir.path())};
  const auto chunks = rd.chunks("optimizer.m");
  REQUIRE(chunks.size() >= 3);
  auto last = chunks.front();
  for (const auto& c : chunks)
    if (c.offset[0] > last.offset[0]) last = c;
  REQUIRE(last.offset[0] >= 200);  // rank 2 holds rows [200, 301)
  {
    std::fstream f(dir.path() / "global_step6" / last.file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(last.file_offset + 3));
    char ch;
    f.get(ch);
    f.seekp(static_cast<std::streamoff>(last.file_offset + 3));
    f.put(static_cast<char>(ch ^ 0x10));
  }
  errors = on_ranks(3, [&](ckpt::in_process comm, std::uint32_t r) {
    gather_cp<ckpt::in_process> cp{{.comm = comm}, dir.path(), small_chunks};
    rank_state got(r, 3, 0.0f);
    try {
      cp.load(got);
    } catch (const ckpt::error& e) {
      if (!mentions(e.what(), "rank 0: ") || !mentions(e.what(), "checksum mismatch") || !mentions(e.what(), "optimizer.m"))
        throw std::runtime_error(std::string("unexpected error: ") + e.what());
      // The ranks can still talk: the previous tag loads.
      cp.load(got, {.tag = "global_step5"});
      if (!(got == rank_state(r, 3, 5.0f))) throw std::runtime_error("the good tag loaded wrong");
      return;
    }
    throw std::runtime_error("the damaged chunk went unnoticed");
  });
  for (const auto& e : errors) CHECK(e == "");
}

namespace {
/// A "GPU" DevicePolicy for tensors marked as GPU memory (here plain host memory), which
/// in_process cannot move: they are staged through it. `lost` makes staging fail.
struct lenient_device : ckpt::host_copy {
  bool lost = false;
  bool accepts(ckpt::device) const noexcept { return true; }
  void to_host(const ckpt::tensor_ref& t, std::uint64_t offset, std::span<std::byte> dst) const {
    if (lost && t.where().type == ckpt::device::kind::cuda) throw ckpt::error(ckpt::error_kind::io, "lenient_device: the GPU is gone");
    ckpt::host_copy::to_host(t, offset, dst);
  }
};
using lenient_cp = ckpt::checkpointer<ckpt::gather_to_root<ckpt::in_process>, ckpt::posix, ckpt::raw, lenient_device>;
}  // namespace

TEST_CASE("gather_to_root over a Transport: tensors it cannot move are staged through the DevicePolicy; a failure there fails every rank") {
  test::temp_dir dir;
  auto errors = on_ranks(3, [&](ckpt::in_process comm, std::uint32_t r) {
    {
      lenient_cp cp{{.comm = comm}, dir.path(), small_chunks, {}, lenient_device{}};
      rank_state s(r, 3, 1.0f);
      if (r == 1)
        for (int i = 0; i < 5000; ++i) s.on_gpu.push_back(static_cast<float>(i) * 0.5f);  // 5 chunks
      cp.save(1, s);
      rank_state got(r, 3, 0.0f);
      if (r == 1) got.on_gpu.assign(5000, -1.0f);
      cp.load(got);  // rank 1 receives `g` as host bytes and its DevicePolicy puts them in place
      if (!(got == s) || got.on_gpu != s.on_gpu) throw std::runtime_error("rank " + std::to_string(r) + ": wrong state");
    }
    lenient_cp cp{{.comm = comm}, dir.path(), small_chunks, {}, lenient_device{{}, r == 1}};
    rank_state s(r, 3, 2.0f);
    if (r == 1) s.on_gpu.assign(5000, 2.0f);
    std::string failed;
    try {
      cp.save(2, s);
    } catch (const ckpt::error& e) {
      failed = e.what();
    }
    if (!mentions(failed, "rank 1: lenient_device: the GPU is gone")) throw std::runtime_error("save 2: " + failed);
    rank_state ok(r, 3, 3.0f);
    cp.save(3, ok);  // nothing of the failed save is left in flight
    rank_state got(r, 3, 0.0f);
    cp.load(got);
    if (!(got == ok)) throw std::runtime_error("wrong state after the failed save");
  });
  for (const auto& e : errors) CHECK(e == "");
  CHECK_FALSE(fs::exists(dir.path() / "global_step2" / "metadata.json"));
}

TEST_CASE("gather_to_root over a Transport: a value one rank cannot load fails every rank's scattered load, and the same world loads again") {
  test::temp_dir dir;
  auto errors = on_ranks(3, [&](ckpt::in_process comm, std::uint32_t r) {
    gather_cp<ckpt::in_process> cp{{.comm = comm}, dir.path(), small_chunks};
    const rank_state saved(r, 3, 3.0f);
    cp.save(3, saved);
    rank_state got(r, 3, 0.0f);
    got.narrow_seen = r == 2;  // rank 2's `seen` changed type since the save
    std::string failed;
    try {
      cp.load(got);
    } catch (const ckpt::error& e) {
      failed = e.what();
    }
    if (!mentions(failed, "rank 2: ") || !mentions(failed, "value 'seen' received from rank 0"))
      throw std::runtime_error("load 1: " + failed);
    rank_state again(r, 3, 0.0f);
    cp.load(again);  // every transfer of the failed load was received: the world is in step
    if (!(again == saved)) throw std::runtime_error("wrong state after the failed load");
  });
  for (const auto& e : errors) CHECK(e == "");
}
