// ckpt export SRC OUT --format safetensors|torch: one consolidated model, for publishing or for
// Python. Tensors stream from the checkpoint block by block into the output (safetensors), so
// memory stays bounded whatever the model size; --dtype converts floating-point tensors on the
// way, --no-optimizer leaves the optimizer group out, --max-shard-size splits the output the
// way Hugging Face's save_pretrained does.

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include <ckpt/ckpt.hpp>
#include <ckpt/interop/safetensors.hpp>
#include <ckpt/interop/torch.hpp>
#include <ckpt/reader.hpp>

#include "blocks.hpp"
#include "cli.hpp"
#include "convert.hpp"
#include "layers.hpp"

namespace ckpt_tool {

namespace fs = std::filesystem;

namespace {

/// The tensors to export, in the checkpoint's order, with their exported dtype.
/// With --group G, the exported names are the stored ones under "G." without that prefix
/// (what load_state_dict expects of a module checkpointed as v.group("model", ...)).
std::string group_prefix(const export_args& a) { return a.group ? *a.group + "." : std::string(); }

std::vector<ckpt::interop::tensor_decl> exported(const ckpt::checkpoint_info& info, const export_args& a, const std::string& optimizer) {
  std::vector<ckpt::interop::tensor_decl> out;
  const auto prefix = group_prefix(a);
  std::string column_major;
  for (const auto& t : info.tensors) {
    if (t.name.starts_with("__ckpt")) continue;  // ckpt's own (validation logits)
    if (!a.optimizer && (t.name == optimizer || t.name.starts_with(optimizer + "."))) continue;
    if (!t.name.starts_with(prefix)) continue;
    // The exported formats hold row-major (C order) tensors: a column-major one (saved by the
    // Eigen adapter, say) written as it is stored would come out transposed, so it is refused.
    if (t.order == ckpt::layout::column_major)
      column_major += (column_major.empty() ? "" : ", ") + ckpt::detail::printable(t.name) + " (logical shape " +
                      ckpt::detail::to_string(ckpt::detail::logical_shape(t.shape, t.order)) + ")";
    out.push_back({t.name.substr(prefix.size()), exported_dtype(t.name, t.type, a.dtype), t.shape});
  }
  if (!column_major.empty())
    throw ckpt::error(ckpt::error_kind::invalid_argument,
                      "cannot export column-major tensors, which " + a.format +
                          " files hold only row-major and would come out transposed: " + column_major +
                          "; save them row-major (e.g. Eigen::RowMajor) or leave them out of the state to export");
  if ((a.layout == "megatron" || a.layout == "deepspeed") && a.format != "torch")
    throw ckpt::error(ckpt::error_kind::invalid_argument, "--layout " + a.layout + " is a .pt layout: use it with --format torch");
  if (a.group && a.layout != "state_dict")
    throw ckpt::error(ckpt::error_kind::invalid_argument, "--group exports a flat state dict: it does not go with --layout " + a.layout);
  if (a.group && out.empty())
    throw ckpt::error(ckpt::error_kind::invalid_argument, "--group " + *a.group + ": the checkpoint has no tensor under " + prefix);
  return out;
}

/// Streams every declared tensor from `r` into `sink(name, bytes)`, block by block, converted.
template <class Sink>
void stream_tensors(ckpt::reader<>& r, const std::vector<ckpt::interop::tensor_decl>& decls, const std::string& prefix,
                    std::uint64_t budget, progress_bar& bar, Sink&& sink) {
  std::vector<std::byte> block, converted;
  std::uint64_t done = 0;
  for (const auto& d : decls) {
    const auto& t = *r.find(prefix + d.name);
    for_each_block(t.shape, ckpt::size_of(t.type), budget, [&](const ckpt::shape_t& offset, const ckpt::shape_t& shape) {
      const auto n = ckpt::detail::element_count(shape, t.name);
      block.resize(n * ckpt::size_of(t.type));
      r.read(t.name, ckpt::tensor_ref(t.type, shape, block.data()).sharded({.global_shape = t.shape, .offset = offset}));
      if (d.type == t.type) {
        sink(d.name, std::span<const std::byte>(block));
      } else {
        converted.resize(n * ckpt::size_of(d.type));
        convert_elements(block.data(), t.type, converted.data(), d.type, n);
        sink(d.name, std::span<const std::byte>(converted));
      }
      done += block.size();
      bar.update(done);
    });
  }
}

/// A config value (ckpt keeps them as text) as the Python value it reads as: int, float,
/// bool, or else the string.
ckpt::interop::py_object python_value(const std::string& text) {
  if (text == "true") return true;
  if (text == "false") return false;
  const auto json = json_config_value(text);
  if (json != text) return text;  // not a JSON number: a string
  if (text.find_first_of(".eE") == std::string::npos) {
    try {
      std::size_t used = 0;
      const long long v = std::stoll(text, &used);
      if (used == text.size()) return static_cast<std::int64_t>(v);
    } catch (const std::exception&) {
      // beyond 64 bits: fall through to a float
    }
  }
  return std::stod(text);
}

/// Streams the region [lo, lo + shape) of tensor `t` into `w`'s open tensor, block by block
/// (at most `budget` bytes each, in C order), converted to `out`: memory stays bounded whatever
/// the tensor's size.
void stream_region(ckpt::interop::torch_writer& w, ckpt::reader<>& r, const ckpt::tensor_info& t, const ckpt::shape_t& lo,
                   const ckpt::shape_t& shape, ckpt::dtype out, std::uint64_t budget, progress_bar& bar, std::uint64_t& done) {
  std::vector<std::byte> block, converted;
  for_each_block(shape, ckpt::size_of(t.type), budget, [&](const ckpt::shape_t& offset, const ckpt::shape_t& part) {
    ckpt::shape_t at(offset.size());
    for (std::size_t d = 0; d < at.size(); ++d) at[d] = lo[d] + offset[d];
    const auto n = ckpt::detail::element_count(part, t.name);
    block.resize(n * ckpt::size_of(t.type));
    r.read(t.name, ckpt::tensor_ref(t.type, part, block.data()).sharded({.global_shape = t.shape, .offset = at}));
    if (out == t.type) {
      w.write(block);
    } else {
      converted.resize(n * ckpt::size_of(out));
      convert_elements(block.data(), t.type, converted.data(), out, n);
      w.write(converted);
    }
    done += block.size();
    bar.update(done);
  });
}

/// One .pt file holding `decls[first..last)` (indices in `which`): a state dict, or with
/// layout megatron GPT-NeoX's model_optim_rng.pt dict.
void put_path(ckpt::interop::py_object& root, const std::string& path, ckpt::interop::py_object value);
void restore_containers(ckpt::interop::py_object& root, const std::string& lines, const std::string& prefix);
void write_pt(const fs::path& file, ckpt::reader<>& r, const std::vector<ckpt::interop::tensor_decl>& decls,
              const std::vector<std::size_t>& which, const export_args& a, progress_bar& bar, std::uint64_t& done) {
  using ckpt::interop::py_object;
  ckpt::interop::torch_writer w(file, {.archive_name = file.stem().string(), .zip = {}});
  auto model = py_object::ordered_dict(), optimizer = py_object::dict(), flat = py_object::ordered_dict();
  // An imported optimizer (its containers recorded) is nested again by its dotted names.
  const bool nested = r.info().config.find("ckpt_import.containers") != nullptr;
  for (const auto k : which) {
    const auto& d = decls[k];
    const auto& t = *r.find(group_prefix(a) + d.name);
    py_object node = w.begin_tensor(d.type, d.shape);
    stream_region(w, r, t, ckpt::shape_t(t.shape.size(), 0), t.shape, d.type, a.block_bytes, bar, done);
    w.end_tensor();
    if (a.layout == "megatron" && d.name.starts_with("optimizer.") && nested)
      put_path(optimizer, d.name.substr(10), node);  // the tree torch's state_dict() had
    else if (a.layout == "megatron" && d.name.starts_with("optimizer."))
      optimizer.insert_new(d.name.substr(10), node);  // a ckpt checkpoint's own names (distinct)
    else if (a.layout == "megatron")
      model.insert_new(d.name, node);
    else
      flat.insert_new(d.name, node);
  }
  if (a.layout != "megatron") {
    w.finish(flat);
    return;
  }
  const auto& info = r.info();
  auto args = py_object::dict();
  for (const auto& [key, text] : info.config.entries()) {
    if (key.starts_with("ckpt_import.")) continue;  // ckpt's own notes on the import
    if (key.starts_with("optimizer.")) {
      if (a.optimizer) put_path(optimizer, key.substr(10), python_value(text));  // the optimizer's scalars
    } else {
      args.set(key, python_value(text));
    }
  }
  if (const auto* c = info.config.find("ckpt_import.containers"); c && a.optimizer) restore_containers(optimizer, *c, "optimizer");
  w.finish(py_object::dict({{"iteration", static_cast<std::int64_t>(info.iteration)},
                            {"checkpoint_version", 3.0},
                            {"args", args},
                            {"model", model},
                            {"optimizer", optimizer},
                            {"ckpt_tag", info.tag}}));
}

// ----- --layout megatron into a folder: one model_optim_rng.pt per tp/pp rank ----------------
// What Megatron-LM's load_checkpoint reads (megatron/training/checkpointing.py, read): the
// tracker file, iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt holding args (an
// argparse.Namespace), checkpoint_version, iteration, model (the rank's shards, its stage's
// layers numbered from 0), optimizer, and rng_state[0] with Python's, numpy's and torch's states.

/// The rank (t, p) a ckpt shard file belongs to: mp_rank_TT[_PPP]/...
std::pair<std::uint32_t, std::uint32_t> rank_of_file(const std::string& path) {
  static const std::regex re(R"(^mp_rank_(\d+)(?:_(\d+))?/)");
  std::smatch m;
  if (!std::regex_search(path, m, re)) throw ckpt::error(ckpt::error_kind::corrupt, "export: shard file " + path + " is not mp_rank_TT[_PPP]/...");
  return {static_cast<std::uint32_t>(std::stoul(m[1])), m[2].matched ? static_cast<std::uint32_t>(std::stoul(m[2])) : 0u};
}

/// A std::mt19937 saved as a value, as Python's random.getstate() or numpy's get_state().
ckpt::interop::py_object python_rng_state(const std::mt19937& e, const ckpt::config& config, const std::string& name) {
  using ckpt::interop::py_object;
  std::ostringstream text;
  text << e;  // libstdc++: the 624 words, then the position
  std::istringstream in(text.str());
  std::vector<std::uint64_t> words(624);
  std::uint64_t pos = 0;
  for (auto& w : words) in >> w;
  in >> pos;
  if (!in) throw ckpt::error(ckpt::error_kind::invalid_argument, "export: value " + name + " is not an MT19937 state in libstdc++'s text form");
  if (const auto* gauss = config.find(name + ".has_gauss")) {
    // numpy: ('MT19937', uint32 array of 624, position, has_gauss, cached_gaussian)
    std::string raw(624 * 4, '\0');
    for (std::size_t i = 0; i < 624; ++i) {
      const auto w = static_cast<std::uint32_t>(words[i]);
      std::memcpy(raw.data() + 4 * i, &w, 4);
    }
    const auto* cached = config.find(name + ".cached_gaussian");
    auto key = py_object::tuple({py_object("<u4").with_class(ckpt::interop::py_class::numpy_dtype), py_object::tuple({624}), py_object::bytes(raw)})
                   .with_class(ckpt::interop::py_class::numpy_array);
    return py_object::tuple({"MT19937", std::move(key), static_cast<std::int64_t>(pos), static_cast<std::int64_t>(std::stoll(*gauss)),
                             cached ? std::stod(*cached) : 0.0});
  }
  py_object::list_type state;
  for (const auto w : words) state.push_back(static_cast<std::int64_t>(w));
  state.push_back(static_cast<std::int64_t>(pos));
  return py_object::tuple({3, py_object::tuple(std::move(state)), py_object()});
}

/// Sets `value` at the dotted `path` under `root` (a dict), making dicts on the way; a number
/// under "rng_state" is a list index, as Megatron's rng_state is a list.
void put_path(ckpt::interop::py_object& root, const std::string& path, ckpt::interop::py_object value) {
  using ckpt::interop::py_object;
  py_object* at = &root;
  std::size_t from = 0;
  while (true) {
    const auto dot = path.find('.', from);
    const std::string key = path.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
    if (dot == std::string::npos) {
      at->set(key, std::move(value));
      return;
    }
    if (!at->contains(key)) at->set(key, py_object::dict());
    at = &at->at(key);
    from = dot + 1;
  }
}

/// Gives a tree built by put_path its containers back, as `ckpt import` recorded them under
/// `prefix` (config ckpt_import.containers: "list optimizer.param_groups", "int-keys
/// optimizer.state", ...): dicts of "0".."n-1" become lists or tuples again, and dicts whose
/// keys were ints get int keys. The deepest first, so that a parent is still a dict of names.
void restore_containers(ckpt::interop::py_object& root, const std::string& lines, const std::string& prefix) {
  using ckpt::interop::py_object;
  std::vector<std::pair<std::string, std::string>> todo;  // (kind, path below root)
  std::istringstream in(lines);
  for (std::string line; std::getline(in, line);) {
    const auto sp = line.find(' ');
    if (sp == std::string::npos) continue;
    const auto kind = line.substr(0, sp), path = line.substr(sp + 1);
    if (path == prefix) todo.emplace_back(kind, "");
    else if (path.starts_with(prefix + ".")) todo.emplace_back(kind, path.substr(prefix.size() + 1));
  }
  const auto depth = [](const std::string& p) { return p.empty() ? 0 : 1 + std::count(p.begin(), p.end(), '.'); };
  std::stable_sort(todo.begin(), todo.end(), [&](const auto& a, const auto& b) { return depth(a.second) > depth(b.second); });
  for (const auto& [kind, path] : todo) {
    py_object* parent = nullptr;
    py_object* at = &root;
    std::string last;
    for (std::size_t from = 0; at && !path.empty();) {
      const auto dot = path.find('.', from);
      last = path.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
      parent = at;
      at = at->is_dict() ? at->find(last) : nullptr;
      if (dot == std::string::npos) break;
      from = dot + 1;
    }
    if (!at) {  // an empty list or tuple had nothing to flatten: make it again
      if (parent && parent->is_dict() && kind != "int-keys") parent->set(last, kind == "tuple" ? py_object::tuple() : py_object::list());
      continue;
    }
    if (!at->is_dict()) continue;
    if (kind == "int-keys") {
      auto d = py_object::dict();
      for (const auto& [k, v] : at->entries()) {
        const auto& name = k.as_str();
        if (name.empty() || name.size() > 18 || !std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
          d = *at;  // not all numbers: left as it is
          break;
        }
        d.set(static_cast<std::int64_t>(std::stoll(name)), v);
      }
      *at = std::move(d);
    } else {
      py_object::list_type items;
      for (std::size_t i = 0;; ++i) {
        const py_object* v = at->find(std::to_string(i));
        if (!v) break;
        items.push_back(*v);
      }
      if (items.size() == at->size()) *at = kind == "tuple" ? py_object::tuple(std::move(items)) : py_object::list(std::move(items));
    }
  }
}

/// Megatron's rng_state is a list of one dict per data-parallel rank: {"0": {...}} -> [{...}].
ckpt::interop::py_object as_rng_list(ckpt::interop::py_object d) {
  using ckpt::interop::py_object;
  if (!d.is_dict()) return d;
  py_object::list_type items;
  for (std::size_t i = 0;; ++i) {
    const py_object* v = d.find(std::to_string(i));
    if (!v) break;
    items.push_back(*v);
  }
  return items.size() == d.size() ? py_object::list(std::move(items)) : d;
}

/// The RNG states GPT-NeoX keeps at the top of its client state (and Megatron-LM in rng_state).
bool is_rng_name(const std::string& n) {
  for (const std::string_view k : {"random_rng_state", "np_rng_state", "torch_rng_state", "cuda_rng_state", "rng_tracker_states"})
    if (n == k || n.starts_with(std::string(k) + ".")) return true;
  return n.starts_with("rng_state.");
}
/// DeepSpeed's own entries of a model-states file (deepspeed/runtime/engine.py _save_checkpoint,
/// read): on import they became config entries; on export they go back to the top.
constexpr std::string_view deepspeed_keys[] = {"skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size",
                                               "ds_version"};

/// The layer index of a DeepSpeed PipelineModule parameter name ("12.mlp.dense_h_to_4h.weight"
/// gives 12 and "mlp.dense_h_to_4h.weight"), or nothing.
std::optional<std::pair<std::uint64_t, std::string>> pipeline_layer(const std::string& name) {
  std::size_t i = 0;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
  if (i == 0 || i > 9 || i + 1 >= name.size() || name[i] != '.') return std::nullopt;
  return std::pair{std::stoull(name.substr(0, i)), name.substr(i + 1)};
}

std::size_t export_rank_folders(ckpt::reader<>& r, const export_args& a, progress_bar& bar) {
  using ckpt::interop::py_object;
  const auto& info = r.info();
  const bool deepspeed = a.layout == "deepspeed";
  const std::uint32_t T = std::max(info.topology.tp, 1u), P = std::max(info.topology.pp, 1u);
  // A DeepSpeed pipeline: its model tensors are named as PipelineModule names them (the
  // layer's index, then the key), and go to layer files; the mp_rank files keep the rest.
  bool pipeline = false, other_model_names = false;
  for (const auto& t : info.tensors) {
    if (t.name.starts_with("__ckpt") || t.name.starts_with("optimizer.") || is_rng_name(t.name)) continue;
    (pipeline_layer(t.name) ? pipeline : other_model_names) = true;
  }
  pipeline = deepspeed && pipeline && !other_model_names;
  if (deepspeed && P > 1 && !pipeline)
    throw ckpt::error(ckpt::error_kind::invalid_argument,
                      "export --layout deepspeed: the checkpoint has pp=" + std::to_string(P) +
                          ", but not every model tensor is named as DeepSpeed's PipelineModule names them (LL.key, as an import of "
                          "layer_LL-model_TT-model_states.pt gives); reshard it to pp=1 for the mp_rank_TT_model_states.pt layout");
  std::set<std::string> per_rank;
  if (const auto* l = info.config.find("ckpt_import.per_rank_tensors")) {
    std::istringstream in(*l);
    for (std::string n; std::getline(in, n);) per_rank.insert(n);
  }
  // Where each tensor lives: per rank (t, p), the box of its chunks in that rank's file.
  struct box {
    ckpt::shape_t lo, hi;
  };
  std::map<std::pair<std::string, std::uint32_t>, box> boxes;  // (tensor, rank) -> box
  std::map<std::string, std::uint32_t> stage_of;                // the stage of a tensor's first writer
  for (const auto& t : info.tensors) {
    if (t.name.starts_with("__ckpt")) continue;
    for (const auto& c : r.chunks(t.name)) {
      const auto [tp, pp] = rank_of_file(c.file);
      const std::uint32_t rank = tp + T * pp;
      ckpt::shape_t end(c.offset.size());
      for (std::size_t d = 0; d < end.size(); ++d) end[d] = c.offset[d] + c.shape[d];
      auto [it, fresh] = boxes.try_emplace({t.name, rank}, box{c.offset, end});
      for (std::size_t d = 0; !fresh && d < end.size(); ++d) {  // the rank's chunks tile its shard: their union
        it->second.lo[d] = std::min(it->second.lo[d], c.offset[d]);
        it->second.hi[d] = std::max(it->second.hi[d], end[d]);
      }
      stage_of.try_emplace(t.name, pp);
    }
  }
  // A tensor written whole by one rank (replicated over its stage): every rank of the stage has it.
  std::set<std::string> whole;
  for (const auto& [key, b] : boxes) {
    const auto* t = r.find(key.first);
    if (b.lo == ckpt::shape_t(b.lo.size(), 0) && b.hi == t->shape) whole.insert(key.first);
  }
  // Layers of each stage, to number them from 0 again.
  std::vector<std::uint64_t> first_layer(P, std::numeric_limits<std::uint64_t>::max());
  for (const auto& [key, b] : boxes)
    if (const auto L = layer_of(key.first); L && !key.first.starts_with("optimizer."))
      first_layer[key.second / T] = std::min(first_layer[key.second / T], *L);
  // Config: the run's args; ckpt's own entries, and those of the RNG states, stay out (and
  // DeepSpeed's bookkeeping, which goes back to its place in the deepspeed layout).
  auto args = py_object::dict(), bookkeeping = py_object::dict(), ds_config = py_object::dict();
  std::vector<std::pair<std::string, py_object>> optimizer_config;
  const auto* containers = info.config.find("ckpt_import.containers");  // an imported optimizer: nested again
  // DeepSpeed keeps a pipeline's optimizer, and any ZeRO optimizer, in ZeRO partitions, which
  // are not written yet: the optimizer is listed as left out.
  const bool zero_left_out = deepspeed && a.optimizer && (pipeline || info.config.find("optimizer.zero_partitions"));
  for (const auto& [key, text] : info.config.entries()) {
    if (key.starts_with("ckpt_import.") || key.ends_with(".has_gauss") || key.ends_with(".cached_gaussian")) continue;
    if (deepspeed && std::find(std::begin(deepspeed_keys), std::end(deepspeed_keys), key) != std::end(deepspeed_keys))
      bookkeeping.set(key, python_value(text));
    else if (deepspeed && key.starts_with("ds_config."))
      put_path(ds_config, key.substr(10), python_value(text));  // DeepSpeed's config, as a dict again
    else if (key.starts_with("optimizer."))
      optimizer_config.emplace_back(key.substr(10), python_value(text));  // the optimizer's own (param groups, step), not the run's args
    else
      args.set(key, python_value(text));
  }
  // GPT-NeoX's client state carries the validation logits in every rank's file.
  std::optional<ckpt::interop::host_tensor> logits;
  if (const auto* l = r.validation_logits(); l && deepspeed) {
    logits.emplace(ckpt::interop::host_tensor{l->type, l->shape, std::vector<std::byte>(static_cast<std::size_t>(l->raw_bytes))});
    r.read_validation_logits(logits->ref());
  }
  const fs::path root = a.out;
  char tag[32];
  std::snprintf(tag, sizeof tag, deepspeed ? "global_step%llu" : "iter_%07llu", static_cast<unsigned long long>(info.iteration));
  std::uint64_t done = 0;
  for (std::uint32_t p = 0; p < P; ++p)
    for (std::uint32_t t = 0; t < T; ++t) {
      const std::uint32_t rank = t + T * p;
      char folder[48];
      if (deepspeed)
        std::snprintf(folder, sizeof folder, "mp_rank_%02u_model_states.pt", rank);  // DeepSpeed's model-parallel rank: stage * tp + t
      else
        std::snprintf(folder, sizeof folder, P > 1 ? "mp_rank_%02u_%03u/model_optim_rng.pt" : "mp_rank_%02u/model_optim_rng.pt", t, p);
      const fs::path file = root / tag / folder;
      fs::create_directories(file.parent_path());
      ckpt::interop::torch_writer w(file, {.archive_name = file.stem().string(), .zip = {}});
      auto model = py_object::ordered_dict(), optimizer = py_object::dict(), extra = py_object::dict();
      for (const auto& ti : info.tensors) {
        // ckpt's own tensors (the validation logits) are not read through the reader's API yet
        if (ti.name.starts_with("__ckpt")) continue;
        if (!a.optimizer && ti.name.starts_with("optimizer.")) continue;
        if (pipeline && pipeline_layer(ti.name)) continue;  // layer files; see below
        if (zero_left_out && ti.name.starts_with("optimizer.")) continue;  // listed below
        ckpt::shape_t lo(ti.shape.size(), 0), hi = ti.shape;
        if (auto it = boxes.find({ti.name, rank}); it != boxes.end()) {
          lo = it->second.lo;
          hi = it->second.hi;
        } else if (whole.count(ti.name) && stage_of[ti.name] == p && !per_rank.count(ti.name)) {
          // written once, whole: every rank of its stage holds it
        } else {
          continue;  // not this rank's
        }
        ckpt::shape_t shape(lo.size());
        for (std::size_t d = 0; d < lo.size(); ++d) shape[d] = hi[d] - lo[d];
        const bool row = per_rank.count(ti.name) > 0;  // [1, ...] at [rank, ...]: the rank's own, without the first dimension
        ckpt::shape_t out_shape = row ? ckpt::shape_t(shape.begin() + 1, shape.end()) : shape;
        const auto out_type = exported_dtype(ti.name, ti.type, a.dtype);  // --dtype, as in every export
        py_object node = w.begin_tensor(out_type, out_shape);
        stream_region(w, r, ti, lo, shape, out_type, a.block_bytes, bar, done);
        w.end_tensor();
        const std::string local = ti.name.starts_with("optimizer.") || first_layer[p] == std::numeric_limits<std::uint64_t>::max()
                                      ? ti.name
                                      : shift_layer(ti.name, -static_cast<std::int64_t>(first_layer[p]));
        if (ti.name.starts_with("optimizer."))
          containers ? put_path(optimizer, ti.name.substr(10), node) : optimizer.set(ti.name.substr(10), node);
        else if (is_rng_name(ti.name))
          put_path(extra, ti.name, node);
        else
          model.set(local, node);
      }
      for (const auto& v : info.values) {
        if (v.rank != rank) continue;
        std::mt19937 e;
        const auto bytes = r.value_bytes(v.name, rank);
        try {
          ckpt::detail::decode_value(std::span<const std::byte>(bytes), e, v.name);
        } catch (const ckpt::error&) {
          continue;  // not an RNG engine (a per-rank config entry): Megatron has no place for it
        }
        put_path(extra, v.name, python_rng_state(e, info.config, v.name));
      }
      // The optimizer as torch's state_dict() has it: its scalars from the config, and its lists,
      // tuples and int-keyed dicts as the import found them.
      if (a.optimizer && !zero_left_out) {
        for (const auto& [k, v] : optimizer_config) put_path(optimizer, k, v);
        if (containers) restore_containers(optimizer, *containers, "optimizer");
      }
      py_object top;
      if (deepspeed) {
        // DeepSpeed's engine state (what its load_checkpoint reads), then GPT-NeoX's client state:
        // iteration, args (a dict), the five RNG entries, checkpoint_validation_logits.
        auto shapes = py_object::ordered_dict();
        for (const auto& [k, v] : model.entries())
          shapes.set(k, py_object::tuple(py_object::list_type(v.as_tensor().value.shape.begin(), v.as_tensor().value.shape.end()))
                            .with_class(ckpt::interop::py_class::torch_size));
        const auto counter = [&](const char* k, std::int64_t fallback) {
          const py_object* v = bookkeeping.find(k);
          return v && v->is_int() ? *v : py_object(fallback);
        };
        top = py_object::dict({{"module", pipeline ? py_object() : model},  // a pipeline's weights are in its layer files
                               {"buffer_names", py_object::list()},
                               {"optimizer", py_object()},
                               {"param_shapes", pipeline ? py_object() : py_object::list({shapes})},
                               {"frozen_param_shapes", py_object()},
                               {"shared_params", py_object::dict()},
                               {"frozen_param_fragments", py_object()},
                               {"lr_scheduler", py_object()},
                               {"data_sampler", py_object()},
                               {"random_ltd", py_object()},
                               {"sparse_tensor_module_names", py_object::list().with_class(ckpt::interop::py_class::set)},
                               {"skipped_steps", counter("skipped_steps", 0)},
                               {"global_steps", counter("global_steps", static_cast<std::int64_t>(info.iteration))},
                               {"global_samples", counter("global_samples", 0)},
                               {"dp_world_size", counter("dp_world_size", 1)},
                               {"mp_world_size", static_cast<std::int64_t>(T) * P},
                               {"ds_config", ds_config.entries().empty() ? py_object() : ds_config},
                               {"ds_version", bookkeeping.find("ds_version") ? *bookkeeping.find("ds_version") : py_object("0.16.5")},
                               {"iteration", static_cast<std::int64_t>(info.iteration)},
                               {"args", args}});
        if (!optimizer.entries().empty()) top.set("optimizer", optimizer);
        if (logits) top.set("checkpoint_validation_logits", w.add_tensor(*logits));
        for (auto& [k, v] : extra.entries()) top.set(k, v);
      } else {
        top = py_object::dict({{"args", py_object(args).with_class(ckpt::interop::py_class::argparse_namespace)},
                               {"checkpoint_version", 3.0},
                               {"iteration", static_cast<std::int64_t>(info.iteration)},
                               {"model", model},
                               {"optimizer", optimizer}});
        for (auto& [k, v] : extra.entries()) top.set(k, k.as_str() == "rng_state" ? as_rng_list(v) : v);
      }
      w.finish(top);
    }
  std::size_t files = static_cast<std::size_t>(T) * P;
  if (pipeline) {
    // layer_LL-model_TT-model_states.pt: tp rank t's shards of layer LL, under their keys.
    std::map<std::uint64_t, std::vector<const ckpt::tensor_info*>> layers;
    for (const auto& ti : info.tensors) {
      if (ti.name.starts_with("optimizer.")) continue;
      if (const auto l = pipeline_layer(ti.name); l && !ti.name.starts_with("__ckpt")) layers[l->first].push_back(&ti);
    }
    for (const auto& [layer, tensors] : layers)
      for (std::uint32_t t = 0; t < T; ++t) {
        char name[96];
        std::snprintf(name, sizeof name, "layer_%02llu-model_%02u-model_states.pt", static_cast<unsigned long long>(layer), t);
        const fs::path file = root / tag / name;
        ckpt::interop::torch_writer w(file, {.archive_name = file.stem().string(), .zip = {}});
        auto sd = py_object::ordered_dict();
        for (const auto* ti : tensors) {
          // tp rank t's shard: its box in whichever stage's file holds it, else the whole tensor
          ckpt::shape_t lo(ti->shape.size(), 0), hi = ti->shape;
          for (std::uint32_t p = 0; p < P; ++p)
            if (auto it = boxes.find({ti->name, t + T * p}); it != boxes.end()) {
              lo = it->second.lo;
              hi = it->second.hi;
              break;
            }
          ckpt::shape_t shape(lo.size());
          for (std::size_t d = 0; d < lo.size(); ++d) shape[d] = hi[d] - lo[d];
          const auto out_type = a.dtype && ckpt::is_floating(ti->type) ? *a.dtype : ti->type;
          py_object node = w.begin_tensor(out_type, shape);
          stream_region(w, r, *ti, lo, shape, out_type, a.block_bytes, bar, done);
          w.end_tensor();
          sd.set(pipeline_layer(ti->name)->second, node);
        }
        w.finish(sd);
        ++files;
      }
  }
  if (zero_left_out) {
    std::size_t n = 0;
    for (const auto& ti : info.tensors) n += ti.name.starts_with("optimizer.");
    if (n)
      std::fprintf(stderr,
                   "ckpt export: left out %zu optimizer tensors: DeepSpeed keeps %s optimizer in ZeRO partitions, which export "
                   "does not write yet (load with load_optimizer_states=False; GPT-NeoX: no_load_optim)\n",
                   n, pipeline ? "a pipeline's" : "a ZeRO");
  }
  // The tracker file last, through a temporary name: a reader never sees a half-written one.
  const auto tracker = root / (deepspeed ? "latest" : "latest_checkpointed_iteration.txt"), temp = fs::path(tracker.string() + ".tmp");
  {
    std::ofstream f(temp);
    if (deepspeed)
      f << tag;
    else
      f << info.iteration;
    if (!f) throw ckpt::error(ckpt::error_kind::io, "cannot write " + temp.string());
  }
  fs::rename(temp, tracker);
  return files;
}

}  // namespace

/// `ckpt export --format torch`: one .pt file, or Hugging Face's pytorch_model-XXXXX-of-YYYYY.bin
/// shards with pytorch_model.bin.index.json when --max-shard-size asks for several.
std::size_t export_torch(ckpt::reader<>& r, const std::vector<ckpt::interop::tensor_decl>& decls, const export_args& a,
                         bool single_file, progress_bar& bar) {
  std::uint64_t done = 0;
  std::vector<std::size_t> all(decls.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  if (single_file) {
    write_pt(a.out, r, decls, all, a, bar, done);
    return 1;
  }
  const fs::path dir = a.out;
  fs::create_directories(dir);
  const auto plan = ckpt::interop::plan_shards(decls, a.max_shard_bytes.value_or(UINT64_MAX));
  if (plan.size() == 1) {
    write_pt(dir / "pytorch_model.bin", r, decls, all, a, bar, done);
    return 1;
  }
  if (a.layout == "megatron")
    throw ckpt::error(ckpt::error_kind::invalid_argument, "--layout megatron writes one file; it cannot be split by --max-shard-size");
  char name[64];
  std::string map;
  std::uint64_t total = 0;
  for (std::size_t s = 0; s < plan.size(); ++s) {
    std::snprintf(name, sizeof name, "pytorch_model-%05zu-of-%05zu.bin", s + 1, plan.size());
    write_pt(dir / name, r, decls, plan[s].tensors, a, bar, done);
    for (const auto k : plan[s].tensors) {
      map += std::string(map.empty() ? "" : ",\n") + "    " + json_string(decls[k].name) + ": " + json_string(name);
      total += decls[k].nbytes();
    }
  }
  // Written last and renamed into place: a reader that finds the index finds every shard.
  const auto index = dir / "pytorch_model.bin.index.json";
  const auto temp = dir / ".pytorch_model.bin.index.json.tmp";
  {
    std::FILE* f = std::fopen(temp.c_str(), "w");
    if (!f) throw ckpt::error(ckpt::error_kind::io, "cannot create " + temp.string());
    std::fprintf(f, "{\n  \"metadata\": {\n    \"total_size\": %" PRIu64 "\n  },\n  \"weight_map\": {\n%s\n  }\n}\n", total, map.c_str());
    const bool ok = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
    std::fclose(f);
    if (!ok) throw ckpt::error(ckpt::error_kind::io, "cannot write " + temp.string());
  }
  fs::rename(temp, index);
  return plan.size();
}

int run_export(const export_args& a) {
  const auto loc = locate(a.src, a.tag);
  ckpt::reader r{ckpt::posix(loc.root), loc.tag};
  const auto& info = r.info();
  const auto decls = exported(info, a, "optimizer");
  std::uint64_t total = 0;
  for (const auto& d : decls) total += r.find(group_prefix(a) + d.name)->raw_bytes;
  const fs::path out = a.out;
  // OUT names a file when it has the format's extension, otherwise a directory that gets
  // Hugging Face's file names.
  const bool single_file = a.format == "safetensors" ? out.extension() == ".safetensors"
                                                     : out.extension() == ".pt" || out.extension() == ".bin";
  progress_bar bar("export", total);
  std::size_t files = 1;
  if (a.format == "safetensors") {
    // The config goes along as metadata (a safetensors file imported earlier gets its
    // __metadata__ back), then what identifies the export.
    ckpt::interop::safetensors_metadata meta(info.config.entries().begin(), info.config.entries().end());
    meta["format"] = "pt";
    meta["ckpt_tag"] = info.tag;
    meta["ckpt_iteration"] = std::to_string(info.iteration);
    if (single_file) {
      // The reference implementation's order: by alignment, so every tensor's bytes start at a
      // multiple of its element size (an f64 after a bool would not).
      auto ordered = decls;
      ckpt::interop::sort_by_alignment(ordered);
      ckpt::interop::safetensors_writer w(out, ordered, meta);
      stream_tensors(r, ordered, group_prefix(a), a.block_bytes, bar, [&](const std::string& n, std::span<const std::byte> b) { w.write(n, b); });
      w.finish();
    } else {
      fs::create_directories(out);
      ckpt::interop::safetensors_sharded_writer w(out, decls, meta, a.max_shard_bytes.value_or(UINT64_MAX));
      stream_tensors(r, decls, group_prefix(a), a.block_bytes, bar, [&](const std::string& n, std::span<const std::byte> b) { w.write(n, b); });
      w.finish();
      files = w.shards().size();
    }
  } else if ((a.layout == "megatron" && !single_file) || a.layout == "deepspeed") {
    if (single_file) throw ckpt::error(ckpt::error_kind::invalid_argument, "--layout deepspeed writes a folder: give OUT without .pt");
    files = export_rank_folders(r, a, bar);
  } else {
    files = export_torch(r, decls, a, single_file, bar);
  }
  bar.finish();
  std::printf("exported %zu tensors (%s) of %s (iteration %" PRIu64 ") to %s as %s in %zu file(s)\n", decls.size(),
              human_bytes(static_cast<double>(total)).c_str(), info.tag.c_str(), info.iteration, a.out.c_str(), a.format.c_str(), files);
  if (a.group) {  // what --group left behind is said, not dropped silently
    std::size_t outside = 0;
    for (const auto& t : info.tensors) outside += !t.name.starts_with("__ckpt") && !t.name.starts_with(group_prefix(a));
    if (outside || !info.values.empty())
      std::fprintf(stderr, "left out: %zu tensors outside group %s and %zu values (ckpt ls %s lists them)\n", outside, a.group->c_str(),
                   info.values.size(), a.src.c_str());
  }
  return exit_ok;
}

}  // namespace ckpt_tool
