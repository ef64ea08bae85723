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
//   libtorch_resume --torn-save DIR  the crash safety torch::save lacks: a torch::save killed
//                                  halfway leaves a file torch::load refuses (the old model is
//                                  gone: torch::save truncates it first); ckpt saves killed at
//                                  random moments always leave a `latest` that loads

#include <torch/torch.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

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
  bool resume = false, quiet = false, torn = false;
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

// ---------------------------------------------------------------------------------------------
// --torn-save: what a crash in the middle of a save does to torch::save, and to ckpt
// ---------------------------------------------------------------------------------------------

namespace fs = std::filesystem;

/// An output file that dies with SIGKILL once `limit` bytes are written, as a process killed in
/// the middle of a save does. Opened like std::ofstream opens torch::save's file: truncated.
class torn_file : public std::streambuf {
 public:
  torn_file(const fs::path& f, std::size_t limit) : fd_(::open(f.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644)), limit_(limit) {
    if (fd_ < 0) throw std::runtime_error("open " + f.string());
  }

 protected:
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    for (std::streamsize i = 0; i < n;) {
      const auto k = std::min<std::streamsize>(n - i, static_cast<std::streamsize>(limit_ - written_));
      if (k > 0 && ::write(fd_, s + i, static_cast<std::size_t>(k)) != k) return i;
      i += k;
      written_ += static_cast<std::size_t>(k);
      if (written_ >= limit_) std::raise(SIGKILL);
    }
    return n;
  }
  int_type overflow(int_type c) override {
    if (c == traits_type::eof()) return traits_type::not_eof(c);
    const char ch = traits_type::to_char_type(c);
    return xsputn(&ch, 1) == 1 ? c : traits_type::eof();
  }

 private:
  int fd_;
  std::size_t limit_, written_ = 0;
};

/// Runs `child` in a forked process and waits for it; true when SIGKILL ended it.
template <class F>
bool killed_child(F&& child) {
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    child();
    std::_Exit(0);
  }
  return WIFSIGNALED(resume_check::wait_for(pid)) != 0;
}

int torn_save(const options& o) {
  const fs::path dir = o.check_dir;
  fs::create_directories(dir);
  torch::manual_seed(o.seed);
  torch::nn::Linear teacher(inputs, outputs);
  trainer t(o);
  train_step(t, teacher, o.batch);

  // LibTorch: the good model in model.pt, then a save of the next step killed halfway through.
  const auto pt = dir / "model.pt";
  torch::save(t.net, pt.string());
  const auto good_size = fs::file_size(pt);
  const bool killed = killed_child([&] {
    train_step(t, teacher, o.batch);
    torn_file file(pt, good_size / 2);
    std::ostream os(&file);
    torch::save(t.net, os);
  });
  std::printf("torch::save killed halfway: %s, model.pt now %llu of %llu bytes\n", killed ? "yes" : "no",
              ull(fs::file_size(pt)), ull(good_size));
  bool torch_lost = false;
  try {
    mlp back(o.hidden);
    torch::load(back, pt.string());
    std::printf("  torch::load(model.pt): loaded\n");
  } catch (const std::exception& e) {
    torch_lost = true;
    std::printf("  torch::load(model.pt): fails (%s): the last good model is gone\n", std::string(e.what()).substr(0, 80).c_str());
  }

  // ckpt: a good checkpoint, then saves killed at random moments, over and over.
  const auto root = dir / "ckpt";
  fs::remove_all(root);
  {
    ckpt::checkpointer<ckpt::single_process, ckpt::posix> cp{{}, root.string(), {.keep_last_n = 2}};
    cp.save(1, t);
  }
  std::mt19937 rng(static_cast<std::uint32_t>(o.seed));
  int ckpt_ok = 0;
  const int kills = 5;
  for (int k = 0; k < kills; ++k) {
    const auto delay = std::chrono::microseconds(std::uniform_int_distribution<int>(2'000, 40'000)(rng));
    std::fflush(stdout);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {  // saves every step until killed
      ckpt::checkpointer<ckpt::single_process, ckpt::posix> cp{{}, root.string(), {.keep_last_n = 2}};
      for (std::uint64_t step = 2 + static_cast<std::uint64_t>(k) * 1000;; ++step) {
        train_step(t, teacher, o.batch);
        cp.save(step, t);
      }
    }
    std::this_thread::sleep_for(delay);
    ::kill(pid, SIGKILL);
    resume_check::wait_for(pid);
    trainer back(o);
    ckpt::checkpointer<ckpt::single_process, ckpt::posix> cp{{}, root.string()};
    const auto r = cp.load(back);  // strict: every tensor, checked
    ++ckpt_ok;
    std::printf("  ckpt save killed after %5.1f ms: latest %s loads\n", static_cast<double>(delay.count()) / 1000, r.tag.c_str());
  }
  const bool pass = killed && torch_lost && ckpt_ok == kills;
  std::printf("torn save: %s - torch::save %s its file when killed mid-save; ckpt's latest loaded after %d of %d kills\n",
              pass ? "SHOWN" : "NOT SHOWN", torch_lost ? "destroyed" : "kept", ckpt_ok, kills);
  return pass ? 0 : 1;
}

constexpr const char* usage =
    "usage: libtorch_resume --save DIR [--steps N] [--save-interval K] [--resume] [--crash-at S]\n"
    "       libtorch_resume --check DIR [--steps N] [--save-interval K] [--crash-at S]\n"
    "options: --seed X --hidden H --batch B --quiet\n"
    "  --save DIR       train, saving a checkpoint every K steps and at the end under DIR\n"
    "  --resume         continue from DIR/latest when there is one\n"
    "  --crash-at S     die with SIGKILL right after step S (before any save at S)\n"
    "  --check DIR      run uninterrupted, crash, resume; compare the results bit for bit\n"
    "       libtorch_resume --torn-save DIR\n"
    "  --torn-save DIR  kill torch::save halfway through (its file is lost) and ckpt saves at random moments\n"
    "                   (latest always loads)\n";

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
    else if (a == "--torn-save") o.check_dir = argv[++i], o.torn = true;
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
    if (o->torn) return torn_save(*o);
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
