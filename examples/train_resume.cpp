// train_resume: a run that is killed mid-training and resumed from its last checkpoint ends
// bit-for-bit where an uninterrupted run ends.
//
// The model is a small character-level language model (an MLP over the previous few
// characters, 7.7k parameters) trained in plain C++ on a few paragraphs of public-domain text,
// with Adam, dropout, Gaussian activation noise and shuffled batches. Every piece of state that
// decides what the next step computes is handed to ckpt:
//
//   model weights             v.tensor(...), 2-D weights through ckpt::view(vec, {rows, cols})
//   Adam moments and step     v.group("optimizer", ...), so a fine-tune can skip it on load
//   data order and cursor     v.tensor / v.value: which windows the next batch will hold
//   RNG engines               v.value(...): the shuffling, dropout and noise engines
//   distribution state        v.value(...): std::normal_distribution caches a second value
//   iteration                 cp.save(step, ...) stores it, cp.load(...).iteration returns it
//
// Leave any of these out and a resumed run drifts away from the uninterrupted one; the check
// below then fails.
//
//   train_resume --save DIR --steps N --save-interval K [--resume] [--crash-at S]
//   train_resume --check DIR     runs the whole proof in one command (resume_check.hpp):
//     1. an uninterrupted run to N steps                  (DIR/uninterrupted)
//     2. a run killed with SIGKILL at step S              (DIR/crashed)
//     3. a run that resumes DIR/crashed from `latest` to N
//   and compares the final loss and state hashes of 1 and 3 bit for bit.

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <xxhash.h>

#include <ckpt/ckpt.hpp>

#include "resume_check.hpp"  // --check: the crash-and-resume proof

namespace {

using ull = unsigned long long;  // what printf's %llu and %llx take

// Openings of "Pride and Prejudice" (Jane Austen, 1813) and "Alice's Adventures in Wonderland"
// (Lewis Carroll, 1865), both in the public domain.
constexpr std::string_view corpus = R"txt(
It is a truth universally acknowledged, that a single man in possession of a good fortune, must
be in want of a wife. However little known the feelings or views of such a man may be on his
first entering a neighbourhood, this truth is so well fixed in the minds of the surrounding
families, that he is considered the rightful property of some one or other of their daughters.
"My dear Mr. Bennet," said his lady to him one day, "have you heard that Netherfield Park is let
at last?" Mr. Bennet replied that he had not. "But it is," returned she; "for Mrs. Long has just
been here, and she told me all about it." Mr. Bennet made no answer. "Do you not want to know who
has taken it?" cried his wife impatiently. "You want to tell me, and I have no objection to
hearing it." This was invitation enough.
Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing
to do: once or twice she had peeped into the book her sister was reading, but it had no pictures
or conversations in it, "and what is the use of a book," thought Alice "without pictures or
conversations?" So she was considering in her own mind (as well as she could, for the hot day
made her feel very sleepy and stupid), whether the pleasure of making a daisy-chain would be
worth the trouble of getting up and picking the daisies, when suddenly a White Rabbit with pink
eyes ran close by her. There was nothing so very remarkable in that; nor did Alice think it so
very much out of the way to hear the Rabbit say to itself, "Oh dear! Oh dear! I shall be late!"
)txt";

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

struct options {
  std::string save_dir;
  std::string check_dir;
  std::uint64_t steps = 300;
  std::uint64_t save_interval = 50;
  std::optional<std::uint64_t> crash_at;
  bool resume = false;
  bool quiet = false;
  // Hyper-parameters: stored in every checkpoint's config and compared on load.
  std::uint64_t seed = 1234;
  std::size_t context = 4;
  std::size_t embed = 10;
  std::size_t hidden = 96;
  std::size_t batch = 32;
  float lr = 3e-3F;
  float dropout = 0.1F;
  float noise = 0.05F;
};

// What must not change between a save and a resume. The step count is left out on purpose:
// resuming with a longer horizon is legitimate.
ckpt::config make_config(const options& o, std::size_t vocab) {
  return {{"model", "char_mlp"},  {"vocab", vocab},      {"context", o.context}, {"embed", o.embed},
          {"hidden", o.hidden},   {"batch", o.batch},    {"lr", o.lr},           {"dropout", o.dropout},
          {"noise", o.noise},     {"seed", o.seed},      {"corpus_xxh3", XXH3_64bits(corpus.data(), corpus.size())}};
}

// ---------------------------------------------------------------------------------------------
// Data: lower-cased characters, single spaces; one example per window of `context` characters
// ---------------------------------------------------------------------------------------------

struct dataset {
  std::string vocab;                 // sorted distinct characters
  std::vector<std::uint8_t> tokens;  // the text as indices into vocab
};

dataset make_dataset(std::string_view text) {
  std::string clean;
  for (char c : text) {
    c = (c == '\n') ? ' ' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (c == ' ' && (clean.empty() || clean.back() == ' ')) continue;
    clean += c;
  }
  dataset d;
  d.vocab = clean;
  std::sort(d.vocab.begin(), d.vocab.end());
  d.vocab.erase(std::unique(d.vocab.begin(), d.vocab.end()), d.vocab.end());
  for (char c : clean) d.tokens.push_back(static_cast<std::uint8_t>(d.vocab.find(c)));
  return d;
}

// Draws training windows without replacement, in a fresh random order every epoch. The order
// and the cursor into it are training state: lose them and a resumed run sees other batches.
struct batch_sampler {
  std::mt19937_64 rng;
  std::vector<std::int32_t> order;
  std::uint64_t cursor = 0;
  std::uint64_t epoch = 0;

  batch_sampler(std::size_t examples, std::uint64_t seed) : rng(seed), order(examples) {
    std::iota(order.begin(), order.end(), 0);
    cursor = order.size();  // the first draw shuffles
  }

  void next(std::span<std::int32_t> out) {
    for (auto& x : out) {
      if (cursor == order.size()) {
        std::shuffle(order.begin(), order.end(), rng);
        cursor = 0;
        ++epoch;
      }
      x = order[cursor++];
    }
  }

  template <class V>
  void checkpoint(V& v) {
    v.value("rng", rng);
    v.tensor("order", order);
    v.value("cursor", cursor);
    v.value("epoch", epoch);
  }
};

// ---------------------------------------------------------------------------------------------
// Model: embeddings -> concat -> fc1 -> tanh -> dropout + noise -> fc2 -> softmax (next char)
// ---------------------------------------------------------------------------------------------

struct parameter {
  std::string name;
  std::vector<float> value, grad;
  parameter(std::string name_, std::size_t n) : name(std::move(name_)), value(n), grad(n) {}
};

struct char_mlp {
  std::size_t vocab, context, embed, hidden;
  parameter wte, fc1_w, fc1_b, fc2_w, fc2_b;  // row-major: fc1_w is [context*embed, hidden]

  char_mlp(std::size_t vocab_, const options& o)
      : vocab(vocab_), context(o.context), embed(o.embed), hidden(o.hidden), wte("wte.weight", vocab * embed),
        fc1_w("fc1.weight", context * embed * hidden), fc1_b("fc1.bias", hidden),
        fc2_w("fc2.weight", hidden * vocab), fc2_b("fc2.bias", vocab) {
    // A resumed run initialises too and then loads over it: one code path, and the init RNG is
    // not training state because nothing draws from it afterwards.
    std::mt19937_64 init(o.seed);
    auto fill = [&](parameter& p, double stddev) {
      std::normal_distribution<float> d(0.0F, static_cast<float>(stddev));
      for (auto& x : p.value) x = d(init);
    };
    fill(wte, 1.0);
    fill(fc1_w, 1.0 / std::sqrt(double(context * embed)));
    fill(fc2_w, 0.5 / std::sqrt(double(hidden)));
  }

  std::vector<parameter*> parameters() { return {&wte, &fc1_w, &fc1_b, &fc2_w, &fc2_b}; }
  std::size_t parameter_count() {
    std::size_t n = 0;
    for (auto* p : parameters()) n += p->value.size();
    return n;
  }

  template <class V>
  void checkpoint(V& v) {
    // A std::vector is saved as 1-D; ckpt::view gives the matrices their real shape, which
    // metadata.json records and a load checks.
    v.tensor(wte.name, ckpt::view(wte.value, {vocab, embed}));
    v.tensor(fc1_w.name, ckpt::view(fc1_w.value, {context * embed, hidden}));
    v.tensor(fc1_b.name, fc1_b.value);
    v.tensor(fc2_w.name, ckpt::view(fc2_w.value, {hidden, vocab}));
    v.tensor(fc2_b.name, fc2_b.value);
  }
};

// Adam (Kingma & Ba) with bias correction. `step` drives the correction, so it is state too.
struct adam {
  float lr, beta1 = 0.9F, beta2 = 0.999F, eps = 1e-8F;
  std::uint64_t step = 0;
  std::vector<std::vector<float>> m, v;  // one pair per model parameter, in parameters() order
  std::vector<std::string> names;

  adam(char_mlp& model, float lr_) : lr(lr_) {
    for (auto* p : model.parameters()) {
      names.push_back(p->name);
      m.emplace_back(p->value.size());
      v.emplace_back(p->value.size());
    }
  }

  void update(char_mlp& model) {
    ++step;
    const double c1 = 1.0 - std::pow(double(beta1), double(step));
    const double c2 = 1.0 - std::pow(double(beta2), double(step));
    const auto lr_t = static_cast<float>(lr * std::sqrt(c2) / c1);
    auto params = model.parameters();
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
    for (std::size_t i = 0; i < m.size(); ++i) {
      vis.tensor("exp_avg." + names[i], m[i]);
      vis.tensor("exp_avg_sq." + names[i], v[i]);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// The training state: everything checkpoint() names is saved, and nothing else affects training
// ---------------------------------------------------------------------------------------------

struct trainer {
  const dataset& data;
  options hp;
  char_mlp model;
  adam optimizer;
  batch_sampler sampler;
  std::mt19937 dropout_rng;
  std::bernoulli_distribution keep;  // holds only its probability: nothing to save
  std::mt19937_64 noise_rng;
  // Generates values in pairs and keeps the second for the next call, so after an odd number
  // of draws the engine alone does not say what comes next: the distribution is state too.
  std::normal_distribution<float> noise;
  std::vector<float> x, h, a, mask, logits, dh, dx;  // scratch of example(), not state

  trainer(const dataset& d, const options& o)
      : data(d), hp(o), model(d.vocab.size(), o), optimizer(model, o.lr),
        sampler(d.tokens.size() - o.context, o.seed + 1), dropout_rng(static_cast<std::uint32_t>(o.seed + 2)),
        keep(1.0 - o.dropout), noise_rng(o.seed + 3), noise(0.0F, o.noise) {}

  template <class V>
  void checkpoint(V& v) {
    v.group("model", model);
    v.group("optimizer", optimizer);
    v.group("data", sampler);
    v.value("rng.dropout", dropout_rng);
    v.value("rng.noise", noise_rng);
    v.value("rng.noise_dist", noise);
  }

  // Loss of window i (characters i .. i+context-1 predict character i+context). With `train`,
  // applies dropout and noise and adds the gradient, scaled by `gscale`, into each grad.
  double example(std::size_t i, bool train, float gscale) {
    const auto C = model.context, E = model.embed, H = model.hidden, V = model.vocab, N = C * E;
    x.assign(N, 0);
    h.assign(H, 0);
    a.assign(H, 0);
    mask.assign(H, 1);
    logits.assign(V, 0);
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t e = 0; e < E; ++e)
        x[c * E + e] = model.wte.value[data.tokens[i + c] * E + e];
    for (std::size_t j = 0; j < H; ++j) h[j] = model.fc1_b.value[j];
    for (std::size_t k = 0; k < N; ++k)
      for (std::size_t j = 0; j < H; ++j) h[j] += x[k] * model.fc1_w.value[k * H + j];
    const float scale = 1.0F / (1.0F - hp.dropout);
    // Dropout, then Gaussian noise on the units it kept; a dropped unit stays zero and takes no
    // draw, so how many values `noise` hands out varies from step to step.
    for (std::size_t j = 0; j < H; ++j) {
      h[j] = std::tanh(h[j]);
      if (train) mask[j] = keep(dropout_rng) ? scale : 0.0F;
      a[j] = h[j] * mask[j] + (train && mask[j] != 0 ? noise(noise_rng) : 0.0F);
    }
    for (std::size_t o = 0; o < V; ++o) logits[o] = model.fc2_b.value[o];
    for (std::size_t j = 0; j < H; ++j)
      for (std::size_t o = 0; o < V; ++o) logits[o] += a[j] * model.fc2_w.value[j * V + o];
    const float top = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (auto& l : logits) sum += (l = std::exp(l - top));
    const std::size_t target = data.tokens[i + C];
    const double loss = -std::log(logits[target] / sum);
    if (!train) return loss;

    // Backward: logits now hold exp(l - top); turn them into dL/dlogits.
    for (std::size_t o = 0; o < V; ++o) logits[o] = gscale * (static_cast<float>(logits[o] / sum) - (o == target));
    dh.assign(H, 0);
    for (std::size_t o = 0; o < V; ++o) model.fc2_b.grad[o] += logits[o];
    for (std::size_t j = 0; j < H; ++j) {
      for (std::size_t o = 0; o < V; ++o) {
        model.fc2_w.grad[j * V + o] += a[j] * logits[o];
        dh[j] += model.fc2_w.value[j * V + o] * logits[o];
      }
      dh[j] *= mask[j] * (1 - h[j] * h[j]);
      model.fc1_b.grad[j] += dh[j];
    }
    dx.assign(N, 0);
    for (std::size_t k = 0; k < N; ++k)
      for (std::size_t j = 0; j < H; ++j) {
        model.fc1_w.grad[k * H + j] += x[k] * dh[j];
        dx[k] += model.fc1_w.value[k * H + j] * dh[j];
      }
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t e = 0; e < E; ++e) model.wte.grad[data.tokens[i + c] * E + e] += dx[c * E + e];
    return loss;
  }

  // One optimizer step on the next batch; returns its mean loss.
  double step() {
    std::vector<std::int32_t> batch(hp.batch);
    sampler.next(batch);
    for (auto* p : model.parameters()) std::fill(p->grad.begin(), p->grad.end(), 0.0F);
    double loss = 0;
    for (auto i : batch) loss += example(static_cast<std::size_t>(i), true, 1.0F / static_cast<float>(batch.size()));
    optimizer.update(model);
    return loss / static_cast<double>(batch.size());
  }

  // Mean loss over every window of the text, without dropout or noise.
  double eval_loss() {
    double loss = 0;
    for (std::size_t i = 0; i + model.context < data.tokens.size(); ++i) loss += example(i, false, 0);
    return loss / static_cast<double>(data.tokens.size() - model.context);
  }
};

// XXH3 over what a checkpoint would hold, walked with the same ckpt::visitor ckpt uses: names,
// tensor bytes and value encodings. `prefix` limits it to one group ("model." for the weights).
std::uint64_t state_hash(trainer& t, std::string_view prefix = {}) {
  ckpt::visitor v;
  t.checkpoint(v);
  std::uint64_t h = 0;
  for (const auto& e : v.tensors()) {
    if (!e.name.starts_with(prefix)) continue;
    h = XXH3_64bits_withSeed(e.name.data(), e.name.size(), h);
    h = XXH3_64bits_withSeed(e.ref.data(), e.ref.nbytes(), h);
  }
  for (const auto& e : v.values()) {
    if (!e.name.starts_with(prefix)) continue;
    const auto bytes = e.save();
    h = XXH3_64bits_withSeed(e.name.data(), e.name.size(), h);
    h = XXH3_64bits_withSeed(bytes.data(), bytes.size(), h);
  }
  return h;
}

// ---------------------------------------------------------------------------------------------
// Training with checkpoints
// ---------------------------------------------------------------------------------------------

int train(const options& o) {
  const dataset data = make_dataset(corpus);
  const ckpt::config config = make_config(o, data.vocab.size());
  trainer t(data, o);
  ckpt::checkpointer<ckpt::single_process, ckpt::posix> cp{{}, o.save_dir, {.keep_last_n = 3}};

  if (!o.quiet)
    std::printf("char_mlp: vocab %zu, %zu windows, %zu parameters\n", data.vocab.size(), t.sampler.order.size(),
                t.model.parameter_count());

  std::uint64_t step = 0;
  if (o.resume) {
    if (cp.latest()) {
      // Throws ckpt::error naming every differing key if the hyper-parameters changed.
      const auto r = cp.load(t, {.config = config});
      step = r.iteration;
      std::printf("resumed: tag=%s iteration=%llu\n", r.tag.c_str(), ull(step));
    } else {
      std::printf("resume: no checkpoint under %s, starting from scratch\n", o.save_dir.c_str());
    }
  }

  std::uint64_t last_saved = step;
  while (step < o.steps) {
    const double loss = t.step();
    ++step;
    if (!o.quiet && (step % 25 == 0 || step == 1)) std::printf("step %5llu  loss %.6f\n", ull(step), loss);
    if (o.crash_at && step == *o.crash_at) {
      // SIGKILL, like the OOM killer or a lost node: no destructors, no chance to save. The
      // flush only keeps this message in the log.
      std::printf("crash: killing the process at step %llu\n", ull(step));
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
    if (step % o.save_interval == 0) {
      cp.save(step, t, {.config = config});
      last_saved = step;
    }
  }
  // Not twice at one step: ckpt refuses to overwrite the tag `latest` names.
  if (last_saved != step) cp.save(step, t, {.config = config});

  const double loss = t.eval_loss();
  if (!o.quiet) {
    std::printf("checkpoints kept:");
    for (const auto& tag : cp.tags()) std::printf(" %s%s", tag.tag.c_str(), tag.latest ? " (latest)" : "");
    std::printf("\n");
  }
  // One stable line for scripts (and for --check): the loss also as its exact bit pattern.
  std::printf("result: iteration=%llu eval_loss=%.9f eval_loss_bits=0x%016llx weights_xxh3=0x%016llx "
              "state_xxh3=0x%016llx\n",
              ull(step), loss, ull(std::bit_cast<std::uint64_t>(loss)), ull(state_hash(t, "model.")),
              ull(state_hash(t)));
  return 0;
}

// ---------------------------------------------------------------------------------------------
// --check: the proof in one command, by running this same program three times
// ---------------------------------------------------------------------------------------------

int check(const options& o) {
  return resume_check::run({.program = "train_resume",
                            .flags = {"--steps", std::to_string(o.steps), "--save-interval", std::to_string(o.save_interval),
                                      "--seed", std::to_string(o.seed), "--hidden", std::to_string(o.hidden), "--batch",
                                      std::to_string(o.batch)},
                            .steps = o.steps,
                            .save_interval = o.save_interval,
                            .crash_at = o.crash_at,
                            .dir = o.check_dir});
}

// ---------------------------------------------------------------------------------------------

constexpr const char* usage =
    "usage: train_resume --save DIR [--steps N] [--save-interval K] [--resume] [--crash-at S]\n"
    "       train_resume --check DIR [--steps N] [--save-interval K] [--crash-at S]\n"
    "options: --seed X --hidden H --batch B --quiet\n"
    "  --save DIR       train, saving a checkpoint every K steps and at the end under DIR\n"
    "  --resume         continue from DIR/latest when there is one\n"
    "  --crash-at S     die with SIGKILL right after step S (before any save at S)\n"
    "  --check DIR      run uninterrupted, crash, resume; compare the results bit for bit\n";

std::optional<options> parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const bool has_value = i + 1 < argc;
    auto number = [&](auto& out) {
      char* end = nullptr;
      const auto x = std::strtoull(argv[++i], &end, 10);
      if (*end != '\0' || argv[i][0] == '\0' || argv[i][0] == '-')
        throw std::runtime_error(std::string(a) + " needs a number");
      out = static_cast<std::remove_reference_t<decltype(out)>>(x);
    };
    if (a == "--resume") o.resume = true;
    else if (a == "--quiet") o.quiet = true;
    else if (!has_value) return std::nullopt;
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
  if (o.save_dir.empty() == o.check_dir.empty() || o.save_interval == 0 || o.batch == 0 || o.hidden == 0)
    return std::nullopt;
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
    return o->check_dir.empty() ? train(*o) : check(*o);
  } catch (const ckpt::error& e) {
    const std::string kind(ckpt::to_string(e.kind()));
    std::fprintf(stderr, "train_resume: ckpt error (%s): %s\n", kind.c_str(), e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_resume: %s\n", e.what());
  }
  return 1;
}
