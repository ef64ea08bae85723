#pragma once
/// @file adapters/libtorch.hpp
/// LibTorch's state as ckpt state: `torch::Tensor`s for `v.tensor`, and a module's parameters
/// and buffers, an optimizer's state and options, and a generator's state, each in one line
/// of a `checkpoint` function:
///
/// @code
/// #include <ckpt/adapters/libtorch.hpp>
///
/// struct trainer {
///   Net net;
///   torch::optim::AdamW opt{net->parameters(), torch::optim::AdamWOptions(3e-4)};
///   std::int64_t step = 0;
///   template <class V> void checkpoint(V& v) {
///     v.group("model", ckpt::libtorch::module(*net));
///     v.group("optimizer", ckpt::libtorch::optimizer(opt));
///     v.value("rng", ckpt::libtorch::generator());  // the default CPU generator
///     v.value("step", step);
///   }
/// };
/// @endcode
///
/// Never included by ckpt.hpp. It needs LibTorch's headers and libraries (Debian: libtorch-dev,
/// headers under /usr/include/torch/csrc/api/include; Meson and CMake: the `libtorch`
/// dependency / ckpt::libtorch target).

#if !__has_include(<torch/torch.h>)
#error "ckpt/adapters/libtorch.hpp needs LibTorch: install it (Debian: apt install libtorch-dev) and put its C++ API headers on the include path (/usr/include/torch/csrc/api/include on Debian; CMake: link ckpt::libtorch)"
#endif

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../names.hpp"
#include "../tensor.hpp"
#include "../visitor.hpp"

namespace ckpt::libtorch {

/// ckpt's dtype for a LibTorch scalar type, or std::nullopt for those ckpt does not store
/// (complex, quantized).
inline std::optional<dtype> dtype_of(c10::ScalarType t) noexcept {
  switch (t) {
    case c10::ScalarType::Double: return dtype::f64;
    case c10::ScalarType::Float: return dtype::f32;
    case c10::ScalarType::Half: return dtype::f16;
    case c10::ScalarType::BFloat16: return dtype::bf16;
    case c10::ScalarType::Long: return dtype::i64;
    case c10::ScalarType::Int: return dtype::i32;
    case c10::ScalarType::Short: return dtype::i16;
    case c10::ScalarType::Char: return dtype::i8;
    case c10::ScalarType::Byte: return dtype::u8;
    case c10::ScalarType::Bool: return dtype::boolean;
    default: return std::nullopt;
  }
}

/// LibTorch's scalar type for a ckpt dtype, or std::nullopt for those this LibTorch lacks
/// (unsigned 16/32/64-bit and FP8 in LibTorch 1.13).
inline std::optional<c10::ScalarType> scalar_type_of(dtype d) noexcept {
  for (const auto t : {c10::ScalarType::Double, c10::ScalarType::Float, c10::ScalarType::Half, c10::ScalarType::BFloat16,
                       c10::ScalarType::Long, c10::ScalarType::Int, c10::ScalarType::Short, c10::ScalarType::Char,
                       c10::ScalarType::Byte, c10::ScalarType::Bool})
    if (dtype_of(t) == d) return t;
  return std::nullopt;
}

namespace detail {
/// What ckpt needs to know of a torch::Tensor, read apart from it so that the mapping below is
/// one function whatever built the tensor (the tests feed it a CUDA tensor's facts, which a
/// CPU-only LibTorch cannot make).
struct tensor_facts {
  bool defined = false;
  bool strided = true;  ///< dense: not sparse or mkldnn
  c10::ScalarType type = c10::ScalarType::Float;
  std::vector<std::int64_t> sizes, strides;
  bool contiguous = true;
  void* data = nullptr;
  c10::DeviceType device_type = c10::DeviceType::CPU;
  int device_index = 0;
};

inline tensor_facts facts_of(const torch::Tensor& t) {
  tensor_facts f;
  f.defined = t.defined();
  if (!f.defined) return f;
  f.strided = t.layout() == c10::kStrided;
  if (!f.strided) return f;
  f.type = t.scalar_type();
  f.sizes = t.sizes().vec();
  f.strides = t.strides().vec();
  f.contiguous = t.is_contiguous();
  f.device_type = t.device().type();
  f.device_index = t.device().has_index() ? t.device().index() : 0;
  f.data = t.data_ptr();
  return f;
}

inline std::string list(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

/// The tensor_ref over a tensor's own bytes, or a refused one saying why (v.tensor names it).
inline tensor_ref ref_from(const tensor_facts& f) {
  if (!f.defined) return tensor_ref::refused("it is an undefined torch::Tensor");
  if (!f.strided) return tensor_ref::refused("it is a sparse or otherwise non-strided torch::Tensor; ckpt stores dense tensors");
  const auto type = dtype_of(f.type);
  if (!type) return tensor_ref::refused(std::string("its torch dtype ") + c10::toString(f.type) + " has no ckpt dtype");
  // A copy would save, but a load into it would be lost: ckpt refuses instead of copying.
  if (!f.contiguous)
    return tensor_ref::refused("it is not contiguous (sizes " + list(f.sizes) + ", strides " + list(f.strides) +
                               "): make the live tensor contiguous (t = t.contiguous()) so that a load can write into it");
  device where;
  if (f.device_type == c10::DeviceType::CUDA)
    where = device::cuda(f.device_index);
  else if (f.device_type != c10::DeviceType::CPU)
    return tensor_ref::refused(std::string("it lives on a ") + c10::DeviceTypeName(f.device_type) +
                               " device; ckpt handles CPU tensors and, through its DevicePolicy, CUDA ones");
  return tensor_ref::checked_later(*type, shape_t(extents(f.sizes)), static_cast<std::byte*>(f.data), true, where);
}
}  // namespace detail

/// The tensor_ref over `t`'s bytes: what `v.tensor(name, t)` records for a torch::Tensor. A CUDA
/// tensor is device memory, saved and loaded through the checkpointer's DevicePolicy.
/// Non-contiguous, undefined, sparse and complex tensors are refused by `v.tensor`, naming the
/// tensor.
///
/// @code
/// v.tensor("embedding", ckpt::libtorch::ref(table).sharded({.global_shape = {vocab, dim}, .offset = {first_row, 0}}));
/// @endcode
inline tensor_ref ref(const torch::Tensor& t) { return detail::ref_from(detail::facts_of(t)); }

/// Which slice of a global tensor a module's parameter or buffer is (see ckpt::shard_spec), by
/// its name in the module; std::nullopt for a whole tensor.
using shard_rule = std::function<std::optional<shard_spec>(const std::string& name, const torch::Tensor& t)>;

/// A `torch::nn::Module`'s named parameters and buffers (nested modules included: "fc1.weight",
/// "norm.running_mean"), for `v.group`. Undefined buffers are left out. Parameters are written
/// in place on load; autograd is not involved.
///
/// @code
/// v.group("model", ckpt::libtorch::module(*net));
/// // tensor parallel: this rank holds rows [r*n, r*n+n) of fc1.weight
/// v.group("model", ckpt::libtorch::module(*net, [&](const std::string& name, const torch::Tensor& t)
///     -> std::optional<ckpt::shard_spec> {
///   if (name != "fc1.weight") return std::nullopt;
///   return ckpt::shard_spec{.global_shape = {tp * t.size(0), t.size(1)}, .offset = {r * t.size(0), 0}};
/// }));
/// @endcode
class module_state {
 public:
  explicit module_state(torch::nn::Module& m, shard_rule shards = {}) : module_(&m), shards_(std::move(shards)) {}

  void operator()(visitor& v) const {
    for (const auto& p : module_->named_parameters(true)) v.tensor(p.key(), shaped(p.key(), p.value(), p.value()));
    for (const auto& b : module_->named_buffers(true))
      if (b.value().defined()) v.tensor(b.key(), shaped(b.key(), b.value(), b.value()));
  }

  /// The module's name of parameter `p`, or std::nullopt when `p` is not one of its parameters.
  std::optional<std::string> name_of(const torch::Tensor& p) const {
    if (names_.empty())
      for (const auto& q : module_->named_parameters(true)) names_.emplace(q.value().unsafeGetTensorImpl(), q.key());
    const auto it = names_.find(p.unsafeGetTensorImpl());
    if (it == names_.end()) return std::nullopt;
    return it->second;
  }

  /// The tensor_ref over `t`, sliced like the tensor `like` named `name` (an optimizer's
  /// moment is sharded like its parameter).
  tensor_ref shaped(const std::string& name, const torch::Tensor& like, const torch::Tensor& t) const {
    auto r = ref(t);
    if (shards_ && r.problem().empty())
      if (auto s = shards_(name, like)) r.sharded(std::move(*s));
    return r;
  }

 private:
  torch::nn::Module* module_;
  shard_rule shards_;
  mutable std::unordered_map<const void*, std::string> names_;
};

/// See module_state.
inline module_state module(torch::nn::Module& m, shard_rule shards = {}) { return module_state(m, std::move(shards)); }

/// How ckpt reads one kind of LibTorch optimizer: its per-parameter state (tensors and step)
/// and its options. Specialised for Adam, AdamW, SGD, RMSprop and Adagrad.
template <class Optimizer>
struct optimizer_traits {
  static constexpr bool ckpt_primary_template = true;
};

namespace detail {
// The tensors of Adam's and AdamW's state and their options, which have the same fields.
template <class State>
struct adam_like_state {
  template <class F>
  static void tensors(State& s, F&& f) {
    f("exp_avg", s.exp_avg());
    f("exp_avg_sq", s.exp_avg_sq());
    f("max_exp_avg_sq", s.max_exp_avg_sq());  // amsgrad only
  }
  static std::int64_t* step(State& s) { return &s.step(); }
};
template <class Options>
void adam_like_options(visitor& v, Options& o) {
  v.value("lr", o.lr());
  v.value("betas", o.betas());
  v.value("eps", o.eps());
  v.value("weight_decay", o.weight_decay());
  v.value("amsgrad", o.amsgrad());
}
}  // namespace detail

template <>
struct optimizer_traits<torch::optim::Adam> : detail::adam_like_state<torch::optim::AdamParamState> {
  using state = torch::optim::AdamParamState;
  using options = torch::optim::AdamOptions;
  static void options_fields(visitor& v, options& o) { detail::adam_like_options(v, o); }
};
template <>
struct optimizer_traits<torch::optim::AdamW> : detail::adam_like_state<torch::optim::AdamWParamState> {
  using state = torch::optim::AdamWParamState;
  using options = torch::optim::AdamWOptions;
  static void options_fields(visitor& v, options& o) { detail::adam_like_options(v, o); }
};
template <>
struct optimizer_traits<torch::optim::SGD> {
  using state = torch::optim::SGDParamState;
  using options = torch::optim::SGDOptions;
  template <class F>
  static void tensors(state& s, F&& f) {
    f("momentum_buffer", s.momentum_buffer());
  }
  static std::int64_t* step(state&) { return nullptr; }  // SGD counts no steps
  static void options_fields(visitor& v, options& o) {
    v.value("lr", o.lr());
    v.value("momentum", o.momentum());
    v.value("dampening", o.dampening());
    v.value("weight_decay", o.weight_decay());
    v.value("nesterov", o.nesterov());
  }
};
template <>
struct optimizer_traits<torch::optim::RMSprop> {
  using state = torch::optim::RMSpropParamState;
  using options = torch::optim::RMSpropOptions;
  template <class F>
  static void tensors(state& s, F&& f) {
    f("square_avg", s.square_avg());
    f("momentum_buffer", s.momentum_buffer());  // momentum > 0 only
    f("grad_avg", s.grad_avg());                // centered only
  }
  static std::int64_t* step(state& s) { return &s.step(); }
  static void options_fields(visitor& v, options& o) {
    v.value("lr", o.lr());
    v.value("alpha", o.alpha());
    v.value("eps", o.eps());
    v.value("weight_decay", o.weight_decay());
    v.value("momentum", o.momentum());
    v.value("centered", o.centered());
  }
};
template <>
struct optimizer_traits<torch::optim::Adagrad> {
  using state = torch::optim::AdagradParamState;
  using options = torch::optim::AdagradOptions;
  template <class F>
  static void tensors(state& s, F&& f) {
    f("sum", s.sum());
  }
  static std::int64_t* step(state& s) { return &s.step(); }
  static void options_fields(visitor& v, options& o) {
    v.value("lr", o.lr());
    v.value("lr_decay", o.lr_decay());
    v.value("weight_decay", o.weight_decay());
    v.value("initial_accumulator_value", o.initial_accumulator_value());
    v.value("eps", o.eps());
  }
};

namespace detail {
/// A value that is only checked on load: the number of parameters of a param group, which
/// must be what it was when saved.
struct expected_count {
  using ckpt_value_handle = void;
  std::string what;
  std::int64_t count = 0;
  template <class A>
  void save(A& ar) const {
    ar(count);
  }
  template <class A>
  void load(A& ar) {
    std::int64_t saved = 0;
    ar(saved);
    if (saved != count)
      throw error(error_kind::mismatch, what + " held " + std::to_string(saved) + " parameters when saved, it holds " +
                                            std::to_string(count) + " now");
  }
};
}  // namespace detail

/// An optimizer's state and param groups, for `v.group`: for each parameter that has state,
/// its tensors (`state.<i>.exp_avg`, with `i` the parameter's index over all param groups, as
/// torch's `state_dict()` numbers them) and its step count; for each param group, its options
/// (`param_groups.<g>.lr`, ...), so a learning rate a scheduler changed comes back too.
///
/// State that LibTorch creates on the optimizer's first step is created on load, with the
/// saved dtype and the parameter's shape, device and sharding, when the checkpoint has it: a
/// freshly constructed optimizer resumes bit-identically. A parameter the checkpoint has no
/// state for (saved before it was ever stepped) gets none: its live state is dropped, as
/// torch's `load_state_dict` does.
///
/// Given the module (`optimizer(opt, model)`), the state is named by parameter name instead
/// (`state.fc1.weight.exp_avg`) and sharded like the parameters, so that it reshards with them.
///
/// @code
/// auto model = ckpt::libtorch::module(*net);
/// v.group("model", model);
/// v.group("optimizer", ckpt::libtorch::optimizer(opt, model));
/// @endcode
template <class Optimizer>
class optimizer_state {
  static_assert(!requires { optimizer_traits<Optimizer>::ckpt_primary_template; },
                "ckpt::libtorch::optimizer supports torch::optim::Adam, AdamW, SGD, RMSprop and Adagrad; specialise "
                "ckpt::libtorch::optimizer_traits for another");
  using traits = optimizer_traits<Optimizer>;
  using state_type = typename traits::state;

 public:
  optimizer_state(Optimizer& opt, const module_state* model) : opt_(&opt), model_(model) {}

  void operator()(visitor& v) const {
    auto& groups = opt_->param_groups();
    auto& states = opt_->state();
    std::int64_t index = 0;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const std::string group_name = "param_groups." + std::to_string(g);
      auto& params = groups[g].params();
      v.value(group_name + ".params",
              detail::expected_count{"optimizer param group " + std::to_string(g), static_cast<std::int64_t>(params.size())});
      if (groups[g].has_options()) {
        auto* options = dynamic_cast<typename traits::options*>(&groups[g].options());
        if (!options) throw error(error_kind::invalid_argument, "optimizer param group " + std::to_string(g) + " has options of another optimizer");
        v.group(group_name, [&](visitor& gv) { traits::options_fields(gv, *options); });
      }
      for (const auto& p : params) visit_param(v, states, p, index++);
    }
  }

 private:
  template <class States>
  void visit_param(visitor& v, States& states, const torch::Tensor& p, std::int64_t index) const {
    std::string param_name = std::to_string(index);
    if (model_) {
      auto name = model_->name_of(p);
      if (!name) throw error(error_kind::invalid_argument, "optimizer parameter " + param_name + " is not a parameter of the module given");
      param_name = std::move(*name);
    }
    const std::string prefix = "state." + param_name + ".";
    const auto key = state_key(states, p);
    auto it = states.find(key);
    if (v.loading()) {
      bool saved = false;
      state_type probe;  // only its field names are wanted
      traits::tensors(probe, [&](const char* field, torch::Tensor&) { saved = saved || v.saved(prefix + field).has_value(); });
      if (!saved) {  // the checkpoint has no state for this parameter: neither does the optimizer after the load
        if (it != states.end()) states.erase(it);
        return;
      }
      if (it == states.end()) it = states.emplace(key, std::make_unique<state_type>()).first;
    }
    if (it == states.end()) return;  // saving a parameter that was never stepped
    auto* state = dynamic_cast<state_type*>(it->second.get());
    if (!state) throw error(error_kind::invalid_argument, "optimizer state of parameter " + param_name + " is of another optimizer");
    v.group("state." + param_name, [&](visitor& sv) {
      traits::tensors(*state, [&](const char* field, torch::Tensor& t) {
        if (!t.defined() && v.loading()) {  // created by a later step (amsgrad's max, centered RMSprop's mean)
          const auto s = sv.saved(field);
          if (!s) return;
          const auto type = scalar_type_of(s->type);
          if (!type) throw error(error_kind::mismatch, "tensor " + prefix + field + ": saved as " + std::string(to_string(s->type)) + ", which LibTorch lacks");
          t = torch::empty(p.sizes(), p.options().dtype(*type).requires_grad(false));
        }
        if (!t.defined()) return;
        sv.tensor(field, model_ ? model_->shaped(param_name, p, t) : ref(t));
      });
      if (auto* step = traits::step(*state)) sv.value("step", *step);
    });
  }

  template <class States>
  static auto state_key(const States&, const torch::Tensor& p) {
    // LibTorch 1.x keys the state by the parameter's TensorImpl address as text, 2.x by the address.
    using key = typename States::key_type;
    if constexpr (std::is_same_v<key, std::string>)
      return c10::guts::to_string(p.unsafeGetTensorImpl());
    else
      return static_cast<key>(p.unsafeGetTensorImpl());
  }

  Optimizer* opt_;
  const module_state* model_;
};

/// See optimizer_state: `opt`'s state, named by parameter index.
template <class Optimizer>
optimizer_state<Optimizer> optimizer(Optimizer& opt) {
  return optimizer_state<Optimizer>(opt, nullptr);
}
/// See optimizer_state: `opt`'s state, named and sharded like `model`'s parameters. `model`
/// must outlive the visit.
template <class Optimizer>
optimizer_state<Optimizer> optimizer(Optimizer& opt, const module_state& model) {
  return optimizer_state<Optimizer>(opt, &model);
}

/// A LibTorch generator's state as a value: `v.value("rng", ckpt::libtorch::generator(g))`. The
/// state is LibTorch's own (get_state/set_state: the CPU generator's Mersenne Twister, a CUDA
/// generator's seed and offset), taken under the generator's lock. Loading a CPU generator's
/// state into a CUDA one, or the other way round, is a mismatch error.
///
/// @code
/// v.value("rng", ckpt::libtorch::generator());                        // the default CPU generator (dropout, randn)
/// v.value("cuda_rng", ckpt::libtorch::generator(torch::Device(torch::kCUDA, 0)));
/// @endcode
class generator {
 public:
  using ckpt_value_handle = void;

  /// The default CPU generator, which dropout, randn and randperm draw from.
  generator() : generator(torch::Device(torch::kCPU)) {}
  /// The default generator of `d`.
  explicit generator(torch::Device d) : g_(at::globalContext().defaultGenerator(d)) {}
  explicit generator(at::Generator g) : g_(std::move(g)) {}

  template <class A>
  void save(A& ar) const {
    torch::Tensor state;
    {
      std::lock_guard<std::mutex> lock(g_.mutex());
      state = g_.get_state();
    }
    state = state.contiguous();
    const auto* b = state.data_ptr<std::uint8_t>();
    ar(std::string(c10::DeviceTypeName(g_.device().type(), true)), std::vector<std::uint8_t>(b, b + state.numel()));
  }
  template <class A>
  void load(A& ar) {
    std::string kind;
    std::vector<std::uint8_t> bytes;
    ar(kind, bytes);
    const std::string live = c10::DeviceTypeName(g_.device().type(), true);
    if (kind != live) throw error(error_kind::mismatch, "a " + kind + " generator's state cannot be loaded into a " + live + " generator");
    auto state = torch::empty({static_cast<std::int64_t>(bytes.size())}, torch::kUInt8);
    std::copy(bytes.begin(), bytes.end(), state.data_ptr<std::uint8_t>());
    std::lock_guard<std::mutex> lock(g_.mutex());
    g_.set_state(state);  // LibTorch checks the size and throws c10::Error, reported with the value's name
  }

 private:
  mutable at::Generator g_;  // its lock and get_state are not const
};

}  // namespace ckpt::libtorch

/// `v.tensor(name, t)` for a torch::Tensor (see ckpt::libtorch::ref).
template <>
struct ckpt::tensor_traits<torch::Tensor> {
  static tensor_ref ref(const torch::Tensor& t) { return libtorch::ref(t); }
};
