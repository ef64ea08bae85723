// reshard_reads: how many bytes a rank reads, against the bytes it needs, when it loads a
// tensor-parallel checkpoint at another layout (issue "loads at the limit", point 4).
//
// The model is Megatron's MLP per layer: fc1 column-parallel ([4h, h], split by rows, so each
// rank's slice is one contiguous range of the stored tensor) and fc2 row-parallel ([h, 4h],
// split by columns, so each slice is a strided part of every row), fp32. It is saved at tp 4
// (ranks are threads of one process, ckpt::in_process) and loaded at tp 3 and at tp 2 x dp 2;
// every loaded element is checked. A chunk is the unit of verification, so a rank reads every
// chunk its slice overlaps in full: the figure depends on the chunk size and on the blocks a
// slice is cut into along its split dimension (checkpointer_options::reshard_blocks; 1: none),
// which are swept.
//
//   reshard_reads [--hidden 1024] [--layers 4] [--chunk-kib 4096,1024,256] [--blocks 16,1] [--time-runs 3] [--dir DIR]
//
// Prints one row per weight, blocks, chunk size, layout and rank (and one for all ranks): bytes
// needed, bytes read (shard file checks included), read / needed; then the worst rank's ratio as
// `reshard_worst_<weights>_<layout>_<chunk>kib_<blocks>blocks <ratio>`. Before those, what the
// blocks cost where nothing is resharded: the median wall time of the save at tp 4 and of a load
// at tp 4, over --time-runs runs (`reshard_same_layout_<weights>_<chunk>kib_<blocks>blocks_save_s`
// and `_load_s`).

#include <ckpt/ckpt.hpp>
#include <ckpt/in_process.hpp>

#include "../tests/on_ranks.hpp"  // ranks as threads

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct layout {
  std::uint32_t tp, dp;
};

/// One rank's slices of every layer's fc1 (split by rows) or fc2 (split by columns); each
/// element holds a value made from its global position, so a load can be checked element by
/// element.
struct mlp_slice {
  std::uint64_t h, layers;
  std::uint32_t tp, rank;
  bool by_columns;  // fc2 rather than fc1
  std::vector<std::vector<float>> w;  // per layer

  mlp_slice(std::uint64_t hidden, std::uint64_t n, std::uint32_t t, std::uint32_t r, bool columns, bool fill)
      : h(hidden), layers(n), tp(t), rank(r), by_columns(columns), w(n, std::vector<float>(rows() * hidden)) {
    if (!fill) return;
    const auto size = shape(), at = offset();
    for (std::uint64_t l = 0; l < n; ++l)
      for (std::uint64_t i = 0; i < size[0]; ++i)
        for (std::uint64_t j = 0; j < size[1]; ++j)
          w[l][i * size[1] + j] = static_cast<float>(l * 1000003 + (i + at[0]) * 7919 + j + at[1]);
  }
  std::uint64_t lo() const { return 4 * h * rank / tp; }
  std::uint64_t rows() const { return 4 * h * (rank + 1) / tp - lo(); }
  std::uint64_t bytes() const { return layers * rows() * h * sizeof(float); }
  ckpt::shape_t shape() const { return by_columns ? ckpt::shape_t{h, rows()} : ckpt::shape_t{rows(), h}; }
  ckpt::shape_t offset() const { return by_columns ? ckpt::shape_t{0, lo()} : ckpt::shape_t{lo(), 0}; }

  template <class V>
  void checkpoint(V& v) {
    const auto global = by_columns ? ckpt::shape_t{h, 4 * h} : ckpt::shape_t{4 * h, h};
    for (std::uint64_t l = 0; l < layers; ++l)
      v.tensor("layers." + std::to_string(l) + (by_columns ? ".fc2.weight" : ".fc1.weight"),
               ckpt::view(w[l].data(), shape()).sharded({.global_shape = global, .offset = offset()}));
  }

  std::uint64_t wrong() const {
    const mlp_slice want(h, layers, tp, rank, by_columns, true);
    std::uint64_t n = 0;
    for (std::uint64_t l = 0; l < layers; ++l) n += w[l] != want.w[l];
    return n;
  }
};

/// Runs body(comm, rank) on n threads of one in_process world (the tests' helper); throws the
/// first rank's error.
template <class F>
void on_ranks(std::uint32_t n, F&& body) {
  const auto errors = test::on_ranks(n, std::forward<F>(body));
  for (std::uint32_t r = 0; r < n; ++r)
    if (!errors[r].empty()) throw std::runtime_error("rank " + std::to_string(r) + ": " + errors[r]);
}

std::vector<std::uint64_t> numbers(const std::string& list) {
  std::vector<std::uint64_t> out;
  std::stringstream s(list);
  for (std::string item; std::getline(s, item, ',');) out.push_back(std::stoull(item));
  return out;
}

using cp_t = ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::posix>;
using clock = std::chrono::steady_clock;

double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) try {
  std::uint64_t hidden = 1024, layers = 4;
  std::vector<std::uint64_t> chunks_kib{4096, 1024, 256}, blocks{16, 1};
  unsigned time_runs = 3;
  fs::path dir = fs::temp_directory_path() / "ckpt_reshard_reads";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--hidden") hidden = std::stoull(next());
    else if (a == "--layers") layers = std::stoull(next());
    else if (a == "--chunk-kib") chunks_kib = numbers(next());
    else if (a == "--blocks") blocks = numbers(next());
    else if (a == "--time-runs") time_runs = static_cast<unsigned>(std::stoul(next()));
    else if (a == "--dir") dir = next();
    else throw std::invalid_argument("unknown option " + a);
  }
  const auto zero = [](std::uint64_t k) { return k == 0; };
  if (hidden == 0 || layers == 0 || time_runs == 0 || chunks_kib.empty() || blocks.empty() || std::any_of(chunks_kib.begin(), chunks_kib.end(), zero) ||
      std::any_of(blocks.begin(), blocks.end(), zero))
    throw std::invalid_argument("--hidden, --layers, --time-runs, every --chunk-kib and every --blocks must be positive");
  std::printf("model: %llu layers of fc1 [%llu, %llu] (split by rows) and fc2 [%llu, %llu] (split by columns), fp32, saved at tp 4\n",
              static_cast<unsigned long long>(layers), static_cast<unsigned long long>(4 * hidden),
              static_cast<unsigned long long>(hidden), static_cast<unsigned long long>(hidden),
              static_cast<unsigned long long>(4 * hidden));
  std::printf("%-14s %-7s %-10s %-10s %-5s %14s %14s %12s\n", "weights", "blocks", "chunk_KiB", "loaded_at", "rank", "bytes_needed",
              "bytes_read", "read/needed");
  for (const bool by_columns : {false, true}) {
    const char* kind = by_columns ? "fc2_by_cols" : "fc1_by_rows";
    for (const auto b : blocks)
    for (const auto kib : chunks_kib) {
      const ckpt::checkpointer_options opts{.chunk_bytes = kib << 10, .reshard_blocks = static_cast<std::uint32_t>(b)};
      // What the blocks cost where nothing is resharded: the save, and a load at the same layout
      // (blocks of columns are gathered at save and scattered back at load), medians of runs.
      std::vector<double> saves, loads;
      for (unsigned run = 0; run < time_runs; ++run) {
        fs::remove_all(dir);
        const auto t0 = clock::now();
        on_ranks(4, [&](ckpt::in_process comm, std::uint32_t r) {
          cp_t cp{{.tp = 4, .comm = comm}, dir, opts};
          mlp_slice m(hidden, layers, 4, r, by_columns, true);
          cp.save(1, m);
        });
        const auto t1 = clock::now();
        on_ranks(4, [&](ckpt::in_process comm, std::uint32_t r) {
          cp_t cp{{.tp = 4, .comm = comm}, dir, opts};
          mlp_slice m(hidden, layers, 4, r, by_columns, false);
          cp.load(m);
          if (m.wrong() != 0) throw std::runtime_error(std::to_string(m.wrong()) + " tensors loaded wrong at the saved layout");
        });
        saves.push_back(seconds(t1 - t0));
        loads.push_back(seconds(clock::now() - t1));
      }
      std::printf("reshard_same_layout_%s_%llukib_%llublocks_save_s %.4f\n", kind, static_cast<unsigned long long>(kib),
                  static_cast<unsigned long long>(b), median(saves));
      std::printf("reshard_same_layout_%s_%llukib_%llublocks_load_s %.4f\n", kind, static_cast<unsigned long long>(kib),
                  static_cast<unsigned long long>(b), median(loads));
      for (const layout l : {layout{3, 1}, layout{2, 2}}) {
        std::vector<std::uint64_t> needed(l.tp * l.dp), read(l.tp * l.dp);
        on_ranks(l.tp * l.dp, [&](ckpt::in_process comm, std::uint32_t r) {
          cp_t cp{{.tp = l.tp, .dp = l.dp, .comm = comm}, dir, opts};
          mlp_slice m(hidden, layers, l.tp, cp.policy().coordinates().tp, by_columns, false);
          const auto res = cp.load(m, {.on_topology_change = ckpt::topology_change::keep_live});
          if (m.wrong() != 0) throw std::runtime_error(std::to_string(m.wrong()) + " tensors loaded wrong");
          needed[r] = m.bytes();
          read[r] = res.bytes_read;
        });
        const auto name = "tp" + std::to_string(l.tp) + (l.dp > 1 ? "xdp" + std::to_string(l.dp) : "");
        std::uint64_t all_needed = 0, all_read = 0;
        double worst = 0;
        for (std::uint32_t r = 0; r < l.tp * l.dp; ++r) {
          all_needed += needed[r];
          all_read += read[r];
          worst = std::max(worst, static_cast<double>(read[r]) / static_cast<double>(needed[r]));
          std::printf("%-14s %-7llu %-10llu %-10s %-5u %14llu %14llu %12.3f\n", kind, static_cast<unsigned long long>(b),
                      static_cast<unsigned long long>(kib), name.c_str(), r,
                      static_cast<unsigned long long>(needed[r]), static_cast<unsigned long long>(read[r]),
                      static_cast<double>(read[r]) / static_cast<double>(needed[r]));
        }
        std::printf("%-14s %-7llu %-10llu %-10s %-5s %14llu %14llu %12.3f\n", kind, static_cast<unsigned long long>(b),
                    static_cast<unsigned long long>(kib), name.c_str(), "all",
                    static_cast<unsigned long long>(all_needed), static_cast<unsigned long long>(all_read),
                    static_cast<double>(all_read) / static_cast<double>(all_needed));
        // For bench/report.py: the worst rank's read / needed, as a "name value" line.
        std::printf("reshard_worst_%s_%s_%llukib_%llublocks %.4f\n", kind, name.c_str(), static_cast<unsigned long long>(kib),
                    static_cast<unsigned long long>(b), worst);
      }
    }
  }
  fs::remove_all(dir);
} catch (const std::exception& e) {
  std::fprintf(stderr, "reshard_reads: %s\n", e.what());
  return 1;
}
