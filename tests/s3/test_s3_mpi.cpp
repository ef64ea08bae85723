// Multi-process saves into a bucket under mpirun (run by harness.py around mpirun, so every
// rank sees the same s3rver): every rank uploads its own shard file, rank 0 commits, and the
// checkpoint loads at another layout; save_async; one rank's failed upload means no commit.

#include "../mpi/world.hpp"
#include "s3_test_env.hpp"

#include <doctest/doctest.h>
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <ckpt/ckpt.hpp>
#include <ckpt/mpi.hpp>
#include <ckpt/s3.hpp>

#include <string>
#include <vector>

using namespace s3test;

namespace {

/// A (rows x 1024) fp32 weight split by rows over tp ranks: 6 MiB a rank at the sizes below, so
/// every rank's shard file is a multipart upload. Also a replicated bias and a per-rank step.
struct tp_state {
  std::uint64_t rank, tp, rows;
  static constexpr std::uint64_t cols = 1024;
  std::vector<float> w, bias = std::vector<float>(cols);
  std::uint64_t step = 0;
  tp_state(int r, int n, std::uint64_t total_rows) : rank(static_cast<std::uint64_t>(r)), tp(static_cast<std::uint64_t>(n)), rows(total_rows) {
    for (std::uint64_t i = lo(); i < hi(); ++i)
      for (std::uint64_t j = 0; j < cols; ++j) w.push_back(static_cast<float>(i) + static_cast<float>(j) * 1e-3f);
    for (std::size_t j = 0; j < bias.size(); ++j) bias[j] = static_cast<float>(j);
  }
  std::uint64_t lo() const { return rows * rank / tp; }
  std::uint64_t hi() const { return rows * (rank + 1) / tp; }
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", ckpt::view(w.data(), {hi() - lo(), cols}).sharded({.global_shape = {rows, cols}, .offset = {lo(), 0}}));
    v.tensor("bias", ckpt::view(bias, {cols}).sharded(ckpt::shard_spec::replica()));
    v.value("step", step);
  }
};

using mega_s3 = ckpt::checkpointer<ckpt::megatron<ckpt::mpi>, ckpt::s3>;

std::uint64_t rows_for(int w) { return static_cast<std::uint64_t>(w) * 1536; }  // 6 MiB of fp32 a rank

}  // namespace

TEST_CASE("every rank uploads its own shard file; the checkpoint loads at tp=1 on every rank") {
  const int w = world_size(), r = world_rank();
  {
    mega_s3 cp{{.tp = static_cast<std::uint32_t>(w)}, ckpt::s3{options("mpi/save")}};
    tp_state s(r, w, rows_for(w));
    s.step = 7;
    cp.save(7, s);
  }
  ckpt::s3 raw{options("mpi/save")};
  const auto entries = raw.list("global_step7");
  for (int k = 0; k < w; ++k) {
    const auto dir = "mp_rank_" + std::string(k < 10 ? "0" : "") + std::to_string(k);
    CHECK(std::find(entries.begin(), entries.end(), dir) != entries.end());
    const auto file = "global_step7/" + dir + "/" + raw.list("global_step7/" + dir).at(0);
    CHECK(*raw.size(file) > (5u << 20));  // a multipart upload
  }
  // Every rank loads the whole tensor (tp=1: each rank a data-parallel replica).
  mega_s3 cp{{.tp = 1}, ckpt::s3{options("mpi/save")}};
  tp_state whole(0, 1, rows_for(w)), want(0, 1, rows_for(w));
  std::fill(whole.w.begin(), whole.w.end(), -1.f);
  const auto res = cp.load(whole, {.on_topology_change = ckpt::topology_change::from_rank_0});
  CHECK(res.iteration == 7);
  CHECK(whole.w == want.w);
  CHECK(whole.bias == want.bias);
  CHECK(whole.step == 7);
}

TEST_CASE("save_async into a bucket on every rank: the caller goes on, the commit follows") {
  const int w = world_size(), r = world_rank();
  mega_s3 cp{{.tp = static_cast<std::uint32_t>(w)}, ckpt::s3{options("mpi/async")}};
  tp_state s(r, w, rows_for(w));
  auto h = cp.save_async(1, s);
  const auto kept = s.w;
  std::fill(s.w.begin(), s.w.end(), 0.f);  // allowed as soon as save_async returns
  h.wait();
  CHECK(cp.latest() == "global_step1");
  tp_state back(r, w, rows_for(w));
  std::fill(back.w.begin(), back.w.end(), -1.f);
  cp.load(back);
  CHECK(back.w == kept);
}

TEST_CASE("one rank's upload refused: every rank fails, nothing is committed, the last tag loads") {
  const int w = world_size(), r = world_rank();
  mega_s3 cp{{.tp = static_cast<std::uint32_t>(w)}, ckpt::s3{options("mpi/fail", true)}};
  tp_state s(r, w, rows_for(w));
  cp.save(1, s);
  if (r == 0)
    control("POST", "/faults",
            R"({"rules": [{"match": {"path": "global_step2/mp_rank_01"}, "action": "status", "status": 403, "code": "AccessDenied", "times": -1}]})");
  MPI_Barrier(MPI_COMM_WORLD);
  std::string failure;
  try {
    cp.save(2, s);
  } catch (const ckpt::error& e) {
    failure = e.what();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (r == 0) control("DELETE", "/faults");
  CHECK(!failure.empty());
  if (r == 1) CHECK(mentions(failure, "AccessDenied"));
  CHECK(cp.latest() == "global_step1");
  tp_state back(r, w, rows_for(w));
  CHECK(cp.load(back).iteration == 1);
  ckpt::s3 raw{options("mpi/fail")};
  CHECK(!raw.size("global_step2/metadata.json"));
}
