// ckpt/adapters/libtorch.hpp against Debian's LibTorch: every dtype, modules with nested
// modules and buffers, each supported optimizer loaded into one that never stepped and then
// stepped on bit-identically, generators, resharding from tp=2 to tp=1, a CUDA tensor's path
// on the fake CUDA runtime, and the errors bad inputs get. One translation unit: LibTorch's
// headers take most of its compile time.

// LibTorch first: Debian's builds it with glog, whose CHECK macros would replace doctest's.
#include <ckpt/adapters/libtorch.hpp>
#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE

#include "../cuda/fake_runtime.hpp"
#include "../helpers.hpp"
#include "../on_ranks.hpp"

#include <doctest/doctest.h>

#include <ckpt/ckpt.hpp>
#include <ckpt/cuda/basic_device_copy.hpp>
#include <ckpt/in_process.hpp>
#include <ckpt/reader.hpp>

#include <memory>
#include <string>
#include <vector>

namespace {

using host_checkpointer = ckpt::checkpointer<ckpt::single_process, ckpt::posix>;

/// A small network with what LibTorch engines have: nested modules, LayerNorm, BatchNorm's
/// running statistics (and its integer batch counter), a registered buffer, and dropout.
struct netImpl : torch::nn::Module {  // LibTorch's naming: TORCH_MODULE(net) wraps netImpl
  explicit netImpl(std::int64_t hidden = 16) {
    body = register_module("body", torch::nn::Sequential(torch::nn::Linear(8, hidden), torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden}))));
    bn = register_module("bn", torch::nn::BatchNorm1d(hidden));
    head = register_module("head", torch::nn::Linear(hidden, 4));
    scale = register_buffer("scale", torch::linspace(0.5, 1.5, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(bn(body->forward(x)));
    return head(torch::dropout(h, 0.2, is_training())) * scale;
  }
  torch::nn::Sequential body{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Linear head{nullptr};
  torch::Tensor scale;
};
TORCH_MODULE(net);

/// One training step whose data and dropout come from the default CPU generator.
template <class Opt>
void train_step(net& m, Opt& opt) {
  const auto x = torch::randn({12, 8});
  const auto y = torch::randn({12, 4});
  opt.zero_grad();
  torch::mse_loss(m->forward(x), y).backward();
  opt.step();
}

/// What a LibTorch engine's checkpoint() holds: three lines.
template <class Opt>
struct trainer {
  net model;
  std::unique_ptr<Opt> opt;
  template <class V>
  void checkpoint(V& v) {
    v.group("model", ckpt::libtorch::module(*model));
    v.group("optimizer", ckpt::libtorch::optimizer(*opt));
    v.value("rng", ckpt::libtorch::generator());
  }
};

std::vector<torch::Tensor> everything(net& m) {
  std::vector<torch::Tensor> all;
  for (const auto& p : m->named_parameters()) all.push_back(p.value().detach().clone());
  for (const auto& b : m->named_buffers()) all.push_back(b.value().clone());
  return all;
}

bool identical(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].scalar_type() != b[i].scalar_type() || !torch::equal(a[i], b[i])) return false;
  return true;
}

/// Trains 3 steps, saves, trains 3 more; then a fresh network and a never-stepped optimizer
/// (other initial weights, another seed) load the checkpoint and train the same 3 steps.
/// Both must end bit-identical.
template <class Opt, class Make>
void check_resume(Make make) {
  test::temp_dir dir;
  torch::manual_seed(7);
  trainer<Opt> a{net(), nullptr};
  a.opt = make(a.model);
  for (int i = 0; i < 3; ++i) train_step(a.model, *a.opt);
  host_checkpointer{{}, dir.str()}.save(3, a);
  for (int i = 0; i < 3; ++i) train_step(a.model, *a.opt);

  torch::manual_seed(12345);
  trainer<Opt> b{net(), nullptr};
  b.opt = make(b.model);
  CHECK_FALSE(identical(everything(a.model), everything(b.model)));
  const auto r = host_checkpointer{{}, dir.str()}.load(b, {.strict = true});
  CHECK(r.iteration == 3);
  CHECK(r.missing.empty());
  CHECK(r.unexpected.empty());
  CHECK(b.opt->state().size() == a.opt->state().size());
  for (int i = 0; i < 3; ++i) train_step(b.model, *b.opt);
  CHECK(identical(everything(a.model), everything(b.model)));
}

/// Saves 40 bytes where a generator's state belongs.
struct bytes_as_rng {
  std::vector<std::uint8_t> junk = std::vector<std::uint8_t>(40, 7);
  void checkpoint(ckpt::visitor& v) {
    if (v.loading())
      v.value("rng", ckpt::libtorch::generator());
    else
      v.value("rng", *this);
  }
  template <class A>
  void serialize(A& ar) {
    std::string kind = "cpu";
    ar(kind, junk);
  }
};

}  // namespace

TEST_CASE("torch tensors of every dtype ckpt knows round-trip, scalars and empty ones too") {
  test::temp_dir dir;
  const std::vector<torch::ScalarType> types = {torch::kDouble, torch::kFloat, torch::kHalf, torch::kBFloat16, torch::kLong,
                                                torch::kInt,    torch::kShort, torch::kChar, torch::kByte,     torch::kBool};
  struct state {
    std::vector<torch::Tensor> ts;
    void checkpoint(ckpt::visitor& v) {
      for (std::size_t i = 0; i < ts.size(); ++i) v.tensor("t" + std::to_string(i), ts[i]);
    }
  };
  torch::manual_seed(3);
  state saved, back;
  for (const auto t : types) {
    for (const auto& shape : std::vector<std::vector<std::int64_t>>{{}, {0}, {5, 7}, {2, 3, 4}}) {
      auto x = t == torch::kBool ? torch::rand(shape) > 0.5 : (torch::randn(shape) * 100).to(t);
      saved.ts.push_back(x);
      back.ts.push_back(torch::zeros(shape, torch::TensorOptions().dtype(t)));
    }
  }
  host_checkpointer{{}, dir.str()}.save(1, saved);
  host_checkpointer{{}, dir.str()}.load(back, {.strict = true});
  for (std::size_t i = 0; i < saved.ts.size(); ++i) {
    CAPTURE(i);
    CHECK((back.ts[i].scalar_type() == saved.ts[i].scalar_type()));
    CHECK(torch::equal(back.ts[i], saved.ts[i]));
  }
  // The dtypes as ckpt stores them.
  ckpt::reader rd{ckpt::posix(dir.path())};
  CHECK(rd.find("t0")->type == ckpt::dtype::f64);
  CHECK(rd.find("t12")->type == ckpt::dtype::bf16);
  CHECK(rd.find("t36")->type == ckpt::dtype::boolean);
}

TEST_CASE("module: every parameter and buffer of nested modules, by its LibTorch name") {
  test::temp_dir dir;
  torch::manual_seed(1);
  net a;
  torch::NoGradGuard no_grad;
  a->bn->running_mean.uniform_();  // running statistics as training would have left them
  a->bn->num_batches_tracked.fill_(17);
  struct holder {
    net* m;
    void checkpoint(ckpt::visitor& v) {
      v.group("model", ckpt::libtorch::module(**m));
    }
  };
  holder ha{&a};
  host_checkpointer{{}, dir.str()}.save(1, ha);
  std::vector<std::string> names;
  const ckpt::reader stored{ckpt::posix(dir.path())};
  for (const auto& t : stored.info().tensors) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  CHECK((names == std::vector<std::string>{"model.bn.bias", "model.bn.num_batches_tracked", "model.bn.running_mean",
                                          "model.bn.running_var", "model.bn.weight", "model.body.0.bias", "model.body.0.weight",
                                          "model.body.1.bias", "model.body.1.weight", "model.head.bias", "model.head.weight",
                                          "model.scale"}));
  CHECK(stored.find("model.bn.num_batches_tracked")->type == ckpt::dtype::i64);

  torch::manual_seed(2);
  net b;
  holder hb{&b};
  CHECK_FALSE(identical(everything(a), everything(b)));
  host_checkpointer{{}, dir.str()}.load(hb, {.strict = true});
  CHECK(identical(everything(a), everything(b)));
}

TEST_CASE("each optimizer, loaded into one that never stepped, steps on bit-identically") {
  SUBCASE("Adam") {
    check_resume<torch::optim::Adam>([](net& m) { return std::make_unique<torch::optim::Adam>(m->parameters(), torch::optim::AdamOptions(1e-2)); });
  }
  SUBCASE("Adam with amsgrad") {
    check_resume<torch::optim::Adam>(
        [](net& m) { return std::make_unique<torch::optim::Adam>(m->parameters(), torch::optim::AdamOptions(1e-2).amsgrad(true)); });
  }
  SUBCASE("AdamW, two param groups") {
    check_resume<torch::optim::AdamW>([](net& m) {
      std::vector<torch::optim::OptimizerParamGroup> groups;
      groups.emplace_back(m->body->parameters());
      groups.emplace_back(m->head->parameters());
      groups.emplace_back(m->bn->parameters());
      return std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(3e-3).weight_decay(0.1));
    });
  }
  SUBCASE("SGD with momentum") {
    check_resume<torch::optim::SGD>(
        [](net& m) { return std::make_unique<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true)); });
  }
  SUBCASE("RMSprop, centered with momentum") {
    check_resume<torch::optim::RMSprop>([](net& m) {
      return std::make_unique<torch::optim::RMSprop>(m->parameters(), torch::optim::RMSpropOptions(1e-3).momentum(0.5).centered(true));
    });
  }
  SUBCASE("Adagrad") {
    check_resume<torch::optim::Adagrad>([](net& m) { return std::make_unique<torch::optim::Adagrad>(m->parameters(), torch::optim::AdagradOptions(0.05)); });
  }
}

TEST_CASE("optimizer options come back: a learning rate a scheduler changed, per param group") {
  test::temp_dir dir;
  torch::manual_seed(5);
  trainer<torch::optim::AdamW> a{net(), nullptr};
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(a.model->body->parameters());
  groups.emplace_back(a.model->head->parameters());
  a.opt = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(1e-3));
  static_cast<torch::optim::AdamWOptions&>(a.opt->param_groups()[1].options()).lr(2.5e-4).betas({0.8, 0.95});
  train_step(a.model, *a.opt);
  host_checkpointer{{}, dir.str()}.save(1, a);

  trainer<torch::optim::AdamW> b{net(), nullptr};
  std::vector<torch::optim::OptimizerParamGroup> groups_b;
  groups_b.emplace_back(b.model->body->parameters());
  groups_b.emplace_back(b.model->head->parameters());
  b.opt = std::make_unique<torch::optim::AdamW>(groups_b, torch::optim::AdamWOptions(1e-3));
  host_checkpointer{{}, dir.str()}.load(b);
  const auto& o = static_cast<torch::optim::AdamWOptions&>(b.opt->param_groups()[1].options());
  CHECK(o.lr() == 2.5e-4);
  CHECK(std::get<0>(o.betas()) == 0.8);
  CHECK(static_cast<torch::optim::AdamWOptions&>(b.opt->param_groups()[0].options()).lr() == 1e-3);

  SUBCASE("a param group of another size is refused") {
    trainer<torch::optim::AdamW> c{net(), nullptr};
    std::vector<torch::optim::OptimizerParamGroup> one;
    one.emplace_back(c.model->body->parameters());
    std::vector<torch::Tensor> head_and_bn = c.model->head->parameters();
    for (auto& p : c.model->bn->parameters()) head_and_bn.push_back(p);
    one.emplace_back(head_and_bn);
    c.opt = std::make_unique<torch::optim::AdamW>(one, torch::optim::AdamWOptions(1e-3));
    try {
      host_checkpointer{{}, dir.str()}.load(c);
      FAIL("loaded a param group of another size");
    } catch (const ckpt::error& e) {
      CHECK(test::mentions(e.what(), "value 'optimizer.param_groups.1.params'"));
      CHECK(test::mentions(e.what(), "held 2 parameters when saved, it holds 4 now"));
    }
  }
}

TEST_CASE("a checkpoint saved before the first step drops the live optimizer state, as load_state_dict does") {
  test::temp_dir dir;
  torch::manual_seed(9);
  trainer<torch::optim::Adam> a{net(), nullptr};
  a.opt = std::make_unique<torch::optim::Adam>(a.model->parameters(), torch::optim::AdamOptions(1e-2));
  host_checkpointer{{}, dir.str()}.save(0, a);
  CHECK(ckpt::reader{ckpt::posix(dir.path())}.find("optimizer.state.0.exp_avg") == nullptr);
  train_step(a.model, *a.opt);
  REQUIRE(!a.opt->state().empty());
  host_checkpointer{{}, dir.str()}.load(a, {.strict = true});
  CHECK(a.opt->state().empty());
}

TEST_CASE("generator: the CPU generator's state, restored so the same numbers follow") {
  test::temp_dir dir;
  struct rng_only {
    void checkpoint(ckpt::visitor& v) {
      v.value("rng", ckpt::libtorch::generator());
    }
  } s;
  torch::manual_seed(42);
  (void)torch::randn({100});
  host_checkpointer{{}, dir.str()}.save(1, s);
  const auto expected = torch::randn({1000});
  torch::manual_seed(0);
  host_checkpointer{{}, dir.str()}.load(s, {.strict = true});
  CHECK(torch::equal(torch::randn({1000}), expected));

  SUBCASE("another generator object") {
    auto g = at::detail::createCPUGenerator(5);
    struct own {
      at::Generator* g;
      void checkpoint(ckpt::visitor& v) {
        v.value("rng", ckpt::libtorch::generator(*g));
      }
    } o{&g};
    host_checkpointer{{}, dir.str()}.save(2, o);
    const auto want = torch::randn({50}, g);
    auto h = at::detail::createCPUGenerator(6);
    own p{&h};
    host_checkpointer{{}, dir.str()}.load(p);
    CHECK(torch::equal(torch::randn({50}, h), want));
  }
  SUBCASE("a state of another size is refused, naming the value") {
    bytes_as_rng bad;
    test::temp_dir other;
    host_checkpointer{{}, other.str()}.save(1, bad);
    try {
      host_checkpointer{{}, other.str()}.load(bad);
      FAIL("a 40-byte state loaded");
    } catch (const ckpt::error& e) {
      CHECK(test::mentions(e.what(), "value 'rng'"));
    }
  }
}

TEST_CASE("a model and its Adam state saved at tp=2 through the adapter load at tp=1") {
  test::temp_dir dir;
  // The global layer is Linear(8, 8); rank r of tp=2 holds output rows [4r, 4r+4).
  torch::manual_seed(11);
  auto global = torch::nn::Linear(8, 8);
  struct sharded_trainer {
    torch::nn::Linear layer;
    std::unique_ptr<torch::optim::Adam> opt;
    ckpt::libtorch::shard_rule rule;
    void checkpoint(ckpt::visitor& v) {
      auto model = ckpt::libtorch::module(*layer, rule);
      v.group("model", model);
      v.group("optimizer", ckpt::libtorch::optimizer(*opt, model));
    }
  };
  const auto errors = test::on_ranks(2, [&](ckpt::in_process comm, std::uint32_t r) {
    const std::int64_t rank = r;
    torch::nn::Linear part(8, 4);
    {
      torch::NoGradGuard g;
      part->weight.copy_(global->weight.narrow(0, 4 * rank, 4));
      part->bias.copy_(global->bias.narrow(0, 4 * rank, 4));
    }
    sharded_trainer t{part, std::make_unique<torch::optim::Adam>(part->parameters(), torch::optim::AdamOptions(0.1)),
                      [rank](const std::string&, const torch::Tensor& p) -> std::optional<ckpt::shard_spec> {
                        if (p.dim() == 2) return ckpt::shard_spec{.global_shape = {8, 8}, .offset = {4 * rank, 0}};
                        return ckpt::shard_spec{.global_shape = {8}, .offset = {4 * rank}};
                      }};
    // One step on a gradient every rank computes alike, so the moments are the global ones' slices.
    part->weight.mutable_grad() = torch::ones({4, 8}) * static_cast<double>(rank + 1);
    part->bias.mutable_grad() = torch::ones({4}) * static_cast<double>(rank + 1);
    t.opt->step();
    ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::posix> cp{{.tp = 2, .comm = comm}, dir.str()};
    cp.save(1, t);
  });
  REQUIRE((errors == std::vector<std::string>{"", ""}));

  torch::manual_seed(99);
  sharded_trainer whole{torch::nn::Linear(8, 8), nullptr, {}};
  whole.opt = std::make_unique<torch::optim::Adam>(whole.layer->parameters(), torch::optim::AdamOptions(0.1));
  const auto loaded = test::on_ranks(1, [&](ckpt::in_process comm, std::uint32_t) {
    ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::posix> cp{{.tp = 1, .comm = comm}, dir.str()};
    cp.load(whole, {.strict = true, .on_topology_change = ckpt::topology_change::from_rank_0});
  });
  REQUIRE((loaded == std::vector<std::string>{""}));
  // The weights after one Adam step at lr 0.1: the stored slices, joined.
  CHECK(whole.opt->state().size() == 2);
  const auto key = c10::guts::to_string(whole.layer->weight.unsafeGetTensorImpl());
  const auto it = whole.opt->state().find(key);
  REQUIRE(it != whole.opt->state().end());
  const auto& st = static_cast<torch::optim::AdamParamState&>(*it->second);
  CHECK(st.step() == 1);
  CHECK(torch::equal(st.exp_avg(), torch::cat({torch::ones({4, 8}) * 0.1, torch::ones({4, 8}) * 0.2})));
  CHECK(torch::allclose(whole.layer->weight, global->weight - 0.1));
}

TEST_CASE("a CUDA tensor is device memory, saved and loaded through the DevicePolicy (fake CUDA runtime)") {
  // Debian's LibTorch is CPU-only and cannot make a CUDA tensor; the facts such a tensor gives
  // (device type CUDA, index 1) go through the same mapping torch::Tensors do.
  fake::runtime rt;
  ckpt::memory_storage mem;
  using policy = ckpt::cuda::basic_device_copy<fake::runtime>;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage, ckpt::raw, policy> cp{{}, mem, {}, {}, policy{rt, nullptr, {}}};
  std::vector<float> device_bytes(24);
  for (std::size_t i = 0; i < device_bytes.size(); ++i) device_bytes[i] = static_cast<float>(i) * 0.5f;
  auto facts = [&] {
    ckpt::libtorch::detail::tensor_facts f;
    f.defined = true;
    f.type = c10::ScalarType::Float;
    f.sizes = {4, 6};
    f.strides = {6, 1};
    f.data = device_bytes.data();
    f.device_type = c10::DeviceType::CUDA;
    f.device_index = 1;
    return f;
  };
  const auto ref = ckpt::libtorch::detail::ref_from(facts());
  CHECK(ref.where() == ckpt::device::cuda(1));
  CHECK((ref.shape() == ckpt::shape_t{4, 6}));
  struct gpu_state {
    ckpt::tensor_ref r;
    void checkpoint(ckpt::visitor& v) {
      v.tensor("w", r);
    }
  } s{ref};
  cp.save(1, s);
  const auto saved = device_bytes;
  std::fill(device_bytes.begin(), device_bytes.end(), -1.f);
  cp.load(s, {.strict = true});
  CHECK(device_bytes == saved);
  CHECK(rt.st->pinned_allocs > 0);  // the bytes went through device_copy's pinned buffers

  SUBCASE("without a GPU policy, the CUDA tensor is refused by name") {
    ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> host{{}, mem};
    CHECK_THROWS_WITH_AS(host.save(2, s), doctest::Contains("tensor 'w' lives on a device"), ckpt::error);
  }
}

TEST_CASE("bad inputs: errors that name the tensor") {
  test::temp_dir dir;
  torch::manual_seed(4);
  trainer<torch::optim::Adam> a{net(), nullptr};
  a.opt = std::make_unique<torch::optim::Adam>(a.model->parameters());
  train_step(a.model, *a.opt);
  host_checkpointer{{}, dir.str()}.save(1, a);

  SUBCASE("another shape") {
    trainer<torch::optim::Adam> b{net(12), nullptr};
    b.opt = std::make_unique<torch::optim::Adam>(b.model->parameters());
    CHECK_THROWS_WITH_AS(host_checkpointer({}, dir.str()).load(b), doctest::Contains("tensor 'model.body.0.weight': saved f32 [16, 8], live f32 [12, 8]"),
                         ckpt::error);
  }
  SUBCASE("another dtype") {
    trainer<torch::optim::Adam> b{net(), nullptr};
    b.model->to(torch::kDouble);
    b.opt = std::make_unique<torch::optim::Adam>(b.model->parameters());
    CHECK_THROWS_WITH_AS(host_checkpointer({}, dir.str()).load(b), doctest::Contains("saved f32 [16, 8], live f64 [16, 8]"), ckpt::error);
  }
  SUBCASE("a parameter the checkpoint lacks, under strict") {
    struct bigger {
      net m;
      torch::nn::Linear extra{2, 2};
      void checkpoint(ckpt::visitor& v) {
        v.group("model", [&](ckpt::visitor& g) {
          ckpt::libtorch::module(*m)(g);
          g.tensor("extra.weight", extra->weight);
        });
      }
    } b{a.model, torch::nn::Linear(2, 2)};
    CHECK_THROWS_WITH_AS(host_checkpointer({}, dir.str()).load(b, {.strict = true}),
                         doctest::Contains("missing from the checkpoint: 'model.extra.weight'"), ckpt::error);
  }
  SUBCASE("a non-contiguous tensor") {
    struct transposed {
      torch::Tensor w = torch::randn({3, 5}).t();
      void checkpoint(ckpt::visitor& v) {
        v.tensor("w.t", w);
      }
    } t;
    CHECK_THROWS_WITH_AS(host_checkpointer({}, dir.str()).save(2, t),
                         doctest::Contains("tensor 'w.t': it is not contiguous (sizes [5, 3], strides [1, 5])"), ckpt::error);
  }
  SUBCASE("undefined and complex tensors") {
    struct odd {
      torch::Tensor t;
      void checkpoint(ckpt::visitor& v) {
        v.tensor("odd", t);
      }
    } u, c{torch::zeros({2}, torch::kComplexFloat)};
    CHECK_THROWS_WITH_AS(host_checkpointer({}, dir.str()).save(2, u), doctest::Contains("tensor 'odd': it is an undefined torch::Tensor"),
                         ckpt::error);
    CHECK_THROWS_WITH_AS(host_checkpointer({}, dir.str()).save(2, c), doctest::Contains("tensor 'odd': its torch dtype ComplexFloat"),
                         ckpt::error);
  }
  SUBCASE("optimizer state of another shape") {
    // The moments are made with the live parameter's shape: a checkpoint of another shape is a
    // mismatch by name, not a crash in the next step.
    struct state_only {
      torch::nn::Linear l{8, 3};
      std::unique_ptr<torch::optim::Adam> opt = std::make_unique<torch::optim::Adam>(l->parameters());
      void checkpoint(ckpt::visitor& v) {
        v.group("optimizer", ckpt::libtorch::optimizer(*opt));
      }
    } s;
    CHECK_THROWS_WITH_AS(host_checkpointer({}, dir.str()).load(s, {.strict = false}), doctest::Contains("tensor 'optimizer.state.0.exp_avg': saved f32 [16, 8], live f32 [3, 8]"),
                         ckpt::error);
  }
}
