// ckpt's LibTorch adapter against LibTorch's own checkpointing, on examples/libtorch_resume's
// network made larger (Linear+LayerNorm blocks, --layers of them, --hidden wide) and its AdamW
// optimizer after one step, in one process:
//
//   torch     torch::save(net, f) and torch::save(opt, f2), then fsync of both; cold and warm
//             torch::load into a fresh network and a never-stepped optimizer
//   ckpt      cp.save(step, trainer) with the adapter's three lines (model, optimizer, CPU
//             generator), which fsyncs as part of its commit; cold and warm cp.load into a
//             fresh network and a never-stepped optimizer
//   raw       the same bytes written with O_DIRECT from an aligned buffer and fsync'd, read back
//             with O_DIRECT (bench/workload.hpp): the strictest baseline, the fastest this
//             machine moves these bytes without a checkpoint around them
//
// Every writer starts from the same conditions: what the others wrote is deleted, then sync
// and a pause (this VM's disk slows down for seconds after a burst of writes); rounds rotate
// the order. The cold loads drop the files from the page cache first. Prints each round, then
// the medians of each round's ratios.
//
//   bench/libtorch_adapter [--dir /var/tmp] [--hidden 2048] [--layers 8] [--rounds 5] [--pause 2]

#include <torch/torch.h>

#include <ckpt/adapters/libtorch.hpp>
#include <ckpt/ckpt.hpp>

#include "workload.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
using bench::since;
using clock_type = std::chrono::steady_clock;

struct netImpl : torch::nn::Module {  // examples/libtorch_resume.cpp's mlp, with more blocks
  netImpl(std::int64_t hidden, std::int64_t layers) {
    in = register_module("fc1", torch::nn::Linear(16, hidden));
    for (std::int64_t i = 0; i < layers; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i), torch::nn::Linear(hidden, hidden)));
      norms.push_back(register_module("norm" + std::to_string(i), torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden}))));
    }
    out = register_module("out", torch::nn::Linear(hidden, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = in(x);
    for (std::size_t i = 0; i < blocks.size(); ++i) x = torch::gelu(norms[i](blocks[i](x)));
    return out(torch::dropout(x, 0.1, is_training()));
  }
  torch::nn::Linear in{nullptr}, out{nullptr};
  std::vector<torch::nn::Linear> blocks;
  std::vector<torch::nn::LayerNorm> norms;
};
TORCH_MODULE(net);

struct trainer {
  net model;
  torch::optim::AdamW opt;
  trainer(std::int64_t hidden, std::int64_t layers) : model(hidden, layers), opt(model->parameters(), torch::optim::AdamWOptions(1e-3)) {}
  template <class V>
  void checkpoint(V& v) {
    v.group("model", ckpt::libtorch::module(*model));
    v.group("optimizer", ckpt::libtorch::optimizer(opt));
    v.value("rng", ckpt::libtorch::generator());
  }
  void step() {
    opt.zero_grad();
    model->forward(torch::randn({8, 16})).pow(2).mean().backward();
    opt.step();
  }
};

/// The trainer's tensors (parameters, then each parameter's moments) as one bench::state, for
/// the raw baseline: the same bytes in 64-byte aligned buffers.
bench::state raw_copy(trainer& t) {
  bench::state s;
  auto add = [&](const torch::Tensor& x) {
    auto& b = s.tensors.emplace_back();
    b.type = ckpt::dtype::f32;
    b.shape = {static_cast<std::uint64_t>(x.numel())};
    b.block.resize(x.numel() * x.element_size());
    std::memcpy(b.data(), x.data_ptr(), b.size());
  };
  for (const auto& p : t.model->parameters()) {
    add(p);
    const auto it = t.opt.state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
    if (it == t.opt.state().end()) bench::die("a parameter without optimizer state");
    const auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
    add(st.exp_avg());
    add(st.exp_avg_sq());
  }
  return s;
}

bool same_model(trainer& a, trainer& b) {
  const auto pa = a.model->parameters(), pb = b.model->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i)
    if (!torch::equal(pa[i], pb[i])) return false;
  return a.opt.state().size() == b.opt.state().size();
}

void fsync_file(const fs::path& f) {
  const int fd = ::open(f.c_str(), O_RDONLY);
  if (fd < 0) bench::die("open " + f.string());
  if (::fsync(fd) != 0) bench::die("fsync " + f.string());
  ::close(fd);
}

void settle(const fs::path& dir, double pause) {
  for (const auto& e : fs::directory_iterator(dir)) fs::remove_all(e.path());
  ::sync();
  std::this_thread::sleep_for(std::chrono::duration<double>(pause));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/var/tmp/ckpt-libtorch-bench";
  std::int64_t hidden = 2048, layers = 8;
  int rounds = 5;
  double pause = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--dir") dir = v;
    else if (a == "--hidden") hidden = std::stoll(v);
    else if (a == "--layers") layers = std::stoll(v);
    else if (a == "--rounds") rounds = std::stoi(v);
    else if (a == "--pause") pause = std::stod(v);
    else bench::die("unknown option " + a);
  }
  torch::set_num_threads(1);
  fs::create_directories(dir);
  torch::manual_seed(1);
  trainer t(hidden, layers);
  t.step();  // the optimizer's state exists, as in a run that checkpoints
  auto raw = raw_copy(t);
  std::printf("state: %d Linear+LayerNorm blocks of %lld, AdamW after one step: %.1f MiB\n", static_cast<int>(layers),
              static_cast<long long>(hidden), static_cast<double>(raw.bytes()) / (1 << 20));

  const fs::path torch_model = fs::path(dir) / "model.pt", torch_opt = fs::path(dir) / "optimizer.pt";
  const fs::path ckpt_root = fs::path(dir) / "ckpt", raw_file = fs::path(dir) / "raw.bin";
  std::map<std::string, std::vector<double>> ratio;  // per round: torch / ckpt, ckpt / raw
  std::printf("%5s %12s %12s %12s %14s %14s %14s %14s %14s\n", "round", "torch::save", "ckpt save", "raw save", "torch::load cold",
              "ckpt load cold", "raw load cold", "torch::load warm", "ckpt load warm");
  for (int round = 0; round < rounds; ++round) {
    std::map<std::string, double> s;
    const char* order[3][3] = {{"torch", "ckpt", "raw"}, {"ckpt", "raw", "torch"}, {"raw", "torch", "ckpt"}};
    for (const std::string who : order[round % 3]) {
      settle(dir, pause);
      auto t0 = clock_type::now();
      if (who == "torch") {
        torch::save(t.model, torch_model.string());
        torch::save(t.opt, torch_opt.string());
        fsync_file(torch_model);
        fsync_file(torch_opt);
        s["torch save"] = since(t0);
        bench::drop_cache(torch_model);
        bench::drop_cache(torch_opt);
        for (const char* temp : {"cold", "warm"}) {
          trainer fresh(hidden, layers);
          t0 = clock_type::now();
          torch::load(fresh.model, torch_model.string());
          torch::load(fresh.opt, torch_opt.string());
          s[std::string("torch load ") + temp] = since(t0);
          if (!same_model(t, fresh)) bench::die("torch::load gave other weights");
        }
      } else if (who == "ckpt") {
        ckpt::checkpointer<ckpt::single_process, ckpt::posix> cp{{}, ckpt_root.string()};
        cp.save(1, t);
        s["ckpt save"] = since(t0);
        bench::drop_cache(ckpt_root);
        for (const char* temp : {"cold", "warm"}) {
          if (std::string(temp) == "warm") bench::read_through_cache(ckpt_root);  // ckpt reads with O_DIRECT
          trainer fresh(hidden, layers);
          t0 = clock_type::now();
          cp.load(fresh);
          s[std::string("ckpt load ") + temp] = since(t0);
          if (!same_model(t, fresh)) bench::die("ckpt load gave other weights");
        }
      } else {
        bench::raw_write_direct(raw, raw_file);
        s["raw save"] = since(t0);
        bench::drop_cache(raw_file);
        t0 = clock_type::now();
        bench::raw_read_direct(raw, raw_file);
        s["raw load cold"] = since(t0);
      }
    }
    std::printf("%5d %12.3f %12.3f %12.3f %14.3f %14.3f %14.3f %14.3f %14.3f\n", round, s["torch save"], s["ckpt save"], s["raw save"],
                s["torch load cold"], s["ckpt load cold"], s["raw load cold"], s["torch load warm"], s["ckpt load warm"]);
    for (const auto* k : {"save", "load cold", "load warm"}) ratio[std::string("torch/ckpt ") + k].push_back(s[std::string("torch ") + k] / s[std::string("ckpt ") + k]);
    for (const auto* k : {"save", "load cold"}) ratio[std::string("ckpt/raw ") + k].push_back(s[std::string("ckpt ") + k] / s[std::string("raw ") + k]);
  }
  settle(dir, 0);
  std::printf("medians of the rounds' ratios (torch/ckpt: how many times faster ckpt is; ckpt/raw: ckpt's time over the O_DIRECT baseline's)\n");
  for (const auto& [k, v] : ratio) std::printf("  %-22s %.2f\n", k.c_str(), median(v));
  return 0;
}
