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

#include <fnmatch.h>

#include <array>
#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <ckpt/ckpt.hpp>
#include <ckpt/in_process.hpp>
#include <ckpt/interop/safetensors.hpp>
#include <ckpt/interop/torch.hpp>

#include "cli.hpp"
#include "layers.hpp"
#include "streamed.hpp"
#include "zero.hpp"

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
  // The optimizer's containers that were not string-keyed dicts ("list optimizer.param_groups",
  // "int-keys optimizer.state"), so an export can give its loader the same structure back.
  std::vector<std::string> containers;
  std::vector<std::string> origin;    // per tensor, the file it came from when not the rank's own ("" or absent: it is)
  // Streaming: tensors whose bytes stay in their file until the save reads them.
  file_tensors* files = nullptr;                          // where they are recorded
  ckpt::interop::torch_tensor_source* source = nullptr;  // the file being flattened
  std::vector<int> streamed;                              // per tensor: its number in `files`, or -1 (in memory)

  /// What the checkpointer saves tensor i from.
  ckpt::tensor_ref ref(std::size_t i) {
    if (i < streamed.size() && streamed[i] >= 0) return files->ref(streamed[i]);
    return tensors[i].second.ref();
  }
  /// Bytes [offset, offset + out.size()) of tensor i.
  void read(std::size_t i, std::uint64_t offset, std::span<std::byte> out) const {
    if (i < streamed.size() && streamed[i] >= 0) return files->read(streamed[i], offset, out);
    std::memcpy(out.data(), tensors[i].second.data.data() + offset, out.size());
  }
  /// Adds a tensor: `t` holds its bytes (k = -1), or only its dtype and shape, the bytes being
  /// entry k of `files`.
  void add(std::string name, ckpt::interop::host_tensor t, int k = -1) {
    streamed.resize(tensors.size(), -1);
    streamed.push_back(k);
    tensors.emplace_back(std::move(name), std::move(t));
  }
  /// Adds a tensor of the file being read: streamed when load_torch left its bytes.
  void add_tensor(std::string name, ckpt::interop::py_tensor& t) {
    int k = -1;
    if (t.value.data.empty() && t.value.numel() != 0) {
      if (!files || !source) throw ckpt::error(ckpt::error_kind::invalid_argument, "ckpt import: tensor " + name + " was read without its bytes");
      k = files->add(*source, t);
    }
    add(std::move(name), std::move(t.value), k);
  }
  /// Reads `file` for flattening, its tensors' bytes left in it.
  ckpt::interop::py_object open(const fs::path& file) {
    if (!files) return ckpt::interop::load_torch(file);
    source = &files->source(file);
    ckpt::interop::torch_load_options lazy;
    lazy.read_tensors = false;
    return ckpt::interop::load_torch(file, lazy);
  }
};

/// True when tensors a (of `x`) and b (of `y`) hold the same bytes, compared a block at a time.
bool same_bytes(const imported& x, std::size_t a, const imported& y, std::size_t b) {
  const auto& ta = x.tensors[a].second;
  const auto& tb = y.tensors[b].second;
  if (ta.type != tb.type || ta.shape != tb.shape) return false;
  const std::uint64_t n = ta.numel() * ckpt::size_of(ta.type);
  constexpr std::uint64_t block = std::uint64_t{8} << 20;
  std::vector<std::byte> pa(static_cast<std::size_t>(std::min(n, block))), pb(pa.size());
  for (std::uint64_t at = 0; at < n; at += block) {
    const auto len = static_cast<std::size_t>(std::min(block, n - at));
    x.read(a, at, std::span(pa).first(len));
    y.read(b, at, std::span(pb).first(len));
    if (std::memcmp(pa.data(), pb.data(), len) != 0) return false;
  }
  return true;
}

/// The state a checkpointer saves: the imported tensors and engines under their names.
struct imported_state {
  imported* what;
  template <class V>
  void checkpoint(V& v) {
    for (std::size_t i = 0; i < what->tensors.size(); ++i) v.tensor(what->tensors[i].first, what->ref(i));
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

/// A Python float as config text that stays a float: 4096.0 is "4096.0", not "4096" (which an
/// export would give back as an int).
std::string float_text(double v) {
  std::string t = ckpt::config_value(v).text;
  if (t.find_first_of(".eEn") == std::string::npos) t += ".0";  // not 1e+20, inf or nan
  return t;
}

bool is_optimizer_path(const std::string& path) { return path == "optimizer" || path.starts_with("optimizer."); }

/// Records the optimizer's container kinds in the config, for export (ckpt_import.containers).
void record_containers(imported& out) {
  if (out.containers.empty()) return;
  std::string lines;
  for (const auto& c : out.containers) lines += (lines.empty() ? "" : "\n") + c;
  out.config.set("ckpt_import.containers", lines);
}

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
    out.config.set(join(path, "cached_gaussian"), float_text(o.items()[4].as_float()));
    return;
  }
  if (o.python_class() == ckpt::interop::py_class::numpy_array) {
    out.left_out.push_back(path + " (numpy.ndarray)");
    return;
  }
  switch (o.kind()) {
    case py_kind::tensor:
      out.add_tensor(path, o.as_tensor());
      return;
    case py_kind::dict:
      if (is_optimizer_path(path) && !o.entries().empty() &&
          std::all_of(o.entries().begin(), o.entries().end(), [](const auto& kv) { return kv.first.is_int(); }))
        out.containers.push_back("int-keys " + path);
      for (auto& [k, v] : o.entries()) flatten(v, join(path, key_text(k)), out, scalars_to_config);
      return;
    case py_kind::list:
    case py_kind::tuple: {
      if (is_optimizer_path(path)) out.containers.push_back((o.is_list() ? "list " : "tuple ") + path);
      auto& items = o.items();
      for (std::size_t i = 0; i < items.size(); ++i) flatten(items[i], join(path, std::to_string(i)), out, scalars_to_config);
      return;
    }
    case py_kind::integer:
      if (scalars_to_config) return void(out.config.set(path, o.as_int()));
      break;
    case py_kind::floating:
      if (scalars_to_config) return void(out.config.set(path, float_text(o.as_float())));
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
    record_containers(out);
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
    } else if (key == "checkpoint_validation_logits" && v.is_tensor() && !v.as_tensor().value.data.empty()) {
      out.validation_logits = std::move(v.as_tensor().value);
    } else if (key == "checkpoint_validation_logits" && v.is_tensor()) {
      auto& t = v.as_tensor().value;  // small: read now
      t.data.resize(static_cast<std::size_t>(t.numel() * ckpt::size_of(t.type)));
      if (out.source && t.numel() != 0) out.source->read(v.as_tensor(), 0, t.data);
      out.validation_logits = std::move(t);
    } else {
      flatten(v, key, out, true);
    }
  }
  record_containers(out);
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
  try {
    doc.Parse(text.c_str(), text.size());
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {  // rapidjson's assertions, as cereal configures them ("NaNE5")
    throw ckpt::error(ckpt::error_kind::corrupt, index.string() + ": not valid JSON (" + e.what() + ")");
  }
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
    part.files = out.files;
    from_torch_tree(part.open(index.parent_path() / file), part);
    for (std::size_t i = 0; i < part.tensors.size(); ++i) {
      auto& [name, t] = part.tensors[i];
      auto w = wanted.find(name);
      if (w == wanted.end() || w->second != file)
        throw ckpt::error(ckpt::error_kind::corrupt, (index.parent_path() / file).string() + " holds tensor " +
                                                         ckpt::detail::printable(name) + ", which " + index.string() +
                                                         " does not place there");
      wanted.erase(w);
      out.add(std::move(name), std::move(t), i < part.streamed.size() ? part.streamed[i] : -1);
    }
  }
  if (!wanted.empty())
    throw ckpt::error(ckpt::error_kind::corrupt, index.string() + " lists tensor " + ckpt::detail::printable(wanted.begin()->first) +
                                                     " in " + wanted.begin()->second + ", which does not hold it");
}

/// The tensors of a safetensors file (or of each shard of an index) are streamed: `file_of`
/// gives the file holding a tensor.
template <class FileOf>
void from_safetensors(FileOf file_of, const std::vector<ckpt::interop::safetensors_entry>& entries,
                      const ckpt::interop::safetensors_metadata& meta, imported& out) {
  for (const auto& e : entries) {
    out.add(e.name, ckpt::interop::host_tensor{e.type, e.shape, {}}, e.nbytes() == 0 ? -1 : out.files->add(file_of(e.name), e));
  }
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

// ----- whole checkpoints: every rank's file ---------------------------------------------------
// Megatron-LM: <tag>/mp_rank_TT[_PPP]/model_optim_rng.pt. GPT-NeoX/DeepSpeed:
// <tag>/mp_rank_TT_model_states.pt. A root names its tag in latest_checkpointed_iteration.txt
// (Megatron: an iteration, or "release") or latest (DeepSpeed: the folder's name).

struct rank_file {
  std::uint32_t tp = 0, pp = 0;
  fs::path file;
  std::vector<fs::path> zero;  // its ZeRO 1/2 optimizer partitions, in data-parallel rank order
};
struct source_checkpoint {
  std::string layout;  // "Megatron-LM" or "GPT-NeoX/DeepSpeed"
  fs::path tag_dir;
  std::uint32_t tp = 1, pp = 1;
  std::vector<rank_file> ranks;  // rank r = t + tp * p
  // DeepSpeed's pipeline layer files: per tp rank, (global layer index, file) in layer order.
  std::vector<std::vector<std::pair<std::uint64_t, fs::path>>> layers;
  std::vector<std::string> not_imported;  // files of the tag left out, with why
  std::size_t files = 0;                  // files imported
};

std::string read_first_line(const fs::path& f) {
  std::ifstream in(f);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\n')) line.pop_back();
  return line;
}

/// The tag folder SRC means: SRC itself, or the one its tracker file names (--tag overrides).
fs::path tag_folder(const fs::path& src, const std::optional<std::string>& tag) {
  const bool megatron_root = fs::exists(src / "latest_checkpointed_iteration.txt"), deepspeed_root = fs::exists(src / "latest");
  if (!megatron_root && !deepspeed_root) {
    if (tag) return src / *tag;
    return src;
  }
  std::string name;
  if (tag) {
    name = *tag;
  } else if (megatron_root) {
    const auto t = read_first_line(src / "latest_checkpointed_iteration.txt");
    if (t == "release") {
      name = "release";
    } else {
      if (t.empty() || t.size() > 19 || !std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; }))
        throw ckpt::error(ckpt::error_kind::corrupt, (src / "latest_checkpointed_iteration.txt").string() + " holds " +
                                                         ckpt::detail::printable(t) + ", not an iteration or 'release'");
      char buf[32];
      std::snprintf(buf, sizeof buf, "iter_%07llu", static_cast<unsigned long long>(std::stoull(t)));
      name = buf;
    }
  } else {
    name = read_first_line(src / "latest");
  }
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    throw ckpt::error(ckpt::error_kind::corrupt, src.string() + ": the tracker names tag " + ckpt::detail::printable(name));
  const auto dir = src / name;
  if (!fs::is_directory(dir)) throw ckpt::error(ckpt::error_kind::not_found, src.string() + " names tag " + name + ", but " + dir.string() + " does not exist");
  return dir;
}

std::string deepspeed_model_file(std::uint32_t xx) {
  char name[64];
  std::snprintf(name, sizeof name, "mp_rank_%02u_model_states.pt", xx);
  return name;
}

/// Every file of the tag folder a rank imports, checked for completeness. DeepSpeed numbers a
/// pipeline's model files mp_rank_XX with XX = stage * tp + tp rank (its model-parallel group
/// spans the pipeline), and the layer files by global layer index and tp rank.
source_checkpoint find_ranks(const fs::path& tag_dir) {
  source_checkpoint c;
  c.tag_dir = tag_dir;
  static const std::regex megatron_dir(R"(mp_rank_(\d{2})(?:_(\d{3}))?)"), deepspeed_file(R"(mp_rank_(\d{2,})_model_states\.pt)"),
      layer_file(R"(layer_(\d+)-model_(\d+)-model_states\.pt)"), zero_file(R"((bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt)"),
      zero3_file(R"(zero_pp_rank_\d+_mp_rank_\d+_model_states\.pt)");
  std::map<std::uint32_t, std::map<std::uint32_t, fs::path>> zero;  // mp rank -> dp rank -> file
  std::map<std::uint32_t, std::map<std::uint64_t, fs::path>> layers;  // tp rank -> layer -> file
  bool zero3 = false;
  const auto number = [&](const std::string& digits, const fs::path& f) {
    if (digits.size() > 9) throw ckpt::error(ckpt::error_kind::invalid_argument, f.string() + ": a rank number this large is not a real checkpoint");
    return static_cast<std::uint32_t>(std::stoul(digits));
  };
  for (const auto& e : fs::directory_iterator(tag_dir)) {
    const auto name = e.path().filename().string();
    std::smatch m;
    if (e.is_directory() && std::regex_match(name, m, megatron_dir) && fs::exists(e.path() / "model_optim_rng.pt")) {
      c.layout = c.layout.empty() || c.layout == "Megatron-LM" ? "Megatron-LM" : "mixed";
      c.ranks.push_back({number(m[1], e.path()), m[2].matched ? number(m[2], e.path()) : 0u, e.path() / "model_optim_rng.pt", {}});
      for (const auto& inner : fs::directory_iterator(e.path()))
        if (inner.path().filename() != "model_optim_rng.pt")
          c.not_imported.push_back(name + "/" + inner.path().filename().string() +
                                   (inner.path().filename() == "distrib_optim.pt" ? ": Megatron's distributed optimizer state is not imported"
                                                                                   : ": not a file Megatron-LM's checkpoint reader reads"));
    } else if (e.is_regular_file() && std::regex_match(name, m, deepspeed_file)) {
      c.layout = c.layout.empty() || c.layout == "GPT-NeoX/DeepSpeed" ? "GPT-NeoX/DeepSpeed" : "mixed";
      c.ranks.push_back({number(m[1], e.path()), 0u, e.path(), {}});
    } else if (e.is_regular_file() && std::regex_match(name, m, layer_file)) {
      if (!layers[number(m[2], e.path())].emplace(number(m[1], e.path()), e.path()).second)
        throw ckpt::error(ckpt::error_kind::invalid_argument, tag_dir.string() + " holds two files for layer " + std::string(m[1]) + " of tp rank " + std::string(m[2]));
    } else if (e.is_regular_file() && std::regex_match(name, m, zero_file)) {
      zero[number(m[3], e.path())][number(m[2], e.path())] = e.path();
    } else if (e.is_regular_file() && std::regex_match(name, zero3_file)) {
      zero3 = true;
    }
  }
  if (zero3)
    throw ckpt::error(ckpt::error_kind::invalid_argument,
                      tag_dir.string() + " is a ZeRO stage 3 checkpoint (zero_pp_rank_D_mp_rank_XX_model_states.pt): ckpt import joins the "
                                         "partitions of ZeRO stages 1 and 2; run DeepSpeed's zero_to_fp32.py on it first");
  if (c.ranks.empty())
    throw ckpt::error(ckpt::error_kind::invalid_argument,
                      tag_dir.string() + " is not a checkpoint ckpt import reads: it holds neither Megatron-LM's mp_rank_TT[_PPP]/model_optim_rng.pt "
                                         "nor GPT-NeoX/DeepSpeed's mp_rank_TT_model_states.pt");
  if (c.layout == "mixed")
    throw ckpt::error(ckpt::error_kind::invalid_argument, tag_dir.string() + " holds files of both Megatron-LM's and DeepSpeed's layouts");
  if (c.layout == "Megatron-LM" && (!layers.empty() || !zero.empty()))
    throw ckpt::error(ckpt::error_kind::invalid_argument, tag_dir.string() + " holds Megatron-LM's rank folders and DeepSpeed's layer or ZeRO files");
  if (!layers.empty()) {
    // A pipeline: the layer files' tp ranks give tp, the model files then make pp stages.
    c.tp = layers.rbegin()->first + 1;
    for (std::uint32_t t = 0; t < c.tp; ++t) {
      if (!layers.count(t))
        throw ckpt::error(ckpt::error_kind::not_found, tag_dir.string() + ": the layer files of tp rank " + std::to_string(t) + " are missing");
      for (const auto& [layer, f] : layers.begin()->second)
        if (!layers[t].count(layer)) {
          char name[96];
          std::snprintf(name, sizeof name, "layer_%02llu-model_%02u-model_states.pt", static_cast<unsigned long long>(layer), t);
          throw ckpt::error(ckpt::error_kind::not_found, (tag_dir / name).string() + " is missing: tp rank " + std::to_string(layers.begin()->first) +
                                                             " has that layer");
        }
      if (layers[t].size() != layers.begin()->second.size())
        throw ckpt::error(ckpt::error_kind::not_found, tag_dir.string() + ": tp rank " + std::to_string(t) + " has layer files tp rank " +
                                                           std::to_string(layers.begin()->first) + " lacks");
      c.layers.emplace_back(layers[t].begin(), layers[t].end());
      c.files += layers[t].size();
    }
    std::uint32_t most = 0;
    for (const auto& r : c.ranks) most = std::max(most, r.tp + 1);
    if (most % c.tp != 0)
      throw ckpt::error(ckpt::error_kind::not_found, (tag_dir / deepspeed_model_file(most)).string() + " is missing: the layer files make tp=" +
                                                         std::to_string(c.tp) + ", and the model files mp_rank_00.." + std::to_string(most - 1) +
                                                         " do not make whole pipeline stages of it");
    c.pp = most / c.tp;
    for (auto& r : c.ranks) {
      const std::uint32_t xx = r.tp;
      r.tp = xx % c.tp;
      r.pp = xx / c.tp;
    }
  } else {
    for (const auto& r : c.ranks) {
      c.tp = std::max(c.tp, r.tp + 1);
      c.pp = std::max(c.pp, r.pp + 1);
    }
  }
  std::vector<const rank_file*> by_rank(static_cast<std::size_t>(c.tp) * c.pp, nullptr);
  for (const auto& r : c.ranks) by_rank[r.tp + c.tp * r.pp] = &r;
  for (std::uint32_t p = 0; p < c.pp; ++p)
    for (std::uint32_t t = 0; t < c.tp; ++t)
      if (!by_rank[t + c.tp * p]) {
        char name[64];
        if (c.layout == "Megatron-LM")
          std::snprintf(name, sizeof name, c.pp > 1 ? "mp_rank_%02u_%03u/model_optim_rng.pt" : "mp_rank_%02u/model_optim_rng.pt", t, p);
        else
          std::snprintf(name, sizeof name, "%s", deepspeed_model_file(t + c.tp * p).c_str());
        throw ckpt::error(ckpt::error_kind::not_found, (tag_dir / name).string() + " is missing: the other files make a tp=" +
                                                           std::to_string(c.tp) + " pp=" + std::to_string(c.pp) + " checkpoint");
      }
  std::vector<rank_file> ordered;
  for (auto* r : by_rank) ordered.push_back(*r);
  c.ranks = std::move(ordered);
  c.files += c.ranks.size();
  // ZeRO partitions: for each model-parallel rank, data-parallel ranks 0..D-1, all of them.
  std::uint32_t dp = 0;  // as many as the rank with the most has: every rank has all of them
  for (const auto& [xx, parts] : zero) dp = std::max(dp, parts.rbegin()->first + 1);
  for (const auto& [xx, parts] : zero) {
    if (xx >= c.ranks.size())
      throw ckpt::error(ckpt::error_kind::not_found, (tag_dir / deepspeed_model_file(xx)).string() + " is missing: " +
                                                         parts.begin()->second.filename().string() + " is a ZeRO partition of it");
    for (std::uint32_t d = 0; d < dp; ++d)
      if (!parts.count(d)) {
        const bool bf16 = parts.begin()->second.filename().string().starts_with("bf16_");
        char name[96];
        std::snprintf(name, sizeof name, "%szero_pp_rank_%u_mp_rank_%02u_optim_states.pt", bf16 ? "bf16_" : "", d, xx);
        throw ckpt::error(ckpt::error_kind::not_found, (tag_dir / name).string() + " is missing: the ZeRO partitions go up to dp rank " +
                                                           std::to_string(dp - 1));
      }
    for (const auto& [d, f] : parts) c.ranks[xx].zero.push_back(f);
    c.files += parts.size();
  }
  if (!zero.empty() && zero.size() != c.ranks.size())
    for (std::uint32_t xx = 0; xx < c.ranks.size(); ++xx)
      if (!zero.count(xx))
        throw ckpt::error(ckpt::error_kind::not_found, tag_dir.string() + ": the ZeRO partitions of " + deepspeed_model_file(xx) +
                                                           " are missing (zero_pp_rank_0_mp_rank_" + (xx < 10 ? "0" : "") + std::to_string(xx) +
                                                           "_optim_states.pt ...), while other ranks have theirs");
  return c;
}

/// Which dimension Megatron-LM and GPT-NeoX split a tensor along over the tp ranks, from its
/// name: column-parallel weights and biases on 0, row-parallel weights on 1, vocabulary-
/// parallel embeddings and output layers on 0; -1 (replicated) for norms, row-parallel biases,
/// position embeddings; nullopt when the name says nothing (docs/cli.md has the table).
std::optional<int> megatron_split(const std::string& name) {
  auto has = [&](std::string_view part) { return name.find(part) != std::string::npos; };
  auto ends = [&](std::string_view tail) { return name.ends_with(tail); };
  if (has("norm") || has("position_embeddings") || has("inv_freq")) return -1;
  for (const std::string_view row : {"attention.dense.", "self_attention.dense.", "linear_proj.", "dense_4h_to_h.", "linear_fc2."})
    if (has(row)) return ends(".weight") ? 1 : -1;  // a row-parallel layer's bias is replicated
  for (const std::string_view col : {"query_key_value.", "linear_qkv.", "dense_h_to_4h.", "linear_fc1.", "word_embeddings.",
                                     "output_layer.", "final_linear.", "embed_out.", "lm_head."})
    if (has(col)) return 0;
  return std::nullopt;
}

/// One source rank's tensors, engines and per-rank values as it saves them into ckpt.
struct rank_save {
  std::vector<std::pair<std::string, ckpt::tensor_ref>> tensors;
  std::vector<std::pair<std::string, std::mt19937>> engines;
  std::vector<std::pair<std::string, std::string>> values;  // config entries that differ between ranks, as text
  template <class V>
  void checkpoint(V& v) {
    for (auto& [n, t] : tensors) v.tensor(n, t);
    for (auto& [n, e] : engines) v.value(n, e);
    for (auto& [n, x] : values) v.value(n, x);
  }
};

/// Each rank's share of --memory: the buffers its save stages the streamed tensors through.
std::uint64_t buffer_bytes(const import_args& a, std::uint32_t ranks) {
  return std::max<std::uint64_t>(a.memory_bytes / ranks, ckpt::checkpointer_options{}.chunk_bytes * 2);
}

int import_checkpoint(const import_args& a, const fs::path& src) {
  const auto c = find_ranks(tag_folder(src, a.tag));
  const std::uint32_t T = c.tp, P = c.pp, world = T * P;
  file_tensors files;  // the source files, read while the ranks save
  std::vector<imported> ranks(world);
  for (std::uint32_t r = 0; r < world; ++r) {
    ranks[r].files = &files;
    auto root = ranks[r].open(c.ranks[r].file);
    py_object param_shapes;  // the order ZeRO flattened the parameters in
    if (const py_object* ps = root.is_dict() ? root.find("param_shapes") : nullptr; ps && !c.ranks[r].zero.empty()) param_shapes = *ps;
    from_torch_tree(std::move(root), ranks[r]);
    if (!ranks[r].iteration) ranks[r].iteration = iteration_of_folder(fs::absolute(c.ranks[r].file));
    // A pipeline's layers: each file is one layer's state dict, its names under the layer's
    // index as DeepSpeed's PipelineModule names its parameters ("3.mlp.dense_h_to_4h.weight").
    // They go with the first stage's rank of their tp rank: the names are global already.
    if (r < T && !c.layers.empty())
      for (const auto& [layer, f] : c.layers[r]) {
        auto sd = ranks[r].open(f);
        const auto rel = fs::relative(f, c.tag_dir).string();
        if (!sd.is_dict()) throw ckpt::error(ckpt::error_kind::corrupt, f.string() + " holds " + sd.repr().substr(0, 80) + ", not a layer's state dict");
        for (auto& [k, v] : sd.entries()) {
          const auto name = std::to_string(layer) + "." + key_text(k);
          if (!v.is_tensor()) {
            ranks[r].left_out.push_back(name + " (" + std::string(ckpt::interop::to_string(v.kind())) + " in " + rel + ")");
            continue;
          }
          ranks[r].origin.resize(ranks[r].tensors.size());
          ranks[r].origin.push_back(rel);
          ranks[r].add_tensor(name, v.as_tensor());
        }
      }
    if (!c.ranks[r].zero.empty()) {
      // The partitions are CRC-checked whole first (one sequential pass each), since their flat
      // vectors are then read in pieces, parameter by parameter.
      std::vector<ckpt::interop::torch_tensor_source*> parts;
      for (const auto& f : c.ranks[r].zero) {
        parts.push_back(&files.source(f));
        parts.back()->verify_all();
      }
      auto z = join_zero_partitions(c.ranks[r].zero, param_shapes, c.ranks[r].file, [&](const fs::path& f) { return ranks[r].open(f); });
      std::erase(ranks[r].left_out, "optimizer (None)");  // ZeRO keeps it in the partitions
      for (auto& t : z.tensors) {
        std::vector<file_tensors::piece> pieces;
        for (auto& sg : t.segments) pieces.push_back({parts[sg.part], std::move(sg.flat), sg.from, sg.at, sg.bytes});
        const int k = files.add(t.type, t.shape, std::move(pieces));
        ranks[r].origin.resize(ranks[r].tensors.size());
        ranks[r].origin.push_back(c.ranks[r].zero.front().filename().string() + " ...");
        ranks[r].add(std::move(t.name), ckpt::interop::host_tensor{t.type, t.shape, {}}, k);
      }
      ranks[r].source = parts.front();  // the rest's tensors (a step count) are partition 0's
      flatten(z.rest, "optimizer", ranks[r], true);
      record_containers(ranks[r]);
      for (auto& l : z.left_out) ranks[r].left_out.push_back(std::move(l) + " of the ZeRO partitions");
      ranks[r].config.set("optimizer.zero_partitions", static_cast<std::int64_t>(z.dp));
    }
  }
  const auto file_of = [&](std::uint32_t r) { return fs::relative(c.ranks[r].file, c.tag_dir).string(); };
  const auto file_of_t = [&](std::uint32_t r, std::size_t i) {  // the file tensor i of rank r came from
    return i < ranks[r].origin.size() && !ranks[r].origin[i].empty() ? ranks[r].origin[i] : file_of(r);
  };
  for (std::uint32_t r = 1; r < world; ++r)
    if (ranks[r].iteration != ranks[0].iteration)
      throw ckpt::error(ckpt::error_kind::mismatch, c.tag_dir.string() + ": " + file_of(r) + " is at iteration " +
                                                        std::to_string(ranks[r].iteration.value_or(0)) + ", " + file_of(0) + " at " +
                                                        std::to_string(ranks[0].iteration.value_or(0)));
  // Megatron-LM's stages number their layers from 0 each (the global number is the stage's
  // first layer plus the local one): offsets from the layers each holds.
  std::vector<std::uint64_t> first_layer(P, 0);
  if (c.layout == "Megatron-LM" && P > 1)
    for (std::uint32_t p = 1; p < P; ++p) {
      std::uint64_t count = 0;
      for (const auto& [n, t] : ranks[T * (p - 1)].tensors)
        if (!n.starts_with("optimizer.")) count = std::max(count, layer_of(n).value_or(0) + 1);
      first_layer[p] = first_layer[p - 1] + count;
    }

  // Every name, with the ranks that hold it: (rank, index of the tensor in that rank).
  std::map<std::string, std::vector<std::pair<std::uint32_t, std::size_t>>> holders;
  std::vector<std::string> order;
  for (std::uint32_t r = 0; r < world; ++r)
    for (std::size_t i = 0; i < ranks[r].tensors.size(); ++i) {
      auto& name = ranks[r].tensors[i].first;
      if (!name.starts_with("optimizer.")) name = shift_layer(name, static_cast<std::int64_t>(first_layer[r / T]));
      auto& h = holders[name];
      if (h.empty()) order.push_back(name);
      h.emplace_back(r, i);
    }

  std::vector<rank_save> saves(world);
  std::vector<std::string> per_rank_tensors;
  for (const auto& name : order) {
    const auto& h = holders[name];
    const auto& [r0, i0] = h.front();
    const auto& first = ranks[r0].tensors[i0].second;
    for (const auto& [r, i] : h) {
      const auto& t = ranks[r].tensors[i].second;
      if (t.type != first.type)
        throw ckpt::error(ckpt::error_kind::mismatch, c.tag_dir.string() + ": tensor " + name + " is " + std::string(ckpt::to_string(first.type)) +
                                                          " in " + file_of_t(r0, i0) + " but " + std::string(ckpt::to_string(t.type)) + " in " + file_of_t(r, i));
    }
    std::optional<int> dim = megatron_split(name);
    bool told = false;  // --split named it
    for (const auto& [pattern, d] : a.splits)
      if (::fnmatch(pattern.c_str(), name.c_str(), 0) == 0) {
        dim = d;
        told = true;
      }
    // The tp ranks of one stage that hold it (a tensor on several stages, like tied word
    // embeddings, is kept from the first and compared on the others).
    const std::uint32_t stage = r0 / T;
    std::vector<std::pair<std::uint32_t, std::size_t>> mine, copies;
    for (const auto& x : h) (x.first / T == stage ? mine : copies).push_back(x);
    const bool all_same_shape = std::all_of(h.begin(), h.end(), [&](const auto& x) { return ranks[x.first].tensors[x.second].second.shape == first.shape; });
    // Bytes are compared only where the name does not say how the tensor is split, and once.
    bool compared_equal = false;
    if (T == 1 || mine.size() == 1) dim = -1;
    // An RNG state on every rank is each rank's own, even where two happen to be equal.
    if (!told && name.find("rng") != std::string::npos && h.size() == world && world > 1 && all_same_shape) dim = -2;
    if (!dim) {
      compared_equal = all_same_shape && std::all_of(h.begin(), h.end(), [&](const auto& x) {
                         return x == h.front() || same_bytes(ranks[x.first], x.second, ranks[r0], i0);
                       });
      if (compared_equal) {
        dim = -1;
      } else if (name.starts_with("optimizer.") || name.find("rng") != std::string::npos) {
        dim = -2;  // per source rank: stacked on a new first dimension
      } else {
        throw ckpt::error(ckpt::error_kind::invalid_argument,
                          c.tag_dir.string() + ": tensor " + name + " differs between " + file_of_t(h.front().first, h.front().second) + " and the other tp ranks, "
                          "and its name does not say how Megatron splits it: give --split '" + name + "=DIM' (DIM -1 if it is replicated)");
      }
    }
    if (*dim == -1) {
      // Replicated: every copy must be the same bytes.
      for (const auto& [r, i] : h)
        if (!compared_equal && (r != r0 || i != i0) && !same_bytes(ranks[r], i, ranks[r0], i0))
          throw ckpt::error(ckpt::error_kind::mismatch, c.tag_dir.string() + ": tensor " + name + " is replicated but differs between " +
                                                            file_of_t(r0, i0) + " and " + file_of_t(r, i) + " (give --split '" + name + "=DIM' if it is split)");
      // Written once, by the first rank that holds it: a shard that is the whole tensor.
      saves[r0].tensors.emplace_back(
          name, ranks[r0].ref(i0).sharded({.global_shape = first.shape, .offset = ckpt::shape_t(first.shape.size(), 0)}));
      continue;
    }
    if (*dim == -2) {
      if (!all_same_shape || h.size() != world)
        throw ckpt::error(ckpt::error_kind::invalid_argument, c.tag_dir.string() + ": tensor " + name +
                                                                  " differs between ranks and is not on every rank with one shape: give --split");
      per_rank_tensors.push_back(name);
      ckpt::shape_t global{world}, local{1};
      global.insert(global.end(), first.shape.begin(), first.shape.end());
      local.insert(local.end(), first.shape.begin(), first.shape.end());
      for (const auto& [r, i] : h) {
        ckpt::shape_t off(global.size(), 0);
        off[0] = r;
        auto& t = ranks[r].tensors[i].second;
        const auto src = ranks[r].ref(i);
        saves[r].tensors.emplace_back(name, ckpt::tensor_ref(t.type, local, src.data(), src.where()).sharded({.global_shape = global, .offset = off}));
      }
      continue;
    }
    // Split along `d` over the tp ranks of its stage, in tp order.
    const auto d = static_cast<std::size_t>(*dim);
    if (mine.size() != T)
      throw ckpt::error(ckpt::error_kind::invalid_argument, c.tag_dir.string() + ": tensor " + name + " is on " + std::to_string(mine.size()) +
                                                                " of the " + std::to_string(T) + " tp ranks of stage " + std::to_string(stage) +
                                                                "; a split tensor must be on every one");
    std::sort(mine.begin(), mine.end());
    ckpt::shape_t global = first.shape;
    if (d >= global.size())
      throw ckpt::error(ckpt::error_kind::invalid_argument, c.tag_dir.string() + ": tensor " + name + " " + ckpt::detail::to_string(first.shape) +
                                                                " has no dimension " + std::to_string(d) + " to be split along");
    global[d] = 0;
    for (const auto& [r, i] : mine) {
      const auto& sh = ranks[r].tensors[i].second.shape;
      for (std::size_t k = 0; k < sh.size(); ++k)
        if (k != d && (sh.size() != first.shape.size() || sh[k] != first.shape[k]))
          throw ckpt::error(ckpt::error_kind::mismatch, c.tag_dir.string() + ": tensor " + name + " is " + ckpt::detail::to_string(first.shape) +
                                                            " in " + file_of_t(r0, i0) + " and " + ckpt::detail::to_string(sh) + " in " + file_of_t(r, i) +
                                                            ": shards of a tensor split along dimension " + std::to_string(d) + " differ in another");
      global[d] += sh[d];
    }
    std::uint64_t at = 0;
    for (const auto& [r, i] : mine) {
      auto& t = ranks[r].tensors[i].second;
      ckpt::shape_t off(global.size(), 0);
      off[d] = at;
      at += t.shape[d];
      saves[r].tensors.emplace_back(name, ranks[r].ref(i).sharded({.global_shape = global, .offset = off}));
    }
    // Copies on later stages (tied embeddings) must hold the same shards.
    for (const auto& [r, i] : copies) {
      if (!same_bytes(ranks[r], i, ranks[mine[r % T].first], mine[r % T].second))
        throw ckpt::error(ckpt::error_kind::mismatch, c.tag_dir.string() + ": tensor " + name + " differs between " + file_of_t(mine[r % T].first, mine[r % T].second) +
                                                          " and " + file_of_t(r, i) + ", which hold the same shard of it");
    }
  }
  // Values: each rank's RNG engines are its own; config entries that all ranks agree on are the
  // config, the others are saved per rank as their text.
  ckpt::config config;
  for (const auto& [k, v] : ranks[0].config.entries()) {
    bool same = true;
    for (std::uint32_t r = 1; r < world; ++r) {
      const auto* o = ranks[r].config.find(k);
      same = same && o && *o == v;
    }
    if (same) config.set(k, ckpt::config_value{v});
  }
  for (std::uint32_t r = 0; r < world; ++r) {
    saves[r].engines = ranks[r].engines;
    for (const auto& [k, v] : ranks[r].config.entries())
      if (!config.find(k)) saves[r].values.emplace_back(k, v);
  }
  std::optional<ckpt::tensor_ref> logits;
  if (ranks[0].validation_logits) logits = ranks[0].validation_logits->ref();
  // What `ckpt export --layout megatron` needs to give each rank its row back.
  if (!per_rank_tensors.empty()) {
    std::sort(per_rank_tensors.begin(), per_rank_tensors.end());
    std::string list;
    for (const auto& n : per_rank_tensors) list += (list.empty() ? "" : "\n") + n;
    config.set("ckpt_import.per_rank_tensors", list);
  }

  const std::uint64_t iteration = a.iteration.value_or(ranks[0].iteration.value_or(0));
  auto comm_world = std::make_shared<ckpt::in_process_world>(static_cast<int>(world));
  std::vector<std::string> failures(world);
  std::vector<std::thread> threads;
  for (std::uint32_t r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::posix, ckpt::raw, streamed_from_files> cp{
            {.tp = T, .pp = P, .dp = 1, .comm = {comm_world, static_cast<int>(r)}}, ckpt::posix(a.root), {.keep_last_n = 0, .threads = 1, .buffer_bytes = buffer_bytes(a, world)},
            {}, streamed_from_files{&files}};
        cp.save(iteration, saves[r], {.config = config, .validation_logits = r == 0 ? logits : std::nullopt, .overwrite = false});
      } catch (const std::exception& e) {
        failures[r] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  for (std::uint32_t r = 0; r < world; ++r)
    if (!failures[r].empty()) throw ckpt::error(ckpt::error_kind::invalid_argument, "ckpt import: " + failures[r]);

  const std::size_t tensors = order.size();
  for (std::uint32_t r = 0; r < world; ++r)
    for (const auto& p : ranks[r].left_out) std::fprintf(stderr, "ckpt import: left out %s of %s\n", p.c_str(), file_of(r).c_str());
  for (const auto& f : c.not_imported) std::fprintf(stderr, "ckpt import: left out %s\n", f.c_str());
  for (const auto& n : per_rank_tensors)
    std::fprintf(stderr, "ckpt import: %s is each rank's own: kept per source rank, stacked on a first dimension of %u\n", n.c_str(), world);
  ckpt::checkpointer<ckpt::single_process, ckpt::posix> done{{}, fs::path(a.root)};
  std::printf("imported the %s checkpoint %s (tp=%u pp=%u, %zu files): %zu tensors, %zu config entries into %s as %s (iteration %" PRIu64 ")\n",
              c.layout.c_str(), c.tag_dir.string().c_str(), T, P, c.files, tensors, config.entries().size(), a.root.c_str(),
              done.latest().value_or("?").c_str(), iteration);
  return exit_ok;
}

}  // namespace

int run_import(const import_args& a) {
  const fs::path file = a.file;
  if (fs::is_directory(file)) return import_checkpoint(a, file);
  if (!fs::is_regular_file(file)) throw ckpt::error(ckpt::error_kind::not_found, "no such file: " + a.file);
  // The sources stay open until the save has read every tensor from them.
  std::optional<ckpt::interop::safetensors_index> index;
  std::optional<ckpt::interop::safetensors_file> st;
  file_tensors files;
  imported what;
  what.files = &files;
  const auto name = file.filename().string();
  if (ends_with(name, ".safetensors.index.json")) {
    index.emplace(file);
    std::vector<ckpt::interop::safetensors_entry> entries;
    for (const auto& s : index->shards())
      for (const auto& e : s.tensors()) entries.push_back(e);
    from_safetensors([&](const std::string& n) -> const ckpt::interop::safetensors_file& { return index->shard_of(n); }, entries,
                     index->shards().empty() ? ckpt::interop::safetensors_metadata{} : index->shards().front().metadata(), what);
  } else if (ends_with(name, ".safetensors")) {
    st.emplace(file);
    from_safetensors([&](const std::string&) -> const ckpt::interop::safetensors_file& { return *st; }, st->tensors(), st->metadata(), what);
  } else if (ends_with(name, ".index.json")) {
    from_torch_index(file, what);
  } else {
    from_torch_tree(what.open(file), what);
  }
  if (what.tensors.empty()) throw ckpt::error(ckpt::error_kind::invalid_argument, a.file + " holds no tensors");
  // Before anything is written: a name ckpt cannot keep is the file's problem, so name the file.
  for (const auto& [n, t] : what.tensors)
    if (const auto why = ckpt::name_problem(n); !why.empty())
      throw ckpt::error(ckpt::error_kind::invalid_argument,
                        a.file + ": tensor " + ckpt::detail::printable(n) + " cannot be a ckpt name: " + why);
  if (!what.iteration) what.iteration = iteration_of_folder(fs::absolute(file));
  const std::uint64_t iteration = a.iteration.value_or(what.iteration.value_or(0));
  std::uint64_t bytes = 0;
  for (const auto& [n, t] : what.tensors) bytes += t.numel() * ckpt::size_of(t.type);
  ckpt::checkpointer<ckpt::single_process, ckpt::posix, ckpt::raw, streamed_from_files> cp{
      {}, fs::path(a.root), {.buffer_bytes = buffer_bytes(a, 1)}, {}, streamed_from_files{&files}};
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
