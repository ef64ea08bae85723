// ckpt export SRC OUT --format safetensors|torch: one consolidated model, for publishing or for
// Python. Tensors stream from the checkpoint block by block into the output (safetensors), so
// memory stays bounded whatever the model size; --dtype converts floating-point tensors on the
// way, --no-optimizer leaves the optimizer group out, --max-shard-size splits the output the
// way Hugging Face's save_pretrained does.

#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <filesystem>

#include <ckpt/ckpt.hpp>
#include <ckpt/interop/safetensors.hpp>
#include <ckpt/interop/torch.hpp>
#include <ckpt/reader.hpp>

#include "blocks.hpp"
#include "cli.hpp"
#include "convert.hpp"

namespace ckpt_tool {

namespace fs = std::filesystem;

namespace {

/// The tensors to export, in the checkpoint's order, with their exported dtype.
std::vector<ckpt::interop::tensor_decl> exported(const ckpt::checkpoint_info& info, const export_args& a, const std::string& optimizer) {
  std::vector<ckpt::interop::tensor_decl> out;
  for (const auto& t : info.tensors) {
    if (t.name.starts_with("__ckpt")) continue;  // ckpt's own (validation logits)
    if (!a.optimizer && (t.name == optimizer || t.name.starts_with(optimizer + "."))) continue;
    out.push_back({t.name, a.dtype && ckpt::is_floating(t.type) ? *a.dtype : t.type, t.shape});
  }
  if (a.layout == "megatron" && a.format != "torch")
    throw ckpt::error(ckpt::error_kind::invalid_argument, "--layout megatron is a .pt layout: use it with --format torch");
  return out;
}

/// Streams every declared tensor from `r` into `sink(name, bytes)`, block by block, converted.
template <class Sink>
void stream_tensors(ckpt::reader<>& r, const std::vector<ckpt::interop::tensor_decl>& decls, std::uint64_t budget,
                    progress_bar& bar, Sink&& sink) {
  std::vector<std::byte> block, converted;
  std::uint64_t done = 0;
  for (const auto& d : decls) {
    const auto& t = *r.find(d.name);
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

/// One .pt file holding `decls[first..last)` (indices in `which`): a state dict, or with
/// layout megatron GPT-NeoX's model_optim_rng.pt dict.
void write_pt(const fs::path& file, ckpt::reader<>& r, const std::vector<ckpt::interop::tensor_decl>& decls,
              const std::vector<std::size_t>& which, const export_args& a, progress_bar& bar, std::uint64_t& done) {
  using ckpt::interop::py_object;
  ckpt::interop::torch_writer w(file, {.archive_name = file.stem().string(), .zip = {}});
  auto model = py_object::ordered_dict(), optimizer = py_object::dict(), flat = py_object::ordered_dict();
  std::vector<std::byte> block, converted;
  for (const auto k : which) {
    const auto& d = decls[k];
    const auto& t = *r.find(d.name);
    py_object node = w.begin_tensor(d.type, d.shape);
    for_each_block(t.shape, ckpt::size_of(t.type), a.block_bytes, [&](const ckpt::shape_t& offset, const ckpt::shape_t& shape) {
      const auto n = ckpt::detail::element_count(shape, t.name);
      block.resize(n * ckpt::size_of(t.type));
      r.read(t.name, ckpt::tensor_ref(t.type, shape, block.data()).sharded({.global_shape = t.shape, .offset = offset}));
      if (d.type == t.type) {
        w.write(block);
      } else {
        converted.resize(n * ckpt::size_of(d.type));
        convert_elements(block.data(), t.type, converted.data(), d.type, n);
        w.write(converted);
      }
      done += block.size();
      bar.update(done);
    });
    w.end_tensor();
    if (a.layout == "megatron" && d.name.starts_with("optimizer."))
      optimizer.set(d.name.substr(10), node);
    else if (a.layout == "megatron")
      model.set(d.name, node);
    else
      flat.set(d.name, node);
  }
  if (a.layout != "megatron") {
    w.finish(flat);
    return;
  }
  const auto& info = r.info();
  auto args = py_object::dict();
  for (const auto& [key, text] : info.config.entries()) args.set(key, python_value(text));
  w.finish(py_object::dict({{"iteration", static_cast<std::int64_t>(info.iteration)},
                            {"checkpoint_version", 3.0},
                            {"args", args},
                            {"model", model},
                            {"optimizer", optimizer},
                            {"ckpt_tag", info.tag}}));
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
  for (const auto& d : decls) total += r.find(d.name)->raw_bytes;
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
      stream_tensors(r, ordered, a.block_bytes, bar, [&](const std::string& n, std::span<const std::byte> b) { w.write(n, b); });
      w.finish();
    } else {
      fs::create_directories(out);
      ckpt::interop::safetensors_sharded_writer w(out, decls, meta, a.max_shard_bytes.value_or(UINT64_MAX));
      stream_tensors(r, decls, a.block_bytes, bar, [&](const std::string& n, std::span<const std::byte> b) { w.write(n, b); });
      w.finish();
      files = w.shards().size();
    }
  } else {
    files = export_torch(r, decls, a, single_file, bar);
  }
  bar.finish();
  std::printf("exported %zu tensors (%s) of %s (iteration %" PRIu64 ") to %s as %s in %zu file(s)\n", decls.size(),
              human_bytes(static_cast<double>(total)).c_str(), info.tag.c_str(), info.iteration, a.out.c_str(), a.format.c_str(), files);
  return exit_ok;
}

}  // namespace ckpt_tool
