// Multi-process checkpoints under mpirun: megatron layouts saved at one (tp, pp, dp) and loaded
// at another, bit for bit; replicas stored once; agreement, failure and coverage checks;
// gather_to_root. Each test runs on every rank in the same order.

#include <doctest/doctest.h>
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <ckpt/ckpt.hpp>
#include <ckpt/detail/chunk_details.hpp>
#include <ckpt/memory_tier.hpp>
#include <ckpt/mpi.hpp>
#include <ckpt/preemption.hpp>

#include "../failing_storage.hpp"
#include "world.hpp"

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>

namespace fs = std::filesystem;

namespace {

/// A directory every rank sees, removed at scope exit.
struct shared_dir {
  fs::path path;
  shared_dir() {
    char buf[256] = {};
    if (world_rank() == 0) {
      std::strcpy(buf, "/tmp/ckpt-mpi-XXXXXX");
      if (!::mkdtemp(buf)) throw std::runtime_error("mkdtemp");
    }
    MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
    path = buf;
  }
  ~shared_dir() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) fs::remove_all(path);
  }
};

/// [start, start + len) of part i of an extent split into n parts, the first ones larger.
std::pair<std::uint64_t, std::uint64_t> part(std::uint64_t extent, std::uint32_t n, std::uint32_t i) {
  const auto base = extent / n, extra = extent % n;
  return {i * base + std::min<std::uint64_t>(i, extra), base + (i < extra ? 1 : 0)};
}

/// The value every element of every global tensor must have: a function of the name and the
/// element's global index, exact in every dtype used here.
double expected(const std::string& name, std::uint64_t flat) {
  return static_cast<double>(ckpt::detail::xxh3(name) % 97) + static_cast<double>(flat % 251) * 0.5;
}

struct layout {
  std::uint32_t tp = 1, pp = 1, dp = 1;
};

/// A transformer-like model slice for one rank of a megatron layout: per layer a column-
/// parallel weight (split along dim 0, 25 rows so tp=3 and tp=4 split unevenly), a row-parallel
/// one (split along dim 1), a replicated norm, an int tensor split along its middle dimension,
/// and Adam moments sharded like the weights; stage 0 also holds a bf16 embedding.
struct model_slice {
  struct tensor {
    std::string name;
    ckpt::dtype type;
    ckpt::shape_t global, offset, shape;
    bool replicated = false;
    bool optimizer = false;
    std::vector<std::byte> bytes;
  };
  std::vector<tensor> tensors;
  std::mt19937 rng;
  std::int64_t step = 0;

  static constexpr int layers = 4;

  model_slice(layout l, ckpt::parallel_rank c, int rank) : rng(1000u + static_cast<unsigned>(rank)) {
    auto add = [&](std::string name, ckpt::dtype t, ckpt::shape_t global, int split_dim, bool opt = false) {
      tensor x{std::move(name), t, global, ckpt::shape_t(global.size(), 0), global, split_dim < 0, opt, {}};
      if (split_dim >= 0) {
        auto [start, len] = part(global[static_cast<std::size_t>(split_dim)], l.tp, c.tp);
        x.offset[static_cast<std::size_t>(split_dim)] = start;
        x.shape[static_cast<std::size_t>(split_dim)] = len;
      }
      x.bytes.resize(ckpt::detail::element_count(x.shape, x.name) * ckpt::size_of(t));
      tensors.push_back(std::move(x));
    };
    const auto [first, count] = part(layers, l.pp, c.pp);
    for (auto i = first; i < first + count; ++i) {
      const auto p = "layers." + std::to_string(i) + ".";
      add(p + "qkv.weight", ckpt::dtype::f32, {25, 16}, 0);
      add(p + "proj.weight", ckpt::dtype::f32, {16, 25}, 1);
      add(p + "norm", ckpt::dtype::f32, {16}, -1);
      add(p + "cube", ckpt::dtype::i32, {4, 9, 5}, 1);
      add(p + "qkv.exp_avg", ckpt::dtype::f32, {25, 16}, 0, true);
    }
    if (c.pp == 0) add("embed", ckpt::dtype::bf16, {11, 8}, 0);
  }

  template <class F>
  void for_each_element(const tensor& t, F&& f) const {
    const auto n = ckpt::detail::element_count(t.shape, t.name);
    for (std::uint64_t i = 0; i < n; ++i) {
      std::uint64_t rest = i, flat = 0, stride = 1;
      ckpt::shape_t idx(t.shape.size());
      for (std::size_t d = t.shape.size(); d > 0; --d) {
        idx[d - 1] = t.offset[d - 1] + rest % t.shape[d - 1];
        rest /= t.shape[d - 1];
      }
      for (std::size_t d = t.shape.size(); d > 0; --d) {
        flat += idx[d - 1] * stride;
        stride *= t.global[d - 1];
      }
      f(i, flat);
    }
  }

  void fill() {
    for (auto& t : tensors)
      for_each_element(t, [&](std::uint64_t i, std::uint64_t flat) { set(t, i, expected(t.name, flat)); });
  }
  /// Number of elements that differ from the expected global values.
  std::uint64_t wrong() const {
    std::uint64_t bad = 0;
    for (const auto& t : tensors)
      for_each_element(t, [&](std::uint64_t i, std::uint64_t flat) {
        if (ckpt::element_as_double(t.bytes.data(), t.type, i) != expected(t.name, flat)) ++bad;
      });
    return bad;
  }
  static void set(tensor& t, std::uint64_t i, double v) {
    if (t.type == ckpt::dtype::f32) {
      const float f = static_cast<float>(v);
      std::memcpy(t.bytes.data() + i * 4, &f, 4);
    } else if (t.type == ckpt::dtype::i32) {
      const auto x = static_cast<std::int32_t>(v * 2);  // exact: v is a multiple of 0.5
      std::memcpy(t.bytes.data() + i * 4, &x, 4);
    } else {
      const ckpt::bfloat16 b(static_cast<float>(v));
      std::memcpy(t.bytes.data() + i * 2, &b.bits, 2);
    }
  }

  ckpt::tensor_ref ref(tensor& t) {
    ckpt::tensor_ref r(t.type, t.shape, t.bytes.data());
    if (t.replicated) return std::move(r).sharded(ckpt::shard_spec::replica());
    return std::move(r).sharded({.global_shape = t.global, .offset = t.offset});
  }

  void checkpoint(ckpt::visitor& v) {
    for (auto& t : tensors)
      if (!t.optimizer) v.tensor(t.name, ref(t));
    v.group("optimizer", [&](ckpt::visitor& g) {
      for (auto& t : tensors)
        if (t.optimizer) g.tensor(t.name, ref(t));
    });
    v.value("rng", rng);
    v.value("step", step);
  }
};

// i32 tensors hold 2 * expected (set() above); compare accordingly.
std::uint64_t wrong_elements(const model_slice& m) {
  std::uint64_t bad = 0;
  for (const auto& t : m.tensors)
    m.for_each_element(t, [&](std::uint64_t i, std::uint64_t flat) {
      const double want = expected(t.name, flat) * (t.type == ckpt::dtype::i32 ? 2 : 1);
      const double got = ckpt::element_as_double(t.bytes.data(), t.type, i);
      const double w = t.type == ckpt::dtype::bf16 ? static_cast<float>(ckpt::bfloat16(static_cast<float>(want))) : want;
      if (got != w) ++bad;
    });
  return bad;
}

/// A communicator of the first `n` ranks of the world (others get MPI_COMM_NULL).
MPI_Comm first_ranks(int n) {
  MPI_Comm c;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < n ? 0 : MPI_UNDEFINED, world_rank(), &c);
  return c;
}

using mega = ckpt::checkpointer<ckpt::megatron<ckpt::mpi>, ckpt::posix>;

/// The most rank `rank`, holding `m`'s slices, may read of the shard file `p`: the chunks that
/// overlap its slices, its own values and rank 0's (restored on another layout), and, if it
/// reads any of them, the file's header, trailer and footer index. Taken from the file itself.
std::uint64_t most_read(const fs::path& p, const model_slice& m, std::uint32_t rank) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  namespace d = ckpt::detail;
  const auto t = d::check_trailer(std::span<const std::byte, d::trailer_bytes>(b.data() + b.size() - d::trailer_bytes, d::trailer_bytes),
                                  b.size(), p.string());
  const auto idx = d::decode_index(std::span<const std::byte>(b).subspan(t.index_offset, t.index_size), p.string());
  std::uint64_t wanted = 0;
  for (const auto& g : idx.tensors) {
    const auto mine = std::find_if(m.tensors.begin(), m.tensors.end(), [&](const auto& x) {
      return (x.optimizer ? "optimizer." + x.name : x.name) == g.name;  // optimizer tensors are in that group
    });
    if (mine == m.tensors.end()) continue;
    for (std::size_t i = 0; i < g.chunks.size(); ++i) {
      const auto off = g.chunks.offset(i), shp = g.chunks.shape(i);
      bool overlaps = true;
      for (std::size_t k = 0; k < off.size(); ++k)
        overlaps = overlaps && off[k] < mine->offset[k] + mine->shape[k] && mine->offset[k] < off[k] + shp[k];
      if (overlaps) wanted += g.chunks.stored_size[i];
    }
  }
  for (const auto& v : idx.values)
    if (v.rank == rank || v.rank == 0) wanted += v.size;
  return wanted == 0 ? 0 : d::header_used + d::trailer_bytes + t.index_size + wanted;
}

/// Saves a model at `saved` on the first tp*pp*dp ranks, then loads it at `loaded` on the
/// first tp*pp*dp ranks, checking every element and that each rank read only part of the data.
void reshard(layout saved, layout loaded, std::uint64_t chunk = 512) {
  CAPTURE(saved.tp);
  CAPTURE(saved.pp);
  CAPTURE(saved.dp);
  CAPTURE(loaded.tp);
  CAPTURE(loaded.pp);
  CAPTURE(loaded.dp);
  shared_dir dir;
  const int n_save = static_cast<int>(saved.tp * saved.pp * saved.dp);
  const int n_load = static_cast<int>(loaded.tp * loaded.pp * loaded.dp);
  REQUIRE(n_save <= world_size());
  REQUIRE(n_load <= world_size());
  if (MPI_Comm c = first_ranks(n_save); c != MPI_COMM_NULL) {
    mega cp{{.tp = saved.tp, .pp = saved.pp, .dp = saved.dp, .comm = ckpt::mpi(c)}, dir.path, {.chunk_bytes = chunk}};
    model_slice m(saved, cp.policy().coordinates(), world_rank());
    m.fill();
    m.step = 42;
    cp.save(42, m);
    MPI_Comm_free(&c);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (MPI_Comm c = first_ranks(n_load); c != MPI_COMM_NULL) {
    mega cp{{.tp = loaded.tp, .pp = loaded.pp, .dp = loaded.dp, .comm = ckpt::mpi(c)}, dir.path, {.chunk_bytes = chunk}};
    model_slice m(loaded, cp.policy().coordinates(), world_rank());
    const bool same = saved.tp == loaded.tp && saved.pp == loaded.pp && saved.dp == loaded.dp;
    const auto r = cp.load(m, {.on_topology_change = ckpt::topology_change::from_rank_0});
    CHECK(r.iteration == 42);
    CHECK(wrong_elements(m) == 0);
    CHECK(m.step == 42);
    CHECK(m.rng == std::mt19937(1000u + static_cast<unsigned>(same ? world_rank() : 0)));
    // Partial reads: a rank reads the chunks overlapping its slices, not whole files.
    std::uint64_t total = 0, most = 0;
    for (const auto& e : fs::recursive_directory_iterator(dir.path))
      if (e.path().filename() == "model_optim_rng.ckpt") {
        total += fs::file_size(e.path());
        most += most_read(e.path(), m, static_cast<std::uint32_t>(world_rank()));
      }
    CHECK(r.bytes_read < total);
    CHECK(r.bytes_read <= most);
    MPI_Comm_free(&c);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace

TEST_CASE("tensor-parallel checkpoints load bit-exactly at other tp sizes, uneven ones included") {
  const auto w = static_cast<std::uint32_t>(world_size());
  reshard({.tp = w}, {.tp = w});
  reshard({.tp = w}, {.tp = 1});
  reshard({.tp = 1}, {.tp = w});
  if (w >= 4) {
    reshard({.tp = 4}, {.tp = 2, .dp = 2});
    reshard({.tp = 4}, {.tp = 3});  // uneven: 25 rows as 9 + 8 + 8
    reshard({.tp = 3}, {.tp = 4});
    reshard({.tp = 4}, {.tp = 2});
  }
}

TEST_CASE("pipeline and data-parallel layouts reshard too") {
  const auto w = static_cast<std::uint32_t>(world_size());
  reshard({.tp = 1, .pp = 2, .dp = w / 2}, {.tp = 1, .pp = 1, .dp = w});
  reshard({.tp = 1, .pp = 1, .dp = 2}, {.tp = 1, .pp = 1, .dp = w});  // dp=2 -> dp=4
  if (w >= 4) {
    reshard({.tp = 2, .pp = 2}, {.tp = 4, .pp = 1});
    reshard({.tp = 2, .pp = 2}, {.tp = 1, .pp = 4});
  }
}

TEST_CASE("replicated tensors and data-parallel replicas are stored once, written by several ranks") {
  const auto w = static_cast<std::uint32_t>(world_size());
  shared_dir dir;
  const layout l{.tp = w >= 4 ? 2u : 1u, .pp = 1, .dp = w >= 4 ? 2u : w};
  mega cp{{.tp = l.tp, .dp = l.dp}, dir.path};
  model_slice m(l, cp.policy().coordinates(), world_rank());
  m.fill();
  cp.save(1, m);
  if (world_rank() == 0) {
    auto read = [&](const char* name) {
      std::ifstream f(dir.path / "global_step1" / name, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(f), {});
    };
    auto md = ckpt::detail::decode_metadata(read("metadata.json"), "metadata.json");
    const auto map = read("chunk_map.bin");
    ckpt::detail::decode_chunk_map(std::as_bytes(std::span(map.data(), map.size())), md, "chunk_map.bin");
    (void)ckpt::detail::read_all_chunk_details(ckpt::posix(dir.path), md);  // format 2: from the footers
    std::map<std::uint32_t, std::uint64_t> bytes_per_file;
    for (const auto& t : md.tensors) {
      std::uint64_t stored = 0;
      for (std::size_t i = 0; i < t.chunks.size(); ++i) {
        const auto raw = t.chunks.elements(i) * ckpt::size_of(t.type);
        stored += raw;
        bytes_per_file[t.chunks.file[i]] += raw;
      }
      CAPTURE(t.name);
      CHECK(stored == ckpt::detail::element_count(t.shape, t.name) * ckpt::size_of(t.type));  // each byte once
    }
    CHECK(md.files.size() == w);  // every rank wrote its file (values are per rank)
    CHECK(bytes_per_file.size() == w);  // and every rank wrote tensor bytes: nobody writes everything
    for (const auto& [f, b] : bytes_per_file) CHECK(b > 0);
  }
}

TEST_CASE("ranks that disagree on the tag get the same error and nothing is committed") {
  shared_dir dir;
  const auto w = static_cast<std::uint32_t>(world_size());
  mega cp{{.tp = w}, dir.path};
  model_slice m({.tp = w}, cp.policy().coordinates(), world_rank());
  m.fill();
  cp.save(1, m);
  std::string message;
  try {
    cp.save(world_rank() == static_cast<int>(w) - 1 ? 3 : 2, m);
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::error_kind::invalid_argument);
    message = e.what();
  }
  CHECK(message.find("ranks disagree") != std::string::npos);
  // Every rank got the same message.
  std::vector<char> all(message.size() * w + 1);
  unsigned len = static_cast<unsigned>(message.size()), max_len = 0;
  MPI_Allreduce(&len, &max_len, 1, MPI_UNSIGNED, MPI_MAX, MPI_COMM_WORLD);
  CHECK(len == max_len);
  CHECK(cp.latest() == "global_step1");
  CHECK_FALSE(fs::exists(dir.path / "global_step2" / "metadata.json"));
}

TEST_CASE("another writer holding the root stops the save on every rank, and nothing is committed") {
  shared_dir dir;
  const auto w = static_cast<std::uint32_t>(world_size());
  // Another job's rank 0, already saving there. (Held by pointer: GCC 12 at -O1 takes an
  // optional<writer_lock>'s payload for uninitialized in its destructor, a false positive.)
  std::unique_ptr<ckpt::posix::writer_lock> other;
  if (world_rank() == 0) other = std::make_unique<ckpt::posix::writer_lock>(ckpt::posix(dir.path).lock_writer(false));
  mega cp{{.tp = w}, dir.path};
  model_slice m({.tp = w}, cp.policy().coordinates(), world_rank());
  m.fill();
  std::string message;
  try {
    cp.save(1, m);
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::error_kind::busy);
    message = e.what();
  }
  CHECK(message.find("rank 0: another writer is saving to") != std::string::npos);
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK_FALSE(cp.latest());
  CHECK_FALSE(fs::exists(dir.path / "global_step1"));
  other.reset();  // the other job ends: this one saves
  cp.save(2, m);
  CHECK(cp.latest() == "global_step2");
}

TEST_CASE("one rank failing its write means no rank commits and the old checkpoint loads") {
  shared_dir dir;
  const auto w = static_cast<std::uint32_t>(world_size());
  using faulty = test::failing_storage<ckpt::posix>;
  faulty store{ckpt::posix(dir.path)};
  ckpt::checkpointer<ckpt::megatron<ckpt::mpi>, faulty> cp{{.tp = w}, store};
  model_slice m({.tp = w}, cp.policy().coordinates(), world_rank());
  m.fill();
  cp.save(1, m);
  // The last rank's storage fails its 3rd operation of the next save (inside its shard write).
  store.fail_at(world_rank() == static_cast<int>(w) - 1 ? 3 : -1, EIO);
  bool failed = false;
  try {
    cp.save(2, m);
  } catch (const ckpt::error& e) {
    failed = true;
    CHECK(std::string(e.what()).find("rank " + std::to_string(w - 1)) != std::string::npos);
    CHECK(std::string(e.what()).find("injected fault") != std::string::npos);
  }
  CHECK(failed);
  store.fail_at(-1);
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(cp.latest() == "global_step1");
  CHECK_FALSE(fs::exists(dir.path / "global_step2" / "metadata.json"));
  model_slice back({.tp = w}, cp.policy().coordinates(), world_rank());
  CHECK(cp.load(back).iteration == 1);
  CHECK(wrong_elements(back) == 0);
}

TEST_CASE("save_async on every rank: snapshot, background commit, and the next save waits for it") {
  shared_dir dir;
  const auto w = static_cast<std::uint32_t>(world_size());
  ckpt::checkpointer<ckpt::megatron<ckpt::mpi>> cp{{.tp = w}, ckpt::posix(dir.path), {.chunk_bytes = 256}};
  REQUIRE(cp.policy().communicator().thread_safe());
  model_slice m({.tp = w}, cp.policy().coordinates(), world_rank());
  m.fill();
  auto pending = cp.save_async(5, m);
  for (auto& t : m.tensors) std::fill(t.bytes.begin(), t.bytes.end(), std::byte{0xff});  // training goes on
  MPI_Barrier(MPI_COMM_WORLD);  // the application's own MPI calls run alongside the save
  pending.wait();
  CHECK(cp.latest() == "global_step5");
  (void)cp.save_async(6, m);  // never waited for: load finishes it first
  model_slice back({.tp = w}, cp.policy().coordinates(), world_rank());
  CHECK(cp.load(back, {.iteration = 5}).iteration == 5);
  CHECK(wrong_elements(back) == 0);
  CHECK(cp.latest() == "global_step6");
}

TEST_CASE("the commit finds a gap or an overlap between ranks' shards and names the region") {
  shared_dir dir;
  const auto w = static_cast<std::uint32_t>(world_size());
  mega cp{{.tp = w}, dir.path};
  for (int mode = 0; mode < 2; ++mode) {
    // Every rank claims rows [r*2, r*2+2) of a (2w+1)-row tensor (a gap at the end), or rows
    // [r, r+2) (overlaps).
    std::vector<float> rows(2 * 3);
    struct bad_state {
      std::vector<float>* d;
      std::uint64_t offset, rows;
      void checkpoint(ckpt::visitor& v) {
        v.tensor("w", ckpt::view(d->data(), {2, 3}).sharded({.global_shape = {rows, 3}, .offset = {offset, 0}}));
      }
    } s{&rows, mode == 0 ? 2u * static_cast<unsigned>(world_rank()) : static_cast<unsigned>(world_rank()),
        mode == 0 ? 2u * w + 1 : w + 1};
    std::string msg;
    try {
      cp.save(static_cast<std::uint64_t>(mode) + 1, s);
    } catch (const ckpt::error& e) {
      msg = e.what();
    }
    CAPTURE(msg);
    if (mode == 0) CHECK(msg.find("tensor 'w': region [" + std::to_string(2 * w) + ":" + std::to_string(2 * w + 1) +
                                  ", 0:3] of global shape [" + std::to_string(2 * w + 1) + ", 3] is not stored") !=
                         std::string::npos);
    else CHECK(msg.find("tensor 'w': region [1:2, 0:3] is stored twice") != std::string::npos);
    CHECK_FALSE(cp.latest());
  }
}

TEST_CASE("a replicated tensor its chosen writer does not declare is caught at commit, not lost") {
  shared_dir dir;
  const auto w = static_cast<std::uint32_t>(world_size());
  mega cp{{.tp = w}, dir.path};
  std::vector<float> bias(4, 1.f);
  // Declared only on the ranks the policy does not choose as its writer.
  const bool chosen = cp.policy().writes("lonely", ckpt::view(bias.data(), {4}).sharded(ckpt::shard_spec::replica()));
  struct state {
    std::vector<float>* b;
    bool declare;
    void checkpoint(ckpt::visitor& v) {
      if (declare) v.tensor("lonely", ckpt::view(b->data(), {4}).sharded(ckpt::shard_spec::replica()));
    }
  } s{&bias, !chosen};
  std::string msg;
  try {
    cp.save(1, s);
  } catch (const ckpt::error& e) {
    msg = e.what();
  }
  CAPTURE(msg);
  CHECK(msg.find("tensor 'lonely' is held by rank") != std::string::npos);
  CHECK(msg.find("but no rank wrote it") != std::string::npos);
  CHECK_FALSE(cp.latest());
}

TEST_CASE("gather_to_root writes one file that loads at any layout") {
  shared_dir dir;
  const auto w = static_cast<std::uint32_t>(world_size());
  {
    ckpt::checkpointer<ckpt::gather_to_root<ckpt::mpi>, ckpt::posix> cp{{}, dir.path};
    ckpt::megatron<ckpt::mpi> coords{.tp = w};
    model_slice m({.tp = w}, coords.coordinates(), world_rank());
    m.fill();
    m.step = 7;
    cp.save(7, m);
    std::set<std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(dir.path / "global_step7"))
      if (e.is_regular_file()) files.insert(fs::relative(e.path(), dir.path / "global_step7").string());
    CHECK(files == std::set<std::string>{".ckpt_tag", "chunk_map.bin", "metadata.json", "mp_rank_00/model_optim_rng.ckpt"});
    // Same layout: values rank-for-rank.
    model_slice back({.tp = w}, coords.coordinates(), world_rank());
    const auto loaded = cp.load(back);
    CHECK(wrong_elements(back) == 0);
    // ckpt::mpi is a Transport: the shards streamed to rank 0, and the load is scattered from it.
    static_assert(ckpt::Transport<ckpt::mpi>);
    if (w > 1) CHECK((world_rank() == 0) == (loaded.bytes_read > 0));
    CHECK(back.rng == std::mt19937(1000u + static_cast<unsigned>(world_rank())));
  }
  // Another layout, through megatron.
  mega cp{{.tp = 1}, dir.path};
  model_slice whole({.tp = 1}, cp.policy().coordinates(), world_rank());
  std::string msg;
  try {
    cp.load(whole);
  } catch (const ckpt::error& e) {
    msg = e.what();
  }
  CHECK(msg.find("per-rank values") != std::string::npos);  // the default refuses to mix RNG streams
  const auto r = cp.load(whole, {.on_topology_change = ckpt::topology_change::keep_live});
  CHECK(wrong_elements(whole) == 0);
  CHECK(r.kept_live == std::vector<std::string>{"rng", "step"});
  CHECK(whole.step == 0);
}

// ---------------------------------------------------------------------------------------------
// The memory tier and preemption, with real processes: the world's halves stand for two nodes,
// each with its own memory directory (one rank per node at np=2).
// ---------------------------------------------------------------------------------------------

namespace {

/// A rank's state: a slice of a tp-sharded weight, its moment, a per-rank RNG and the step.
struct tier_state {
  std::vector<double> w, m;
  std::mt19937_64 rng;
  std::uint64_t step = 0;
  std::uint32_t tp = 0, world = 1;

  tier_state(std::uint32_t rank, std::uint32_t tp_size, std::uint64_t seed)
      : w(64 * 32), m(64 * 32), rng(seed * 1000 + rank), step(seed), tp(rank % tp_size), world(tp_size) {
    for (std::size_t i = 0; i < w.size(); ++i) {
      w[i] = static_cast<double>(seed) + 0.25 * static_cast<double>(i) + tp * 1e4;
      m[i] = -w[i];
    }
  }
  template <class V>
  void checkpoint(V& v) {
    const ckpt::shard_spec s{.global_shape = {64 * world, 32}, .offset = {64 * tp, 0}};
    v.tensor("w", ckpt::view(w, {64, 32}).sharded(s));
    v.group("optimizer", [&](auto& g) { g.tensor("m", ckpt::view(m, {64, 32}).sharded(s)); });
    v.value("rng", rng);
    v.value("step", step);
  }
  bool operator==(const tier_state& o) const { return w == o.w && m == o.m && rng == o.rng && step == o.step; }
};

std::string node_name() { return world_rank() < world_size() / 2 ? "n0" : "n1"; }

}  // namespace

TEST_CASE("memory tier: a node is lost after save_async; its ranks recover from the other node's replicas") {
  shared_dir dir;
  const auto w = static_cast<std::uint32_t>(world_size());
  const auto tp = w >= 4 ? 2u : 1u;
  const auto r = static_cast<std::uint32_t>(world_rank());
  const auto node_dir = (dir.path / node_name()).string();
  using tier_type = ckpt::memory_tier<ckpt::megatron<ckpt::mpi>>;
  const ckpt::memory_tier_options opts{.keep = 2, .replicas = 1, .node = node_name(), .piece_bytes = 8192};
  {
    tier_type tier{{.tp = tp}, ckpt::posix(node_dir), opts};
    REQUIRE(tier.node_names().size() == 2);
    tier.save(10, tier_state(r, tp, 10));
    auto pending = tier.save_async(20, tier_state(r, tp, 20));
    MPI_Barrier(MPI_COMM_WORLD);  // the application's own MPI calls go on during replication
    pending.wait();
    CHECK(tier.last_save().bytes_sent + tier.last_save().bytes_received > 0);
    CHECK(tier.bytes_held() > 0);
  }
  // Node n1 is replaced: its memory is empty.
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == world_size() / 2) {
    fs::remove_all(dir.path / "n1");
    fs::create_directories(dir.path / "n1");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  tier_type tier{{.tp = tp}, ckpt::posix(node_dir), opts};
  tier_state back(r, tp, 0);
  const auto res = tier.load(back);
  CHECK(res.tier == "memory");
  CHECK(res.iteration == 20);
  CHECK(back == tier_state(r, tp, 20));
  std::string all;
  for (const auto& line : res.recovery) all += line + "\n";
  CAPTURE(all);
  CHECK(all.find("was lost on node 'n1'") != std::string::npos);
  CHECK(all.find("on node 'n0'") != std::string::npos);
}

TEST_CASE("preemption: SIGUSR1 on the last rank makes should_save true on every rank at the same step") {
  shared_dir dir;
  const auto w = static_cast<std::uint32_t>(world_size());
  ckpt::preemption::install({SIGUSR1});
  ckpt::preemption::clear();
  ckpt::checkpointer<ckpt::megatron<ckpt::mpi>> cp{{.tp = w}, ckpt::posix(dir.path)};
  tier_state s(static_cast<std::uint32_t>(world_rank()), w, 1);
  std::optional<ckpt::save_handle> pending;
  std::uint64_t saved_at = 0;
  for (std::uint64_t step = 1; step <= 50; ++step) {
    if (step == 3) pending = cp.save_async(3, s);  // the agreement runs beside a background save
    if (world_rank() == world_size() - 1 && step == 17) std::raise(SIGUSR1);
    if (cp.should_save(step)) {
      saved_at = step;
      cp.save(step, s);
    }
    if (cp.preempted()) break;
  }
  if (pending) pending->wait();
  ckpt::preemption::clear();
  std::signal(SIGUSR1, SIG_DFL);
  // Every rank saved at step 17: the signal arrived before the last rank's should_save of step 17.
  CHECK(saved_at == 17);
  std::uint64_t lo = saved_at, hi = saved_at;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  CHECK(lo == hi);
  CHECK(cp.latest() == "global_step17");
}

TEST_CASE("memory tier: a flipped byte in the replica a lost node needs sends load_or to the durable tier, naming the file") {
  shared_dir dir;
  const auto w = static_cast<std::uint32_t>(world_size());
  const auto tp = w >= 4 ? 2u : 1u;
  const auto r = static_cast<std::uint32_t>(world_rank());
  using policy = ckpt::megatron<ckpt::mpi>;
  const ckpt::memory_tier_options opts{.keep = 2, .replicas = 1, .node = node_name()};
  const auto node_dir = (dir.path / node_name()).string();
  {
    ckpt::memory_tier<policy> tier{{.tp = tp}, ckpt::posix(node_dir), opts};
    ckpt::checkpointer<policy, ckpt::posix> disk{{.tp = tp}, ckpt::posix(dir.path / "disk")};
    disk.save(15, tier_state(r, tp, 15));
    tier.save(20, tier_state(r, tp, 20));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    // Node n1 is replaced, and node n0's copy of the first file n1 needs is damaged.
    fs::remove_all(dir.path / "n1");
    fs::create_directories(dir.path / "n1");
    const auto victim = dir.path / "n0/global_step20" / "mp_rank_00_dp001" / "model_optim_rng.ckpt";
    REQUIRE(fs::exists(victim));
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(4096);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x01);
    f.seekp(4096);
    f.write(&c, 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  ckpt::memory_tier<policy> tier{{.tp = tp}, ckpt::posix(node_dir), opts};
  ckpt::checkpointer<policy, ckpt::posix> disk{{.tp = tp}, ckpt::posix(dir.path / "disk")};
  tier_state back(r, tp, 0);
  const auto res = tier.load_or(disk, back);
  CHECK(res.tier == "durable");
  CHECK(res.iteration == 15);
  CHECK(back == tier_state(r, tp, 15));
  std::string all;
  for (const auto& line : res.recovery) all += line + "\n";
  CAPTURE(all);
  CHECK(all.find("global_step20 could not be restored") != std::string::npos);
  CHECK(all.find("mp_rank_00_dp001/model_optim_rng.ckpt, tensor '") != std::string::npos);
  CHECK(all.find("checksum mismatch") != std::string::npos);
}

TEST_CASE("memory tier: a full memory directory on the last rank fails the save on every rank; the previous tag loads") {
  shared_dir dir;
  const auto w = static_cast<std::uint32_t>(world_size());
  const auto tp = w >= 4 ? 2u : 1u;
  const auto r = static_cast<std::uint32_t>(world_rank());
  using policy = ckpt::megatron<ckpt::mpi>;
  using failing = test::failing_storage<ckpt::posix>;
  const ckpt::memory_tier_options opts{.keep = 2, .replicas = 1, .node = node_name()};
  const auto node_dir = (dir.path / node_name()).string();
  for (long k : {1L, 4L, 9L, 11L, 13L}) {
    CAPTURE(k);
    failing store{ckpt::posix(node_dir)};
    ckpt::memory_tier<policy, failing> tier{{.tp = tp}, store, opts};
    tier.save(10 * static_cast<std::uint64_t>(k), tier_state(r, tp, 10 * static_cast<std::uint64_t>(k)));
    if (world_rank() == world_size() - 1) store.fail_at(k);  // ENOSPC
    std::string err;
    try {
      tier.save(10 * static_cast<std::uint64_t>(k) + 1, tier_state(r, tp, 99));
    } catch (const ckpt::error& e) {
      err = e.what();
    }
    store.fail_at(-1);
    if (world_rank() == 0) MESSAGE("k=" << k << ": " << err);
    CHECK(err.find("rank " + std::to_string(world_size() - 1) + ": ") != std::string::npos);
    CHECK(err.find("No space left on device") != std::string::npos);
    tier_state back(r, tp, 0);
    const auto res = tier.load(back);
    CHECK(res.iteration == 10 * static_cast<std::uint64_t>(k));
    CHECK(back == tier_state(r, tp, 10 * static_cast<std::uint64_t>(k)));
  }
}

TEST_CASE("preemption: SIGTERM during a save on one rank does not disturb it; every rank then agrees to stop") {
  shared_dir dir;
  const auto w = static_cast<std::uint32_t>(world_size());
  ckpt::preemption::install({SIGTERM});
  ckpt::preemption::clear();
  ckpt::checkpointer<ckpt::megatron<ckpt::mpi>> cp{{.tp = w}, ckpt::posix(dir.path)};
  tier_state s(static_cast<std::uint32_t>(world_rank()), w, 4);
  (void)cp.should_save(0);  // the agreement's communicator, made before the save is in flight
  auto pending = cp.save_async(4, s);
  if (world_rank() == 0) std::raise(SIGTERM);  // while rank 0's save runs in the background
  pending.wait();
  CHECK(cp.latest() == "global_step4");
  CHECK(cp.should_save(5));
  CHECK(cp.preempted());
  ckpt::preemption::clear();
  std::signal(SIGTERM, SIG_DFL);
  tier_state back(static_cast<std::uint32_t>(world_rank()), w, 0);
  CHECK(cp.load(back).iteration == 4);
  CHECK(back == tier_state(static_cast<std::uint32_t>(world_rank()), w, 4));
}
