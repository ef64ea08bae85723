// libtorch_resume: a LibTorch C++ training run that is killed mid-training and resumed from
// its last checkpoint ends bit-for-bit where an uninterrupted run ends.
//
// The model is a small MLP with LayerNorm and dropout, trained with AdamW to imitate a fixed
// random "teacher" network on batches drawn from LibTorch's default CPU generator, which also
// drives dropout. Its checkpoint() is three lines (see `trainer` below):
//
//   v.group("model", ckpt::libtorch::module(*net));          every parameter and buffer, by name
//   v.group("optimizer", ckpt::libtorch::optimizer(opt));    AdamW's moments, steps and options
//   v.value("rng", ckpt::libtorch::generator());             the CPU generator: data and dropout
//
// The optimizer of a resumed run has never stepped, so LibTorch has made none of its state yet:
// the adapter creates it from the checkpoint. Leave out any line and the resumed run drifts.
//
//   libtorch_resume --save DIR --steps N --save-interval K [--resume] [--crash-at S]
//   libtorch_resume --check DIR    uninterrupted run, SIGKILLed run, resumed run; compares the
//                                  final loss and state hashes bit for bit (resume_check.hpp)

#include <torch/torch.h>

#include <bit>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <xxhash.h>

#include <ckpt/adapters/libtorch.hpp>
#include <ckpt/ckpt.hpp>

#include "resume_check.hpp"

namespace {

using ull = unsigned long long;

struct options {
  std::string save_dir, check_dir;
  std::uint64_t steps = 120, save_interval = 25;
  std::optional<std::uint64_t> crash_at;
  bool resume = false, quiet = false;
  // Hyper-parameters: stored in every checkpoint's config and compared on load.
  std::uint64_t seed = 7;
  std::int64_t hidden = 64, batch = 32;
  double lr = 2e-3;
};

constexpr std::int64_t inputs = 16, outputs = 4;

struct mlpImpl : torch::nn::Module {  // LibTorch's naming: TORCH_MODULE(mlp) wraps mlpImpl
  explicit mlpImpl(std::int64_t hidden) {
    fc1 = register_module("fc1", torch::nn::Linear(inputs, hidden));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
    out = register_module("out", torch::nn::Linear(hidden, outputs));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::gelu(norm(fc1(x)));
    x = torch::dropout(torch::gelu(fc2(x)), 0.1, is_training());
    return out(x);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, out{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(mlp);

/// Everything a step depends on, and the three lines that checkpoint it.
struct trainer {
  mlp net;
  torch::optim::AdamW opt;
  explicit trainer(const options& o)
      : net(o.hidden), opt(net->parameters(), torch::optim::AdamWOptions(o.lr).weight_decay(0.01)) {}

  template <class V>
  void checkpoint(V& v) {
    v.group("model", ckpt::libtorch::module(*net));
    v.group("optimizer", ckpt::libtorch::optimizer(opt));
    v.value("rng", ckpt::libtorch::generator());
  }
};

/// One AdamW step on a fresh batch; the batch and dropout come from the default CPU generator.
double train_step(trainer& t, torch::nn::Linear& teacher, std::int64_t batch) {
  t.net->train();
  const auto x = torch::randn({batch, inputs});
  torch::Tensor y;
  {
    torch::NoGradGuard no_grad;
    y = teacher(x) + 0.01 * torch::randn({batch, outputs});
  }
  t.opt.zero_grad();
  auto loss = torch::mse_loss(t.net->forward(x), y);
  loss.backward();
  t.opt.step();
  return loss.item<double>();
}

/// Loss on a fixed evaluation set, drawn from its own generator so it changes no state.
double eval_loss(trainer& t, torch::nn::Linear& teacher, std::uint64_t seed) {
  torch::NoGradGuard no_grad;
  t.net->eval();
  auto g = at::detail::createCPUGenerator(seed + 1000);
  const auto x = torch::randn({256, inputs}, g);
  return torch::mse_loss(t.net->forward(x), teacher(x)).item<double>();
}

void hash_tensor(XXH3_state_t* h, const torch::Tensor& t) {
  const auto c = t.contiguous();
  XXH3_64bits_update(h, c.data_ptr(), c.numel() * c.element_size());
}

/// XXH3 of the weights (and, with everything, of the optimizer state and the generator).
std::uint64_t state_hash(trainer& t, bool everything) {
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  for (const auto& p : t.net->named_parameters()) hash_tensor(h, p.value());
  for (const auto& b : t.net->named_buffers()) hash_tensor(h, b.value());
  if (everything) {
    for (const auto& p : t.net->parameters()) {
      const auto it = t.opt.state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
      if (it == t.opt.state().end()) continue;
      auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
      hash_tensor(h, s.exp_avg());
      hash_tensor(h, s.exp_avg_sq());
      const std::int64_t step = s.step();
      XXH3_64bits_update(h, &step, sizeof step);
    }
    hash_tensor(h, at::detail::getDefaultCPUGenerator().get_state());
  }
  const auto d = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  return d;
}

int train(const options& o) {
  // The same start for every run: the teacher and the initial weights come from the seed; a
  // resumed run then replaces the weights, the optimizer and the generator from its checkpoint.
  torch::manual_seed(o.seed);
  torch::nn::Linear teacher(inputs, outputs);
  trainer t(o);
  const ckpt::config config{{"hidden", o.hidden}, {"batch", o.batch}, {"lr", o.lr}, {"seed", o.seed}};
  ckpt::checkpointer<ckpt::single_process, ckpt::posix> cp{{}, o.save_dir, {.keep_last_n = 3}};

  std::uint64_t step = 0;
  if (o.resume && cp.latest()) {
    const auto r = cp.load(t, {.config = config});
    step = r.iteration;
    std::printf("resumed: tag=%s iteration=%llu\n", r.tag.c_str(), ull(step));
  }
  std::uint64_t last_saved = step;
  while (step < o.steps) {
    const double loss = train_step(t, teacher, o.batch);
    ++step;
    if (!o.quiet && (step % 20 == 0 || step == 1)) std::printf("step %4llu  loss %.6f\n", ull(step), loss);
    if (o.crash_at && step == *o.crash_at) {
      // SIGKILL, like the OOM killer or a lost node: no destructors, no chance to save.
      std::printf("crash: killing the process at step %llu\n", ull(step));
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
    if (step % o.save_interval == 0) {
      cp.save(step, t, {.config = config});
      last_saved = step;
    }
  }
  if (last_saved != step) cp.save(step, t, {.config = config});
  const double loss = eval_loss(t, teacher, o.seed);
  std::printf("result: iteration=%llu eval_loss=%.9f eval_loss_bits=0x%016llx weights_xxh3=0x%016llx state_xxh3=0x%016llx\n",
              ull(step), loss, ull(std::bit_cast<std::uint64_t>(loss)), ull(state_hash(t, false)), ull(state_hash(t, true)));
  return 0;
}

constexpr const char* usage =
    "usage: libtorch_resume --save DIR [--steps N] [--save-interval K] [--resume] [--crash-at S]\n"
    "       libtorch_resume --check DIR [--steps N] [--save-interval K] [--crash-at S]\n"
    "options: --seed X --hidden H --batch B --quiet\n"
    "  --save DIR       train, saving a checkpoint every K steps and at the end under DIR\n"
    "  --resume         continue from DIR/latest when there is one\n"
    "  --crash-at S     die with SIGKILL right after step S (before any save at S)\n"
    "  --check DIR      run uninterrupted, crash, resume; compare the results bit for bit\n";

std::optional<options> parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto number = [&](auto& out) {
      char* end = nullptr;
      const auto x = std::strtoull(argv[++i], &end, 10);
      if (*end != '\0' || argv[i][0] == '\0' || argv[i][0] == '-') throw std::runtime_error(std::string(a) + " needs a number");
      out = static_cast<std::remove_reference_t<decltype(out)>>(x);
    };
    if (a == "--resume") o.resume = true;
    else if (a == "--quiet") o.quiet = true;
    else if (i + 1 >= argc) return std::nullopt;
    else if (a == "--save") o.save_dir = argv[++i];
    else if (a == "--check") o.check_dir = argv[++i];
    else if (a == "--steps") number(o.steps);
    else if (a == "--save-interval") number(o.save_interval);
    else if (a == "--crash-at") number(o.crash_at.emplace());
    else if (a == "--seed") number(o.seed);
    else if (a == "--hidden") number(o.hidden);
    else if (a == "--batch") number(o.batch);
    else return std::nullopt;
  }
  if (o.save_dir.empty() == o.check_dir.empty() || o.save_interval == 0 || o.batch <= 0 || o.hidden <= 0) return std::nullopt;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto o = parse(argc, argv);
    if (!o) {
      std::fputs(usage, stderr);
      return 2;
    }
    torch::set_num_threads(1);  // bit-identical runs: the same reduction order every time
    if (!o->save_dir.empty()) return train(*o);
    return resume_check::run({.program = "libtorch_resume",
                              .flags = {"--steps", std::to_string(o->steps), "--save-interval", std::to_string(o->save_interval),
                                        "--seed", std::to_string(o->seed), "--hidden", std::to_string(o->hidden), "--batch",
                                        std::to_string(o->batch)},
                              .steps = o->steps,
                              .save_interval = o->save_interval,
                              .crash_at = o->crash_at,
                              .dir = o->check_dir});
  } catch (const ckpt::error& e) {
    std::fprintf(stderr, "libtorch_resume: ckpt error (%s): %s\n", std::string(ckpt::to_string(e.kind())).c_str(), e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "libtorch_resume: %s\n", e.what());
  }
  return 1;
}
