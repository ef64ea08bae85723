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

// ----- whole checkpoints: every rank's file ---------------------------------------------------
// Megatron-LM: <tag>/mp_rank_TT[_PPP]/model_optim_rng.pt. GPT-NeoX/DeepSpeed:
// <tag>/mp_rank_TT_model_states.pt. A root names its tag in latest_checkpointed_iteration.txt
// (Megatron: an iteration, or "release") or latest (DeepSpeed: the folder's name).

struct rank_file {
  std::uint32_t tp = 0, pp = 0;
  fs::path file;
};
struct source_checkpoint {
  std::string layout;  // "Megatron-LM" or "GPT-NeoX/DeepSpeed"
  fs::path tag_dir;
  std::uint32_t tp = 1, pp = 1;
  std::vector<rank_file> ranks;  // rank r = t + tp * p
  std::vector<std::string> not_imported;  // files of the tag left out (ZeRO partitions)
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

source_checkpoint find_ranks(const fs::path& tag_dir) {
  source_checkpoint c;
  c.tag_dir = tag_dir;
  static const std::regex megatron_dir(R"(mp_rank_(\d{2})(?:_(\d{3}))?)"), deepspeed_file(R"(mp_rank_(\d{2})_model_states\.pt)"),
      layer_file(R"(layer_\d+-model_\d+-model_states\.pt)"), zero_file(R"((bf16_)?zero_pp_rank_\d+_mp_rank_\d+_optim_states\.pt)");
  bool layers = false;
  for (const auto& e : fs::directory_iterator(tag_dir)) {
    const auto name = e.path().filename().string();
    std::smatch m;
    if (e.is_directory() && std::regex_match(name, m, megatron_dir) && fs::exists(e.path() / "model_optim_rng.pt")) {
      c.layout = c.layout.empty() || c.layout == "Megatron-LM" ? "Megatron-LM" : "mixed";
      c.ranks.push_back({static_cast<std::uint32_t>(std::stoul(m[1])), m[2].matched ? static_cast<std::uint32_t>(std::stoul(m[2])) : 0u,
                         e.path() / "model_optim_rng.pt"});
    } else if (e.is_regular_file() && std::regex_match(name, m, deepspeed_file)) {
      c.layout = c.layout.empty() || c.layout == "GPT-NeoX/DeepSpeed" ? "GPT-NeoX/DeepSpeed" : "mixed";
      c.ranks.push_back({static_cast<std::uint32_t>(std::stoul(m[1])), 0u, e.path()});
    } else if (e.is_regular_file() && std::regex_match(name, layer_file)) {
      layers = true;
    } else if (e.is_regular_file() && std::regex_match(name, zero_file)) {
      c.not_imported.push_back(name);
    }
  }
  if (c.ranks.empty())
    throw ckpt::error(ckpt::error_kind::invalid_argument,
                      tag_dir.string() + " is not a checkpoint ckpt import reads: it holds neither Megatron-LM's mp_rank_TT[_PPP]/model_optim_rng.pt "
                                         "nor GPT-NeoX/DeepSpeed's mp_rank_TT_model_states.pt");
  if (c.layout == "mixed")
    throw ckpt::error(ckpt::error_kind::invalid_argument, tag_dir.string() + " holds files of both Megatron-LM's and DeepSpeed's layouts");
  if (layers)
    throw ckpt::error(ckpt::error_kind::invalid_argument,
                      tag_dir.string() + " holds DeepSpeed pipeline layer files (layer_LL-model_TT-model_states.pt): importing those "
                                         "is not supported yet");
  for (const auto& r : c.ranks) {
    c.tp = std::max(c.tp, r.tp + 1);
    c.pp = std::max(c.pp, r.pp + 1);
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
          std::snprintf(name, sizeof name, "mp_rank_%02u_model_states.pt", t);
        throw ckpt::error(ckpt::error_kind::not_found, (tag_dir / name).string() + " is missing: the other files make a tp=" +
                                                           std::to_string(c.tp) + " pp=" + std::to_string(c.pp) + " checkpoint");
      }
  std::vector<rank_file> ordered;
  for (auto* r : by_rank) ordered.push_back(*r);
  c.ranks = std::move(ordered);
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

int import_checkpoint(const import_args& a, const fs::path& src) {
  const auto c = find_ranks(tag_folder(src, a.tag));
  const std::uint32_t T = c.tp, P = c.pp, world = T * P;
  std::vector<imported> ranks(world);
  for (std::uint32_t r = 0; r < world; ++r) {
    from_torch_tree(ckpt::interop::load_torch(c.ranks[r].file), ranks[r]);
    if (!ranks[r].iteration) ranks[r].iteration = iteration_of_folder(fs::absolute(c.ranks[r].file));
  }
  const auto file_of = [&](std::uint32_t r) { return fs::relative(c.ranks[r].file, c.tag_dir).string(); };
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
                                                          " in " + file_of(r0) + " but " + std::string(ckpt::to_string(t.type)) + " in " + file_of(r));
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
                         return ranks[x.first].tensors[x.second].second.data == first.data;
                       });
      if (compared_equal) {
        dim = -1;
      } else if (name.starts_with("optimizer.") || name.find("rng") != std::string::npos) {
        dim = -2;  // per source rank: stacked on a new first dimension
      } else {
        throw ckpt::error(ckpt::error_kind::invalid_argument,
                          c.tag_dir.string() + ": tensor " + name + " differs between " + file_of(h.front().first) + " and the other tp ranks, "
                          "and its name does not say how Megatron splits it: give --split '" + name + "=DIM' (DIM -1 if it is replicated)");
      }
    }
    if (*dim == -1) {
      // Replicated: every copy must be the same bytes.
      for (const auto& [r, i] : h)
        if (!compared_equal && (ranks[r].tensors[i].second.shape != first.shape || ranks[r].tensors[i].second.data != first.data))
          throw ckpt::error(ckpt::error_kind::mismatch, c.tag_dir.string() + ": tensor " + name + " is replicated but differs between " +
                                                            file_of(r0) + " and " + file_of(r) + " (give --split '" + name + "=DIM' if it is split)");
      // Written once, by the first rank that holds it: a shard that is the whole tensor.
      saves[r0].tensors.emplace_back(
          name, ranks[r0].tensors[i0].second.ref().sharded({.global_shape = first.shape, .offset = ckpt::shape_t(first.shape.size(), 0)}));
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
        saves[r].tensors.emplace_back(name, ckpt::tensor_ref(t.type, local, t.data.data()).sharded({.global_shape = global, .offset = off}));
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
                                                            " in " + file_of(r0) + " and " + ckpt::detail::to_string(sh) + " in " + file_of(r) +
                                                            ": shards of a tensor split along dimension " + std::to_string(d) + " differ in another");
      global[d] += sh[d];
    }
    std::uint64_t at = 0;
    for (const auto& [r, i] : mine) {
      auto& t = ranks[r].tensors[i].second;
      ckpt::shape_t off(global.size(), 0);
      off[d] = at;
      at += t.shape[d];
      saves[r].tensors.emplace_back(name, t.ref().sharded({.global_shape = global, .offset = off}));
    }
    // Copies on later stages (tied embeddings) must hold the same shards.
    for (const auto& [r, i] : copies) {
      const auto& twin = ranks[mine[r % T].first].tensors[mine[r % T].second].second;
      if (ranks[r].tensors[i].second.data != twin.data)
        throw ckpt::error(ckpt::error_kind::mismatch, c.tag_dir.string() + ": tensor " + name + " differs between " + file_of(mine[r % T].first) +
                                                          " and " + file_of(r) + ", which hold the same shard of it");
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
        ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::posix> cp{
            {.tp = T, .pp = P, .dp = 1, .comm = {comm_world, static_cast<int>(r)}}, ckpt::posix(a.root), {.keep_last_n = 0, .threads = 1}};
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
  for (const auto& f : c.not_imported) std::fprintf(stderr, "ckpt import: left out %s: ZeRO optimizer partitions are not imported yet\n", f.c_str());
  for (const auto& n : per_rank_tensors)
    std::fprintf(stderr, "ckpt import: %s is each rank's own: kept per source rank, stacked on a first dimension of %u\n", n.c_str(), world);
  ckpt::checkpointer<ckpt::single_process, ckpt::posix> done{{}, fs::path(a.root)};
  std::printf("imported the %s checkpoint %s (tp=%u pp=%u, %u files): %zu tensors, %zu config entries into %s as %s (iteration %" PRIu64 ")\n",
              c.layout.c_str(), c.tag_dir.string().c_str(), T, P, world, tensors, config.entries().size(), a.root.c_str(),
              done.latest().value_or("?").c_str(), iteration);
  return exit_ok;
}

}  // namespace

int run_import(const import_args& a) {
  const fs::path file = a.file;
  if (fs::is_directory(file)) return import_checkpoint(a, file);
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
  // Before anything is written: a name ckpt cannot keep is the file's problem, so name the file.
  for (const auto& [n, t] : what.tensors)
    if (const auto why = ckpt::name_problem(n); !why.empty())
      throw ckpt::error(ckpt::error_kind::invalid_argument,
                        a.file + ": tensor " + ckpt::detail::printable(n) + " cannot be a ckpt name: " + why);
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
