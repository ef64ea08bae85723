// make_ckpt: writes the checkpoints the `ckpt` tool's tests run on. The state is a small
// Megatron-style model whose every element is a function of its global index, the iteration
// and a seed, so a checkpoint saved at tp=1 and one saved at tp=2 hold the same global tensors.
//
//   make_ckpt ROOT --iterations 100,200 [--tp N] [--codec raw|zstd|zstd_bytegroup] [--seed S]
//             [--perturb NAME=DELTA] [--rows R] [--column-major 1]
//
// --tp N saves from N ranks (threads, ckpt::in_process) with the megatron policy: fc1 and the
// embedding are split by rows, fc2 by columns, the norm is replicated. --perturb adds DELTA to
// element 0 of one tensor (for diff tests). --rows sets the embedding's rows (its size).
// --column-major 1 adds "eigen.w", a 3x5 f32 matrix stored column-major (as the Eigen adapter
// stores one: memory-order shape [5, 3], ckpt::layout::column_major), replicated.
//
//   make_ckpt --draw ROOT NAME N
//
// loads value NAME of ROOT's latest tag into a std::mt19937, as a C++ engine resuming an
// imported run would (`v.value(NAME, rng)`), and prints its next N outputs, one a line.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <ckpt/ckpt.hpp>
#include <ckpt/in_process.hpp>

namespace {

struct settings {
  std::string root;
  std::vector<std::uint64_t> iterations;
  std::uint32_t tp = 1;
  std::string codec = "raw";
  std::uint64_t seed = 1;
  std::string perturb_name;
  double perturb = 0;
  std::uint64_t rows = 64;
  bool column_major = false;
};

float value_at(std::uint64_t index, std::uint64_t iteration, std::uint64_t seed, std::uint64_t salt) {
  const double x = static_cast<double>((index * 2654435761u + salt * 97 + seed * 13) % 10007) / 10007.0;
  return static_cast<float>(std::sin(x * 6.283) * 0.02 + static_cast<double>(iteration) * 1e-4);
}

/// One rank's slice of a 2-d global tensor: rows or columns [lo, hi) of `split` (-1: whole).
template <class T>
struct slice {
  std::string name;
  std::uint64_t rows, cols;
  int split;  // 0 rows, 1 columns, -1 replicated
  std::vector<T> data;
  ckpt::shape_t offset, shape;

  slice(std::string n, std::uint64_t r, std::uint64_t c, int s, std::uint32_t rank, std::uint32_t tp, std::uint64_t it,
        const settings& cfg, std::uint64_t salt)
      : name(std::move(n)), rows(r), cols(c), split(s) {
    const std::uint64_t dim = split == 1 ? cols : rows;
    const std::uint64_t lo = split < 0 ? 0 : dim * rank / tp, hi = split < 0 ? dim : dim * (rank + 1) / tp;
    offset = {split == 0 ? lo : 0, split == 1 ? lo : 0};
    shape = {split == 0 ? hi - lo : rows, split == 1 ? hi - lo : cols};
    for (std::uint64_t i = 0; i < shape[0]; ++i)
      for (std::uint64_t j = 0; j < shape[1]; ++j) {
        const auto g = (offset[0] + i) * cols + offset[1] + j;
        float v = value_at(g, it, cfg.seed, salt);
        if (g == 0 && name == cfg.perturb_name) v += static_cast<float>(cfg.perturb);
        data.push_back(T(v));
      }
  }
  ckpt::tensor_ref ref() {
    auto r = ckpt::view(data.data(), shape);
    if (split < 0) return std::move(r).sharded(ckpt::shard_spec::replica());
    return std::move(r).sharded({.global_shape = {rows, cols}, .offset = offset});
  }
};

struct model {
  slice<float> embed, fc1, fc2, norm, fc1_next, m_embed, m_fc1;
  slice<ckpt::bfloat16> fc1_bf16;
  std::mt19937_64 rng;
  std::uint64_t step;
  bool column_major;
  std::vector<float> eigen_w;  // element (i, j) of the 3x5 matrix at j * 3 + i

  model(std::uint32_t rank, std::uint32_t tp, std::uint64_t it, const settings& s)
      : embed("embed.weight", s.rows, 16, 0, rank, tp, it, s, 1),
        fc1("layers.0.fc1.weight", 48, 16, 0, rank, tp, it, s, 2),
        fc2("layers.0.fc2.weight", 16, 48, 1, rank, tp, it, s, 3),
        norm("layers.0.norm.weight", 1, 16, -1, rank, tp, it, s, 4),
        fc1_next("layers.1.fc1.weight", 48, 16, 0, rank, tp, it, s, 8),
        m_embed("optimizer.exp_avg.embed.weight", s.rows, 16, 0, rank, tp, it, s, 5),
        m_fc1("optimizer.exp_avg.layers.0.fc1.weight", 48, 16, 0, rank, tp, it, s, 6),
        fc1_bf16("layers.0.fc1.weight_bf16", 48, 16, 0, rank, tp, it, s, 7),
        rng(s.seed * 1000 + rank),
        step(it),
        column_major(s.column_major) {
    for (int k = 0; k < 15; ++k) eigen_w.push_back(static_cast<float>(k) + static_cast<float>(it));
  }

  template <class V>
  void checkpoint(V& v) {
    for (auto* t : {&embed, &fc1, &fc2, &norm, &fc1_next}) v.tensor(t->name, t->ref());
    v.tensor(fc1_bf16.name, fc1_bf16.ref());
    if (column_major)
      v.tensor("eigen.w", ckpt::view(eigen_w.data(), {5, 3}).laid_out(ckpt::layout::column_major).sharded(ckpt::shard_spec::replica()));
    v.group("optimizer", [&](auto& g) {
      g.tensor("exp_avg.embed.weight", m_embed.ref());
      g.tensor("exp_avg.layers.0.fc1.weight", m_fc1.ref());
    });
    v.value("rng", rng);
    v.value("step", step);
  }
};

template <class Codec>
void save_all(const settings& s) {
  ckpt::config cfg{{"hidden_size", 16}, {"layers", 1}, {"seed", s.seed}, {"lr", 3e-4}, {"precision", "bf16 \"mixed\""},
                   {"bias", true}};
  if (s.tp == 1) {
    ckpt::checkpointer<ckpt::single_process, ckpt::posix, Codec> cp{{}, s.root};
    for (auto it : s.iterations) {
      model m(0, 1, it, s);
      cp.save(it, m, {.config = cfg});
    }
    return;
  }
  auto world = std::make_shared<ckpt::in_process_world>(static_cast<int>(s.tp));
  std::vector<std::thread> ranks;
  std::vector<std::string> failures(s.tp);
  for (std::uint32_t r = 0; r < s.tp; ++r)
    ranks.emplace_back([&, r] {
      try {
        ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::posix, Codec> cp{
            {.tp = s.tp, .pp = 1, .dp = 0, .comm = {world, static_cast<int>(r)}}, s.root};
        for (auto it : s.iterations) {
          model m(r, s.tp, it, s);
          cp.save(it, m, {.config = cfg});
        }
      } catch (const std::exception& e) {
        failures[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (const auto& f : failures)
    if (!f.empty()) throw std::runtime_error(f);
}

}  // namespace

/// A state that holds one RNG engine.
struct one_engine {
  std::string name;
  std::mt19937 rng;
  template <class V>
  void checkpoint(V& v) {
    v.value(name, rng);
  }
};

int draw(const std::string& root, const std::string& name, int n) {
  ckpt::checkpointer<ckpt::single_process, ckpt::posix> cp{{}, root};
  one_engine s{name, {}};
  cp.load(s, {.strict = false});
  for (int i = 0; i < n; ++i) std::printf("%u\n", static_cast<unsigned>(s.rng()));
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--draw") {
    try {
      return draw(argv[2], argv[3], std::stoi(argv[4]));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "make_ckpt --draw: %s\n", e.what());
      return 1;
    }
  }
  settings s;
  if (argc < 2) {
    std::fprintf(stderr, "usage: make_ckpt ROOT --iterations 100,200 [--tp N] [--codec C] [--seed S] [--perturb NAME=D] [--rows R]\n");
    return 2;
  }
  s.root = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--iterations") {
      for (std::size_t at = 0; at <= v.size();) {
        const auto comma = v.find(',', at);
        s.iterations.push_back(std::stoull(v.substr(at, comma - at)));
        if (comma == std::string::npos) break;
        at = comma + 1;
      }
    } else if (k == "--tp") {
      s.tp = static_cast<std::uint32_t>(std::stoul(v));
    } else if (k == "--codec") {
      s.codec = v;
    } else if (k == "--seed") {
      s.seed = std::stoull(v);
    } else if (k == "--column-major") {
      s.column_major = v == "1";
    } else if (k == "--rows") {
      s.rows = std::stoull(v);
    } else if (k == "--perturb") {
      const auto eq = v.find('=');
      s.perturb_name = v.substr(0, eq);
      s.perturb = std::stod(v.substr(eq + 1));
    } else {
      std::fprintf(stderr, "make_ckpt: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    if (s.codec == "raw") save_all<ckpt::raw>(s);
    else if (s.codec == "zstd") save_all<ckpt::zstd>(s);
    else if (s.codec == "zstd_bytegroup") save_all<ckpt::zstd_bytegroup>(s);
    else throw std::runtime_error("unknown codec " + s.codec);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_ckpt: %s\n", e.what());
    return 1;
  }
  return 0;
}
