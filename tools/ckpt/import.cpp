// ckpt import FILE ROOT: a model from the Python world saved as a ckpt checkpoint. FILE is a
// .pt/.bin file torch.save wrote (read with ckpt's restricted unpickler: nothing in it can
// run), a .safetensors file, or the index JSON of a sharded set of either.
//
// Names: a tensor's path in the object tree, dict keys and list indices joined by '.'
// ({"model": {"fc.weight": t}} gives "model.fc.weight"). A GPT-NeoX/Megatron
// model_optim_rng.pt ({iteration, args, model, optimizer, ...}) maps onto ckpt's own layout:
// the model's tensors keep their state-dict names, the optimizer's go in the "optimizer"
// group, `iteration` is the iteration and `args` the config. Other ints, floats, bools and
// strings become config entries; anything else is reported and left out.

#include <cinttypes>
#include <filesystem>
#include <fstream>
#include <iterator>

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
  ckpt::config config;
  std::optional<std::uint64_t> iteration;
  std::vector<std::string> left_out;  // paths of values ckpt has no place for
};

/// The state a checkpointer saves: the imported tensors under their names.
struct imported_state {
  imported* what;
  template <class V>
  void checkpoint(V& v) {
    for (auto& [name, t] : what->tensors) v.tensor(name, t.ref());
  }
};

std::string key_text(const py_object& k) {
  switch (k.kind()) {
    case py_kind::string: return k.as_str();
    case py_kind::integer: return std::to_string(k.as_int());
    case py_kind::boolean: return k.as_bool() ? "True" : "False";
    default: return k.repr();
  }
}

std::string join(const std::string& prefix, const std::string& key) { return prefix.empty() ? key : prefix + "." + key; }

/// Tensors (by path) and scalars (as config entries) of `o`, recursively.
void flatten(py_object& o, const std::string& path, imported& out, bool scalars_to_config) {
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
      return;  // nothing to keep
    default:
      break;
  }
  out.left_out.push_back(path + " (" + std::string(ckpt::interop::to_string(o.kind())) + ")");
}

bool is_megatron(const py_object& root) {
  return root.is_dict() && root.contains("model") && root.at("model").is_dict() && root.contains("iteration") &&
         root.at("iteration").is_int();
}

void from_torch_tree(py_object root, imported& out) {
  if (!is_megatron(root)) {
    flatten(root, "", out, true);
    return;
  }
  for (auto& [k, v] : root.entries()) {
    const auto key = key_text(k);
    if (key == "iteration") {
      out.iteration = static_cast<std::uint64_t>(v.as_int());
    } else if (key == "checkpoint_version" || key == "ckpt_tag") {
      continue;  // describe the .pt layout (Megatron's version, ckpt export's source), not the run
    } else if (key == "model") {
      flatten(v, "", out, false);
    } else if (key == "optimizer") {
      flatten(v, "optimizer", out, true);
    } else if (key == "args" && v.is_dict()) {
      flatten(v, "", out, true);
    } else {
      flatten(v, key, out, true);
    }
  }
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
  const std::uint64_t iteration = a.iteration.value_or(what.iteration.value_or(0));
  std::uint64_t bytes = 0;
  for (const auto& [n, t] : what.tensors) bytes += t.data.size();
  ckpt::checkpointer<ckpt::single_process, ckpt::posix> cp{{}, fs::path(a.root)};
  imported_state state{&what};
  cp.save(iteration, state, {.config = what.config, .tag = a.tag, .overwrite = false});
  for (const auto& p : what.left_out) std::fprintf(stderr, "ckpt import: left out %s: ckpt keeps tensors and scalars only\n", p.c_str());
  std::printf("imported %zu tensors (%s) and %zu config entries from %s into %s as %s (iteration %" PRIu64 ")\n", what.tensors.size(),
              human_bytes(static_cast<double>(bytes)).c_str(), what.config.entries().size(), a.file.c_str(), a.root.c_str(),
              cp.latest().value_or("?").c_str(), iteration);
  return exit_ok;
}

}  // namespace ckpt_tool
