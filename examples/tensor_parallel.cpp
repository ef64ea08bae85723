// tensor_parallel: a Megatron-style tensor-parallel MLP, saved at tp=4 and resumed at tp=2.
//
// The model is the MLP block of a transformer, split across the ranks the way Megatron-LM
// splits it (Shoeybi et al., 2019, section 3):
//
//   fc1  column-parallel linear: weight [hidden, in], rank r holds rows [r*h, r*h + h) (h =
//        hidden / tp) and the matching slice of the bias. Its forward needs no communication.
//   GeLU on each rank's slice of the hidden units.
//   fc2  row-parallel linear: weight [out, hidden], rank r holds columns [r*h, r*h + h). Each
//        rank computes a partial output; MPI_Allreduce sums them. Its bias is replicated: every
//        rank holds all of it and adds it after the sum.
//
// It learns a fixed random "teacher" network from Gaussian inputs with Adam. Batches are drawn
// from an RNG seeded the same on every rank, so all ranks see the same batch.
//
// ckpt is told what each rank holds, and ckpt's load does the resharding:
//
//   weights and fc1's bias   ckpt::view(w, {rows, cols}).sharded({.global_shape, .offset})
//   fc2's bias               .sharded(ckpt::shard_spec::replica())  (stored once)
//   Adam moments             v.group("optimizer", ...), sharded exactly like their weights
//   data RNG, Adam step      v.value(...): equal on all ranks, see the comment at the load
//
// At tp=4 every rank writes its own mp_rank_0r/model_optim_rng.ckpt; a load at tp=2 reads, for
// each tensor, only the checksummed chunks of the saved slices that overlap the slice it now holds.
//
//   mpirun -np 4 tensor_parallel --save DIR --steps 300 --save-at 150
//       trains steps 1..300, saves at step 150, writes every step's loss to DIR/losses_np4.txt
//   mpirun -np 2 tensor_parallel --save DIR --steps 300 --resume --check
//       loads DIR/latest (step 150, saved at tp=4) at tp=2, trains steps 151..300 and checks
//       each step's loss against the tp=4 run's: only the order of the floating-point sums in
//       the all-reduce differs, so they agree to --rtol (default 1e-4; about 3e-7 is typical).
//       Prints PASS, or FAIL and exits 1. Any tp that divides --hidden (96) works.
//   tensor_parallel --check-all DIR --mpirun /usr/bin/mpirun
//       runs both of the above (with mpirun --oversubscribe) in one command: the test suite's.

// ckpt/mpi.hpp comes first: it includes <mpi.h> without the deprecated MPI C++ bindings,
// which do not compile warning-free.
#include <ckpt/mpi.hpp>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <ckpt/ckpt.hpp>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using ull = unsigned long long;  // what printf's %llu takes

struct options {
  std::string save_dir;
  std::string check_all_dir;  // --check-all: drive both runs through mpirun
  std::string mpirun = "mpirun";
  std::uint64_t steps = 300;
  std::optional<std::uint64_t> save_at;  // default: steps / 2
  bool resume = false;
  bool check = false;
  double rtol = 1e-4;
  int np_save = 4, np_resume = 2;  // --check-all only
  // Hyper-parameters: stored in every checkpoint's config and compared on load. The tensor-
  // parallel size is not one of them: changing it on resume is the point.
  std::uint64_t seed = 2024;
  std::size_t in = 16;
  std::size_t hidden = 96;  // divisible by 1, 2, 3, 4, 6, 8, 12, ...
  std::size_t out = 4;
  std::size_t batch = 32;
  float lr = 3e-3F;
};

ckpt::config make_config(const options& o) {
  return {{"model", "tp_mlp"}, {"in", o.in},       {"hidden", o.hidden}, {"out", o.out},
          {"batch", o.batch},  {"lr", o.lr},       {"seed", o.seed},     {"optimizer", "adam"}};
}

// ---------------------------------------------------------------------------------------------
// The model: one parameter is this rank's slice of a global tensor, plus its shard spec
// ---------------------------------------------------------------------------------------------

struct parameter {
  std::string name;
  ckpt::shape_t shape;    // the local slice
  ckpt::shard_spec spec;  // where that slice sits in the global tensor
  std::vector<float> value, grad;

  parameter(std::string name_, ckpt::shape_t shape_, ckpt::shard_spec spec_)
      : name(std::move(name_)), shape(std::move(shape_)), spec(std::move(spec_)) {
    std::size_t n = 1;
    for (auto e : shape) n *= e;
    value.assign(n, 0.0F);
    grad.assign(n, 0.0F);
  }
  // The same shard spec serves the weight and every optimizer tensor shaped like it.
  ckpt::tensor_ref ref(std::vector<float>& data) const { return ckpt::view(data, shape).sharded(spec); }
};

struct tp_mlp {
  std::size_t in, hidden, out, tp, rank, h;  // h: hidden units on this rank
  parameter fc1_w, fc1_b, fc2_w, fc2_b;

  tp_mlp(const options& o, std::size_t tp_, std::size_t rank_)
      : in(o.in), hidden(o.hidden), out(o.out), tp(tp_), rank(rank_), h(o.hidden / tp_),
        // Column-parallel: rows [rank*h, rank*h + h) of the [hidden, in] weight, and that slice
        // of the bias.
        fc1_w("fc1.weight", {h, in}, {.global_shape = {hidden, in}, .offset = {rank * h, 0}}),
        fc1_b("fc1.bias", {h}, {.global_shape = {hidden}, .offset = {rank * h}}),
        // Row-parallel: columns [rank*h, rank*h + h) of the [out, hidden] weight. The bias is
        // added once, after the all-reduce, so every rank holds the whole of it.
        fc2_w("fc2.weight", {out, h}, {.global_shape = {out, hidden}, .offset = {0, rank * h}}),
        fc2_b("fc2.bias", {out}, ckpt::shard_spec::replica()) {
    // Draw the global matrices and keep this rank's slice: the initial model is the same
    // whatever tp is. (A resumed run initialises too and then loads over it.)
    std::mt19937_64 init(o.seed);
    std::normal_distribution<float> w1(0.0F, 1.0F / std::sqrt(float(in)));
    for (std::size_t i = 0; i < hidden; ++i)
      for (std::size_t k = 0; k < in; ++k) {
        const float x = w1(init);
        if (i / h == rank) fc1_w.value[(i - rank * h) * in + k] = x;
      }
    std::normal_distribution<float> w2(0.0F, 1.0F / std::sqrt(float(hidden)));
    for (std::size_t o2 = 0; o2 < out; ++o2)
      for (std::size_t j = 0; j < hidden; ++j) {
        const float x = w2(init);
        if (j / h == rank) fc2_w.value[o2 * h + (j - rank * h)] = x;
      }
  }

  std::vector<parameter*> parameters() { return {&fc1_w, &fc1_b, &fc2_w, &fc2_b}; }

  template <class V>
  void checkpoint(V& v) {
    for (auto* p : parameters()) v.tensor(p->name, p->ref(p->value));
  }
};

// Adam (Kingma & Ba) with bias correction. Its moments are sharded like the weights they
// belong to: rank r updates exactly the elements it holds.
struct adam {
  float lr, beta1 = 0.9F, beta2 = 0.999F, eps = 1e-8F;
  std::uint64_t step = 0;  // drives the bias correction; the same on every rank
  std::vector<parameter*> params;
  std::vector<std::vector<float>> m, v;

  adam(tp_mlp& model, float lr_) : lr(lr_), params(model.parameters()) {
    for (auto* p : params) {
      m.emplace_back(p->value.size());
      v.emplace_back(p->value.size());
    }
  }

  void update() {
    ++step;
    const double c1 = 1.0 - std::pow(double(beta1), double(step));
    const double c2 = 1.0 - std::pow(double(beta2), double(step));
    const auto lr_t = static_cast<float>(lr * std::sqrt(c2) / c1);
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto& w = params[i]->value;
      const auto& g = params[i]->grad;
      for (std::size_t j = 0; j < w.size(); ++j) {
        m[i][j] = beta1 * m[i][j] + (1 - beta1) * g[j];
        v[i][j] = beta2 * v[i][j] + (1 - beta2) * g[j] * g[j];
        w[j] -= lr_t * m[i][j] / (std::sqrt(v[i][j]) + eps);
      }
    }
  }

  template <class V>
  void checkpoint(V& vis) {
    vis.value("step", step);
    for (std::size_t i = 0; i < params.size(); ++i) {
      vis.tensor("exp_avg." + params[i]->name, params[i]->ref(m[i]));
      vis.tensor("exp_avg_sq." + params[i]->name, params[i]->ref(v[i]));
    }
  }
};

// The function to learn: a fixed random tanh network, derived from the seed. Not training
// state: every run rebuilds it identically.
struct teacher {
  static constexpr std::size_t width = 32;
  std::size_t in, out;
  std::vector<float> a, b;  // [width, in], [out, width]

  explicit teacher(const options& o) : in(o.in), out(o.out), a(width * o.in), b(o.out * width) {
    std::mt19937_64 rng(o.seed ^ 0x7eac4e7ULL);
    std::normal_distribution<float> d(0.0F, 1.0F);
    for (auto& x : a) x = d(rng) / std::sqrt(float(in));
    for (auto& x : b) x = d(rng) / std::sqrt(float(width));
  }
  void operator()(const float* x, float* y) const {
    float hid[width];
    for (std::size_t j = 0; j < width; ++j) {
      float s = 0;
      for (std::size_t k = 0; k < in; ++k) s += a[j * in + k] * x[k];
      hid[j] = std::tanh(s);
    }
    for (std::size_t o = 0; o < out; ++o) {
      float s = 0;
      for (std::size_t j = 0; j < width; ++j) s += b[o * width + j] * hid[j];
      y[o] = s;
    }
  }
};

// GeLU, tanh approximation (as in GPT-2 and Megatron), and its derivative.
constexpr float gelu_c = 0.7978845608F;  // sqrt(2 / pi)
float gelu(float z) { return 0.5F * z * (1.0F + std::tanh(gelu_c * (z + 0.044715F * z * z * z))); }
float gelu_grad(float z) {
  const float t = std::tanh(gelu_c * (z + 0.044715F * z * z * z));
  return 0.5F * (1.0F + t) + 0.5F * z * (1.0F - t * t) * gelu_c * (1.0F + 3.0F * 0.044715F * z * z);
}

// ---------------------------------------------------------------------------------------------
// The training state: everything checkpoint() names is saved, and nothing else affects training
// ---------------------------------------------------------------------------------------------

struct trainer {
  options hp;
  tp_mlp model;
  adam optimizer;
  teacher target;
  // Batches: drawn from the same seed on every rank, so every rank draws the same batch.
  std::mt19937_64 data_rng;
  std::normal_distribution<float> gauss{0.0F, 1.0F};  // caches every second value: state too
  std::vector<float> x, y, z, a, yhat, dy, dz;           // scratch, not state

  trainer(const options& o, std::size_t tp, std::size_t rank)
      : hp(o), model(o, tp, rank), optimizer(model, o.lr), target(o), data_rng(o.seed + 1) {}

  template <class V>
  void checkpoint(V& v) {
    v.group("model", model);
    v.group("optimizer", optimizer);
    v.value("rng.data", data_rng);
    v.value("rng.data_dist", gauss);
  }

  // One optimizer step on a fresh batch; returns its loss (the same on every rank).
  double step() {
    const std::size_t B = hp.batch, I = model.in, H = model.h, O = model.out;
    x.resize(B * I);
    y.resize(B * O);
    for (auto& e : x) e = gauss(data_rng);
    for (std::size_t b = 0; b < B; ++b) {
      target(&x[b * I], &y[b * O]);
      for (std::size_t o = 0; o < O; ++o) y[b * O + o] += 0.05F * gauss(data_rng);  // label noise
    }
    const auto& w1 = model.fc1_w.value;
    const auto& b1 = model.fc1_b.value;
    const auto& w2 = model.fc2_w.value;
    const auto& b2 = model.fc2_b.value;

    // fc1 (column-parallel): this rank's h hidden units, from the full input; no communication.
    z.assign(B * H, 0.0F);
    a.assign(B * H, 0.0F);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t j = 0; j < H; ++j) {
        float s = b1[j];
        for (std::size_t k = 0; k < I; ++k) s += w1[j * I + k] * x[b * I + k];
        z[b * H + j] = s;
        a[b * H + j] = gelu(s);
      }
    // fc2 (row-parallel): a partial output from this rank's hidden units, summed over ranks.
    yhat.assign(B * O, 0.0F);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t o = 0; o < O; ++o) {
        float s = 0;
        for (std::size_t j = 0; j < H; ++j) s += w2[o * H + j] * a[b * H + j];
        yhat[b * O + o] = s;
      }
    MPI_Allreduce(MPI_IN_PLACE, yhat.data(), static_cast<int>(yhat.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t o = 0; o < O; ++o) yhat[b * O + o] += b2[o];

    // Mean squared error. yhat is the same on every rank, so the loss and dL/dyhat are too.
    double loss = 0;
    dy.resize(B * O);
    const float scale = 2.0F / static_cast<float>(B * O);
    for (std::size_t i = 0; i < B * O; ++i) {
      const float d = yhat[i] - y[i];
      loss += double(d) * double(d);
      dy[i] = scale * d;
    }
    loss /= static_cast<double>(B * O);

    // Backward. Each rank's gradients are those of the elements it holds, so none needs
    // communication here (Megatron all-reduces fc1's input gradient, which only matters when
    // a layer below it has weights; the input here has none). fc2's bias gradient comes from
    // dy alone and is therefore equal on all ranks: the replicas stay equal.
    for (auto* p : model.parameters()) std::fill(p->grad.begin(), p->grad.end(), 0.0F);
    auto& g1 = model.fc1_w.grad;
    auto& gb1 = model.fc1_b.grad;
    auto& g2 = model.fc2_w.grad;
    auto& gb2 = model.fc2_b.grad;
    dz.assign(B * H, 0.0F);
    for (std::size_t b = 0; b < B; ++b) {
      for (std::size_t o = 0; o < O; ++o) {
        const float d = dy[b * O + o];
        gb2[o] += d;
        for (std::size_t j = 0; j < H; ++j) {
          g2[o * H + j] += d * a[b * H + j];
          dz[b * H + j] += d * w2[o * H + j];
        }
      }
      for (std::size_t j = 0; j < H; ++j) {
        const float d = dz[b * H + j] * gelu_grad(z[b * H + j]);
        gb1[j] += d;
        for (std::size_t k = 0; k < I; ++k) g1[j * I + k] += d * x[b * I + k];
      }
    }
    optimizer.update();
    return loss;
  }
};

// ---------------------------------------------------------------------------------------------
// Loss files: "step loss" per line, the loss in a form that reads back exactly
// ---------------------------------------------------------------------------------------------

fs::path loss_file(const std::string& dir, int world, bool resumed) {
  return fs::path(dir) / ("losses_np" + std::to_string(world) + (resumed ? "_resumed" : "") + ".txt");
}

void write_losses(const fs::path& path, const std::map<std::uint64_t, double>& losses, const std::string& header) {
  const fs::path temp = path.string() + ".tmp";
  {
    std::ofstream f(temp);
    f << "# " << header << "\n";
    char buf[64];
    for (const auto& [step, loss] : losses) {
      std::snprintf(buf, sizeof buf, "%llu %.17g\n", ull(step), loss);
      f << buf;
    }
    if (!f.flush()) throw std::runtime_error("cannot write " + temp.string());
  }
  fs::rename(temp, path);
}

// The reference a resumed run is checked against: the losses of the run that started from
// scratch in DIR (a fresh run empties DIR, so there is one), whichever run saved the tag loaded.
struct reference {
  fs::path path;
  int np = 0;
  std::map<std::uint64_t, double> losses;
};

reference read_reference(const std::string& dir) {
  reference r;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    int np = 0;
    char tail[8] = {};
    if (std::sscanf(name.c_str(), "losses_np%d%7s", &np, tail) != 2 || std::string_view(tail) != ".txt") continue;
    if (r.np) throw std::runtime_error(dir + " holds both " + r.path.filename().string() + " and " + name);
    r.path = e.path();
    r.np = np;
  }
  if (!r.np) throw std::runtime_error("no losses_npP.txt under " + dir + ": run the saving job (without --resume) first");
  std::ifstream f(r.path);
  for (std::string line; std::getline(f, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream is(line);
    ull step = 0;
    double loss = 0;
    if (!(is >> step >> loss)) throw std::runtime_error(r.path.string() + ": malformed line '" + line + "'");
    r.losses[step] = loss;
  }
  return r;
}

// Empties DIR for a fresh run, refusing anything this program would not have written there.
void clear_run_dir(const fs::path& dir) {
  if (!fs::exists(dir)) return;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    const bool ours = name == "latest" || name == ".ckpt_lock" || name.starts_with("latest.tmp.") ||
                      name.starts_with("global_step") || (name.starts_with("losses_np") && name.ends_with(".txt"));
    if (!ours)
      throw std::runtime_error(dir.string() + " holds " + name +
                               ", which this program did not write; remove it or choose another --save directory");
  }
  for (const auto& e : fs::directory_iterator(dir)) fs::remove_all(e.path());
}

// ---------------------------------------------------------------------------------------------
// One MPI job: train, save, resume, check
// ---------------------------------------------------------------------------------------------

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The losses of steps [from, to] against the reference; prints a table and PASS or FAIL.
bool check_losses(const std::map<std::uint64_t, double>& mine, const reference& reference, std::uint64_t from,
                  std::uint64_t to, int world, double rtol) {
  const auto& ref = reference.losses;
  const int saved_world = reference.np;
  if (from > to) {
    std::printf("tensor_parallel check: FAIL - the resumed run trained no steps (resumed at %llu, --steps %llu)\n",
                ull(from - 1), ull(to));
    return false;
  }
  std::printf("check: step   loss np=%-2d          loss np=%-2d          rel diff\n", saved_world, world);
  double worst = 0;
  std::uint64_t worst_step = from, bad = 0, identical = 0;
  for (std::uint64_t s = from; s <= to; ++s) {
    auto r = ref.find(s);
    auto m = mine.find(s);
    if (r == ref.end()) {
      std::printf("tensor_parallel check: FAIL - %s has no loss for step %llu (it holds steps %llu..%llu)\n",
                  reference.path.c_str(), ull(s), ull(ref.empty() ? 0 : ref.begin()->first),
                  ull(ref.empty() ? 0 : ref.rbegin()->first));
      return false;
    }
    const double a = r->second, b = m->second;
    const double rel = std::fabs(a - b) / std::max(std::fabs(a), 1e-30);
    if (a == b) ++identical;
    if (!(rel <= rtol)) ++bad;  // NaN fails
    if (!(rel <= worst)) {
      worst = rel;
      worst_step = s;
    }
    if (s == from || s == to || s % 25 == 0 || (bad == 1 && !(rel <= rtol)))
      std::printf("check: %5llu  %.9f  %.9f  %.2e%s\n", ull(s), a, b, rel, rel <= rtol ? "" : "  <-- outside rtol");
  }
  const auto n = to - from + 1;
  if (bad) {
    std::printf("tensor_parallel check: FAIL - %llu of %llu steps (%llu..%llu) at tp=%d differ from the tp=%d run by "
                "more than rtol %.1e; worst %.3e at step %llu (%.9f vs %.9f)\n",
                ull(bad), ull(n), ull(from), ull(to), world, saved_world, rtol, worst, ull(worst_step),
                ref.at(worst_step), mine.at(worst_step));
    return false;
  }
  std::printf("tensor_parallel check: PASS - steps %llu..%llu resumed at tp=%d match the tp=%d run within rtol %.0e "
              "(max rel diff %.2e at step %llu; %llu of %llu bit-identical)\n",
              ull(from), ull(to), world, saved_world, rtol, worst, ull(worst_step), ull(identical), ull(n));
  return true;
}

int train(const options& o) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const auto tp = static_cast<std::size_t>(world);
  if (o.hidden % tp != 0)
    throw std::runtime_error("--hidden " + std::to_string(o.hidden) + " is not divisible by tp=" + std::to_string(tp));
  const bool root = rank == 0;
  const std::uint64_t save_at = o.save_at.value_or(o.steps / 2);
  const ckpt::config config = make_config(o);
  const auto t0 = std::chrono::steady_clock::now();

  if (!o.resume && root) clear_run_dir(o.save_dir);
  MPI_Barrier(MPI_COMM_WORLD);

  trainer t(o, tp, static_cast<std::size_t>(rank));
  // Every rank is one tensor-parallel rank: tp = world size, pp = dp = 1.
  ckpt::checkpointer<ckpt::megatron<ckpt::mpi>, ckpt::posix> cp{{.tp = static_cast<std::uint32_t>(world)}, o.save_dir};
  if (root)
    std::printf("tensor_parallel: tp=%d, MLP %zu -> %zu -> %zu (%zu hidden units per rank), Adam lr %g, batch %zu\n",
                world, o.in, o.hidden, o.out, t.model.h, double(o.lr), o.batch);

  std::uint64_t step = 0;
  if (o.resume) {
    const auto t1 = std::chrono::steady_clock::now();
    // Per-rank values (the data RNG, its distribution, Adam's step) cannot be restored rank
    // for rank when tp changes: there is no "rank 3" at tp=2. In this state they are equal on
    // every rank by construction (one seed, the same draws everywhere), so rank 0's copy is
    // every rank's copy: from_rank_0 restores them exactly. keep_live would be wrong here: the
    // data RNG would restart from the seed and the resumed run would replay the batches of
    // steps 1, 2, ... instead of drawing those of steps S+1, S+2, ... A value that genuinely
    // differs per rank (e.g. a dropout RNG seeded with the tp rank) has no correct restore
    // across a topology change; re-derive it from the seed and the rank instead.
    const auto r = cp.load(t, {.config = config, .on_topology_change = ckpt::topology_change::from_rank_0});
    step = r.iteration;
    if (root)
      std::printf("resumed: tag=%s iteration=%llu, saved with %s, loaded at tp=%d (%.2f MB read in %.1f ms)\n",
                  r.tag.c_str(), ull(step), ckpt::to_string(r.topology).c_str(), world, double(r.bytes_read) / 1e6,
                  1e3 * seconds_since(t1));
  }
  const std::uint64_t first = step + 1;

  std::map<std::uint64_t, double> losses;
  while (step < o.steps) {
    const double loss = t.step();
    ++step;
    losses[step] = loss;
    if (root && (step == 1 || step == first || step % 25 == 0 || step == o.steps || step == save_at)) {
      // Each batch is new data, so single losses are noisy; the mean shows the trend.
      double sum = 0;
      auto it = losses.lower_bound(step > 25 ? step - 24 : 1);
      const auto n = std::distance(it, losses.end());
      for (; it != losses.end(); ++it) sum += it->second;
      std::printf("step %5llu  loss %.9f  (mean of last %2lld: %.6f)\n", ull(step), loss, static_cast<long long>(n),
                  sum / static_cast<double>(n));
    }
    if (step == save_at) {
      const auto t1 = std::chrono::steady_clock::now();
      cp.save(step, t, {.config = config});
      if (root) std::printf("saved: global_step%llu at tp=%d in %.1f ms\n", ull(step), world, 1e3 * seconds_since(t1));
    }
  }
  if (root) {
    std::printf("trained steps %llu..%llu in %.2f s\n", ull(first), ull(o.steps), seconds_since(t0));
    std::string header = "tensor_parallel np=" + std::to_string(world) + " steps " + std::to_string(first) + ".." +
                         std::to_string(o.steps);
    write_losses(loss_file(o.save_dir, world, o.resume), losses, header);
  }

  int ok = 1;
  if (o.check) {
    if (root) {
      if (!o.resume || first == 1) {
        std::printf("tensor_parallel check: FAIL - --check needs a resumed run (--resume and a checkpoint under %s)\n",
                    o.save_dir.c_str());
        ok = 0;
      } else {
        try {
          ok = check_losses(losses, read_reference(o.save_dir), first, o.steps, world, o.rtol) ? 1 : 0;
        } catch (const std::exception& e) {
          std::printf("tensor_parallel check: FAIL - %s\n", e.what());
          ok = 0;
        }
      }
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);  // every rank exits with the verdict
  }
  return ok ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------
// --check-all: both MPI jobs in order, for the test suite (no shell involved)
// ---------------------------------------------------------------------------------------------

int run_job(const options& o, int np, std::vector<std::string> extra) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();  // Linux's name for this binary
  std::vector<std::string> args = {o.mpirun};
  if (geteuid() == 0) args.push_back("--allow-run-as-root");  // Open MPI refuses root otherwise
  // --oversubscribe: the test suite may have fewer cores than ranks.
  char rtol[32];
  std::snprintf(rtol, sizeof rtol, "%.17g", o.rtol);
  const std::vector<std::string> rest = {"--oversubscribe", "-np",     std::to_string(np),     self,
                                         "--save",          o.check_all_dir, "--steps", std::to_string(o.steps),
                                         "--seed",          std::to_string(o.seed),  "--hidden", std::to_string(o.hidden),
                                         "--batch",         std::to_string(o.batch), "--rtol",   rtol};
  args.insert(args.end(), rest.begin(), rest.end());
  args.insert(args.end(), extra.begin(), extra.end());
  std::string shown;
  for (const auto& a : args) shown += (shown.empty() ? "" : " ") + a;
  std::printf("$ %s\n", shown.c_str());
  std::fflush(stdout);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, o.mpirun.c_str(), nullptr, nullptr, argv.data(), environ);
  if (rc != 0) throw std::runtime_error("cannot start " + o.mpirun + ": " + std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

int check_all(const options& o) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_RANK"))
    throw std::runtime_error("--check-all starts mpirun itself: run it directly, not under mpirun");
  const std::uint64_t s = o.save_at.value_or(o.steps / 2);
  if (s == 0 || s >= o.steps) throw std::runtime_error("--save-at must lie in (0, --steps)");
  const auto t0 = std::chrono::steady_clock::now();
  std::printf("[1/2] tp=%d: train steps 1..%llu, save at step %llu\n", o.np_save, ull(o.steps), ull(s));
  if (int rc = run_job(o, o.np_save, {"--save-at", std::to_string(s)}); rc != 0) {
    std::printf("tensor_parallel check: FAIL - the tp=%d run exited with status %d\n", o.np_save, rc);
    return 1;
  }
  const double t1 = seconds_since(t0);
  std::printf("[2/2] tp=%d: resume from latest, train steps %llu..%llu, compare the losses\n", o.np_resume,
              ull(s + 1), ull(o.steps));
  const int rc = run_job(o, o.np_resume, {"--resume", "--check"});
  std::printf("[done] tp=%d run %.2f s, tp=%d run %.2f s: %s\n", o.np_save, t1, o.np_resume, seconds_since(t0) - t1,
              rc == 0 ? "PASS" : "FAIL");
  return rc == 0 ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------

constexpr const char* usage =
    "usage: mpirun -np P tensor_parallel --save DIR [--steps N] [--save-at S] [--resume] [--check] [--rtol R]\n"
    "       tensor_parallel --check-all DIR [--mpirun PATH] [--np-save P] [--np-resume Q] [--steps N] [--save-at S]\n"
    "options: --seed X --hidden H --batch B  (H must be divisible by every P used)\n"
    "  --save DIR       train at tp=P (the MPI world size); checkpoints go under DIR, every step's\n"
    "                   loss to DIR/losses_npP.txt (DIR/losses_npP_resumed.txt with --resume)\n"
    "  --save-at S      save at step S (default N/2) if this run reaches it\n"
    "  --resume         continue from DIR/latest, whatever tp it was saved with\n"
    "  --check          after --resume: compare each step's loss with that of the run that started\n"
    "                   DIR from scratch (DIR/losses_npP.txt), within --rtol (default 1e-4); print\n"
    "                   PASS, or FAIL and exit 1\n"
    "  --check-all DIR  run both jobs through mpirun (P=4, then Q=2) and report PASS or FAIL\n";

std::optional<options> parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const bool has_value = i + 1 < argc;
    auto number = [&](auto& out) {
      char* end = nullptr;
      const char* text = argv[++i];
      using T = std::remove_reference_t<decltype(out)>;
      if constexpr (std::is_floating_point_v<T>) {
        out = static_cast<T>(std::strtod(text, &end));
      } else {
        if (text[0] == '-') throw std::runtime_error(std::string(a) + " needs a positive number");
        out = static_cast<T>(std::strtoull(text, &end, 10));
      }
      if (*end != '\0' || text[0] == '\0') throw std::runtime_error(std::string(a) + " needs a number");
    };
    if (a == "--resume") o.resume = true;
    else if (a == "--check") o.check = true;
    else if (!has_value) return std::nullopt;
    else if (a == "--save") o.save_dir = argv[++i];
    else if (a == "--check-all") o.check_all_dir = argv[++i];
    else if (a == "--mpirun") o.mpirun = argv[++i];
    else if (a == "--steps") number(o.steps);
    else if (a == "--save-at") number(o.save_at.emplace());
    else if (a == "--rtol") number(o.rtol);
    else if (a == "--np-save") number(o.np_save);
    else if (a == "--np-resume") number(o.np_resume);
    else if (a == "--seed") number(o.seed);
    else if (a == "--hidden") number(o.hidden);
    else if (a == "--batch") number(o.batch);
    else return std::nullopt;
  }
  if (o.save_dir.empty() == o.check_all_dir.empty() || o.batch == 0 || o.hidden == 0 || o.np_save <= 0 ||
      o.np_resume <= 0)
    return std::nullopt;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<options> o;
  try {
    o = parse(argc, argv);
    if (!o) {
      std::fputs(usage, stderr);
      return 2;
    }
    if (!o->check_all_dir.empty()) return check_all(*o);  // not an MPI process itself
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tensor_parallel: %s\n", e.what());
    return 1;
  }

  MPI_Init(&argc, &argv);
  int rc = 1;
  try {
    rc = train(*o);
  } catch (const std::exception& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::string what = e.what();
    if (const auto* ce = dynamic_cast<const ckpt::error*>(&e))
      what = "ckpt error (" + std::string(ckpt::to_string(ce->kind())) + "): " + what;
    std::fprintf(stderr, "tensor_parallel (rank %d): %s\n", rank, what.c_str());
    // ckpt's calls fail on every rank together, but an error of this program's own (a file
    // rank 0 cannot write) may reach one rank only: abort the job rather than leave the
    // others waiting in a collective.
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
