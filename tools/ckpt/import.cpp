// ckpt import FILE ROOT: a model from the Python world saved as a ckpt checkpoint. FILE is a
// .pt/.bin file torch.save wrote (read with ckpt's restricted unpickler: nothing in it can
// run), a .safetensors file, or the index JSON of a sharded set of either.
//
// Names: a tensor's path in the object tree, dict keys and list indices joined by '.'
// ({"model": {"fc.weight": t}} gives "model.fc.weight"). A training framework's file
// (Megatron-LM's model_optim_rng.pt, GPT-NeoX/DeepSpeed's mp_rank_TT_model_states.pt) maps
// onto ckpt's own layout: the model's tensors keep their state-dict names whether the file
// calls the dict `model`, `module` or `model0`..., the optimizer's go in the "optimizer"
// group, the iteration is `iteration` (or `total_iters`, `global_steps`, or the tag folder's
// name), `args` is the config and `checkpoint_validation_logits` the validation logits.
// Python's and numpy's MT19937 states become std::mt19937 values a C++ engine loads with
// v.value(name, engine). Other ints, floats, bools and strings become config entries; anything
// else is reported as left out.

#include <array>
#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>

#include <ckpt/ckpt.hpp>
#include <ckpt/interop/safetensors.hpp>
#include <ckpt/interop/torch.hpp>

#include "cli.hpp"

namespace ckpt_tool {

namespace fs = std::filesystem;
using ckpt::interop::py_kind;
using ckpt::interop::py_object;

namespace {

/// What the file holds, in ckpt's terms.
struct imported {
  std::vector<std::pair<std::string, ckpt::interop::host_tensor>> tensors;
  std::vector<std::pair<std::string, std::mt19937>> engines;  // Python's and numpy's RNG states
  ckpt::config config;
  std::optional<std::uint64_t> iteration;
  std::optional<ckpt::interop::host_tensor> validation_logits;
  std::vector<std::string> left_out;  // paths of values ckpt has no place for
};

/// The state a checkpointer saves: the imported tensors and engines under their names.
struct imported_state {
  imported* what;
  template <class V>
  void checkpoint(V& v) {
    for (auto& [name, t] : what->tensors) v.tensor(name, t.ref());
    for (auto& [name, e] : what->engines) v.value(name, e);
  }
};

// ----- RNG states ------------------------------------------------------------------------------
// Python's random and numpy's legacy RandomState are both MT19937, as std::mt19937 is: the same
// 624 words and position give the same numbers. An engine is made from them through its text
// form, which in libstdc++ is the 624 words and then the position.

std::mt19937 make_mt19937(const std::array<std::uint32_t, 624>& words, std::uint64_t pos, const std::string& where) {
#if !defined(__GLIBCXX__)
  throw ckpt::error(ckpt::error_kind::invalid_argument,
                    where + ": making a std::mt19937 from an MT19937 state needs libstdc++'s text form of the engine");
#endif
  if (pos > 624) throw ckpt::error(ckpt::error_kind::corrupt, where + ": MT19937 position " + std::to_string(pos) + " is past 624");
  std::ostringstream text;
  for (const auto w : words) text << w << ' ';
  text << pos;
  std::mt19937 e;
  std::istringstream in(text.str());
  in >> e;
  std::ostringstream back;
  back << e;
  if (!in || back.str() != text.str())
    throw ckpt::error(ckpt::error_kind::invalid_argument, where + ": this C++ library's std::mt19937 does not take an MT19937 state as 624 words and a position");
  return e;
}

/// random.getstate(): (3, (624 words..., position), None).
std::optional<std::mt19937> python_random_state(const py_object& o, const std::string& where) {
  if (!o.is_tuple() || o.size() != 3 || !o.items()[0].is_int() || o.items()[0].as_int() != 3 || !o.items()[1].is_tuple() ||
      o.items()[1].size() != 625)
    return std::nullopt;
  std::array<std::uint32_t, 624> words{};
  const auto& v = o.items()[1].items();
  for (std::size_t i = 0; i < 625; ++i)
    if (!v[i].is_int() || v[i].as_int() < 0 || v[i].as_int() > 0xffffffffLL) return std::nullopt;
  for (std::size_t i = 0; i < 624; ++i) words[i] = static_cast<std::uint32_t>(v[i].as_int());
  return make_mt19937(words, static_cast<std::uint64_t>(v[624].as_int()), where);
}

/// numpy.random.get_state(): ('MT19937', uint32 array of 624, position, has_gauss, cached_gaussian).
std::optional<std::mt19937> numpy_random_state(const py_object& o, const std::string& where) {
  using ckpt::interop::py_class;
  if (!o.is_tuple() || o.size() != 5 || !o.items()[0].is_str() || o.items()[0].as_str() != "MT19937") return std::nullopt;
  const auto& key = o.items()[1];
  if (key.python_class() != py_class::numpy_array || !o.items()[2].is_int())
    throw ckpt::error(ckpt::error_kind::corrupt, where + ": an MT19937 state without its key array and position");
  const auto& dt = key.items()[0].as_str();
  const auto raw = key.items()[2].as_bytes();
  if ((dt != "<u4" && dt != "<u8" && dt != "<i8") || key.items()[1] != py_object::tuple({624}))
    throw ckpt::error(ckpt::error_kind::corrupt, where + ": an MT19937 key must be 624 words, not " + key.repr().substr(0, 80));
  std::array<std::uint32_t, 624> words{};
  const std::size_t item = raw.size() / 624;
  for (std::size_t i = 0; i < 624; ++i) {
    std::uint64_t w = 0;
    std::memcpy(&w, raw.data() + i * item, item);  // little-endian, as the dtype says
    if (w > 0xffffffffu) throw ckpt::error(ckpt::error_kind::corrupt, where + ": MT19937 word " + std::to_string(i) + " exceeds 32 bits");
    words[i] = static_cast<std::uint32_t>(w);
  }
  if (o.items()[2].as_int() < 0) throw ckpt::error(ckpt::error_kind::corrupt, where + ": negative MT19937 position");
  return make_mt19937(words, static_cast<std::uint64_t>(o.items()[2].as_int()), where);
}

std::string key_text(const py_object& k) {
  switch (k.kind()) {
    case py_kind::string: return k.as_str();
    case py_kind::integer: return std::to_string(k.as_int());
    case py_kind::boolean: return k.as_bool() ? "True" : "False";
    default: return k.repr();
  }
}

std::string join(const std::string& prefix, const std::string& key) { return prefix.empty() ? key : prefix + "." + key; }

/// Tensors (by path), RNG engines and scalars (as config entries) of `o`, recursively.
void flatten(py_object& o, const std::string& path, imported& out, bool scalars_to_config) {
  const std::string where = "ckpt import: " + (path.empty() ? std::string("the file") : path);
  if (auto e = python_random_state(o, where)) {
    out.engines.emplace_back(path, *e);
    return;
  }
  if (auto e = numpy_random_state(o, where)) {
    out.engines.emplace_back(path, *e);
    // numpy's spare Gaussian has no place in a std::mt19937: it is kept beside it.
    out.config.set(join(path, "has_gauss"), o.items()[3].is_int() ? o.items()[3].as_int() : std::int64_t{o.items()[3].as_bool()});
    out.config.set(join(path, "cached_gaussian"), o.items()[4].as_float());
    return;
  }
  if (o.python_class() == ckpt::interop::py_class::numpy_array) {
    out.left_out.push_back(path + " (numpy.ndarray)");
    return;
  }
  switch (o.kind()) {
    case py_kind::tensor:
      out.tensors.emplace_back(path, std::move(o.as_tensor().value));
      return;
    case py_kind::dict:
      for (auto& [k, v] : o.entries()) flatten(v, join(path, key_text(k)), out, scalars_to_config);
      return;
    case py_kind::list:
    case py_kind::tuple: {
      auto& items = o.items();
      for (std::size_t i = 0; i < items.size(); ++i) flatten(items[i], join(path, std::to_string(i)), out, scalars_to_config);
      return;
    }
    case py_kind::integer:
      if (scalars_to_config) return void(out.config.set(path, o.as_int()));
      break;
    case py_kind::floating:
      if (scalars_to_config) return void(out.config.set(path, o.as_float()));
      break;
    case py_kind::boolean:
      if (scalars_to_config) return void(out.config.set(path, o.as_bool()));
      break;
    case py_kind::string:
      if (scalars_to_config) return void(out.config.set(path, o.as_str()));
      break;
    case py_kind::none:
      out.left_out.push_back(path + " (None)");  // a config has no None
      return;
    default:
      break;
  }
  out.left_out.push_back(path + " (" + std::string(ckpt::interop::to_string(o.kind())) + ")");
}

/// The model's state dict: "model" (Megatron-LM), "module" (DeepSpeed, GPT-NeoX), "model0",
/// "model1", ... (Megatron's virtual pipeline chunks).
bool is_model_key(const std::string& k) {
  if (k == "model" || k == "module") return true;
  return k.size() > 5 && k.starts_with("model") && std::all_of(k.begin() + 5, k.end(), [](char c) { return c >= '0' && c <= '9'; });
}
/// The keys that count iterations, in the order they are trusted.
constexpr std::string_view iteration_keys[] = {"iteration", "total_iters", "global_steps"};

/// A training framework's checkpoint file: a model dict and a step counter at the top.
bool is_framework_file(const py_object& root) {
  if (!root.is_dict()) return false;
  bool model = false, steps = false;
  for (const auto& [k, v] : root.entries()) {
    if (!k.is_str()) continue;
    if (is_model_key(k.as_str()) && (v.is_dict() || v.is_none())) model = true;
    if (std::find(std::begin(iteration_keys), std::end(iteration_keys), k.as_str()) != std::end(iteration_keys) && v.is_int())
      steps = true;
  }
  return model && steps;
}

void from_torch_tree(py_object root, imported& out) {
  if (!is_framework_file(root)) {
    flatten(root, "", out, true);
    return;
  }
  std::string counter;  // the key the iteration came from
  for (const auto key : iteration_keys)
    if (const py_object* v = root.find(std::string(key)); v && v->is_int() && v->as_int() >= 0) {
      out.iteration = static_cast<std::uint64_t>(v->as_int());
      counter = key;
      break;
    }
  const bool many_chunks = root.contains("model0") && root.contains("model1");
  for (auto& [k, v] : root.entries()) {
    const auto key = key_text(k);
    if (key == counter) {
      continue;
    } else if (key == "checkpoint_version" || key == "ckpt_tag") {
      continue;  // describe the .pt layout (Megatron's version, ckpt export's source), not the run
    } else if (is_model_key(key)) {
      // Chunks of a virtual pipeline keep their chunk's name: their state dicts reuse names.
      if (!v.is_none()) flatten(v, many_chunks && key != "model" && key != "module" ? key : "", out, false);
    } else if (key == "optimizer") {
      flatten(v, "optimizer", out, true);
    } else if (key == "args" && v.is_dict()) {
      flatten(v, "", out, true);  // a dict (GPT-NeoX) or an argparse.Namespace (Megatron-LM)
    } else if (key == "checkpoint_validation_logits" && v.is_tensor()) {
      out.validation_logits = std::move(v.as_tensor().value);
    } else {
      flatten(v, key, out, true);
    }
  }
}

/// The iteration in a tag folder's name: global_step200 (DeepSpeed), iter_0000200 (Megatron).
std::optional<std::uint64_t> iteration_of_folder(const fs::path& file) {
  for (auto dir = file.parent_path(); !dir.empty() && dir != dir.parent_path(); dir = dir.parent_path()) {
    const auto name = dir.filename().string();
    for (const std::string_view prefix : {"global_step", "iter_"}) {
      if (!name.starts_with(prefix) || name.size() == prefix.size() || name.size() > prefix.size() + 19) continue;
      const auto digits = name.substr(prefix.size());
      if (std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::stoull(digits);
    }
  }
  return std::nullopt;
}

/// pytorch_model.bin.index.json: its weight_map names the shards; each is a flat state dict.
void from_torch_index(const fs::path& index, imported& out) {
  std::ifstream in(index);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  ckpt::interop::detail::rj::Document doc;  // the rapidjson safetensors.hpp parses with
  doc.Parse(text.c_str(), text.size());
  if (doc.HasParseError() || !doc.IsObject() || !doc.HasMember("weight_map") || !doc["weight_map"].IsObject())
    throw ckpt::error(ckpt::error_kind::corrupt, index.string() + ": not an index JSON with a weight_map");
  std::set<std::string> shards;
  std::map<std::string, std::string> wanted;
  for (auto it = doc["weight_map"].MemberBegin(); it != doc["weight_map"].MemberEnd(); ++it) {
    if (!it->value.IsString()) throw ckpt::error(ckpt::error_kind::corrupt, index.string() + ": weight_map values must be file names");
    const std::string file = it->value.GetString();
    if (file.find('/') != std::string::npos || file == ".." || file.empty())
      throw ckpt::error(ckpt::error_kind::corrupt, index.string() + ": weight_map names " + ckpt::detail::printable(file));
    shards.insert(file);
    wanted[it->name.GetString()] = file;
  }
  for (const auto& file : shards) {
    imported part;
    from_torch_tree(ckpt::interop::load_torch(index.parent_path() / file), part);
    for (auto& [name, t] : part.tensors) {
      auto w = wanted.find(name);
      if (w == wanted.end() || w->second != file)
        throw ckpt::error(ckpt::error_kind::corrupt, (index.parent_path() / file).string() + " holds tensor " +
                                                         ckpt::detail::printable(name) + ", which " + index.string() +
                                                         " does not place there");
      wanted.erase(w);
      out.tensors.emplace_back(std::move(name), std::move(t));
    }
  }
  if (!wanted.empty())
    throw ckpt::error(ckpt::error_kind::corrupt, index.string() + " lists tensor " + ckpt::detail::printable(wanted.begin()->first) +
                                                     " in " + wanted.begin()->second + ", which does not hold it");
}

template <class Source>
void from_safetensors(const Source& src, const std::vector<ckpt::interop::safetensors_entry>& entries,
                      const ckpt::interop::safetensors_metadata& meta, imported& out) {
  for (const auto& e : entries) out.tensors.emplace_back(e.name, src.read(e.name));
  for (const auto& [k, v] : meta) {
    if (k == "ckpt_iteration") {
      try {
        out.iteration = std::stoull(v);
      } catch (const std::exception&) {
        out.config.set(k, v);
      }
    } else if (k != "ckpt_tag") {
      out.config.set(k, v);
    }
  }
}

bool ends_with(const std::string& s, std::string_view tail) { return s.size() >= tail.size() && s.ends_with(tail); }

}  // namespace

int run_import(const import_args& a) {
  const fs::path file = a.file;
  if (!fs::is_regular_file(file)) throw ckpt::error(ckpt::error_kind::not_found, "no such file: " + a.file);
  imported what;
  const auto name = file.filename().string();
  if (ends_with(name, ".safetensors.index.json")) {
    ckpt::interop::safetensors_index index(file);
    std::vector<ckpt::interop::safetensors_entry> entries;
    for (const auto& s : index.shards())
      for (const auto& e : s.tensors()) entries.push_back(e);
    from_safetensors(index, entries, index.shards().empty() ? ckpt::interop::safetensors_metadata{} : index.shards().front().metadata(), what);
  } else if (ends_with(name, ".safetensors")) {
    ckpt::interop::safetensors_file st(file);
    from_safetensors(st, st.tensors(), st.metadata(), what);
  } else if (ends_with(name, ".index.json")) {
    from_torch_index(file, what);
  } else {
    from_torch_tree(ckpt::interop::load_torch(file), what);
  }
  if (what.tensors.empty()) throw ckpt::error(ckpt::error_kind::invalid_argument, a.file + " holds no tensors");
  if (!what.iteration) what.iteration = iteration_of_folder(fs::absolute(file));
  const std::uint64_t iteration = a.iteration.value_or(what.iteration.value_or(0));
  std::uint64_t bytes = 0;
  for (const auto& [n, t] : what.tensors) bytes += t.data.size();
  ckpt::checkpointer<ckpt::single_process, ckpt::posix> cp{{}, fs::path(a.root)};
  imported_state state{&what};
  std::optional<ckpt::tensor_ref> logits;
  if (what.validation_logits) logits = what.validation_logits->ref();
  cp.save(iteration, state, {.config = what.config, .tag = a.tag, .validation_logits = logits, .overwrite = false});
  for (const auto& p : what.left_out)
    std::fprintf(stderr, "ckpt import: left out %s: ckpt keeps tensors, scalars and RNG states only\n", p.c_str());
  std::printf("imported %zu tensors (%s), %zu config entries and %zu RNG states from %s into %s as %s (iteration %" PRIu64 ")\n",
              what.tensors.size(), human_bytes(static_cast<double>(bytes)).c_str(), what.config.entries().size(), what.engines.size(),
              a.file.c_str(), a.root.c_str(), cp.latest().value_or("?").c_str(), iteration);
  return exit_ok;
}

}  // namespace ckpt_tool
