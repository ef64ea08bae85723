// The `ckpt` command-line tool: look at, check, compare, prune and convert checkpoints.
// Argument parsing is CLI11's; every subcommand lives in a file of its own (see cli.hpp).

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include <ckpt/error.hpp>
#include <ckpt/interop/safetensors.hpp>

#include "cli.hpp"

int main(int argc, char** argv) {
  using namespace ckpt_tool;
  CLI::App app{"ckpt: inspect, verify, compare and convert ckpt checkpoints"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ckpt 0.1.0");
  int status = exit_ok;

  ls_args ls;
  auto* c_ls = app.add_subcommand("ls", "List the tags under a checkpoint root: iteration, state, size, date, latest");
  c_ls->add_option("ROOT", ls.root, "Checkpoint root")->required();
  c_ls->add_flag("--json", ls.json, "Print JSON");
  c_ls->callback([&] { status = run_ls(ls); });

  inspect_args in;
  auto* c_in = app.add_subcommand("inspect", "Show a tag's config, topology and tensors (name, dtype, shape, shards, codec, sizes)");
  c_in->add_option("PATH", in.path, "Checkpoint root (its latest tag) or tag directory")->required();
  c_in->add_option("--tag", in.tag, "Tag to inspect instead of latest");
  c_in->add_flag("--json", in.json, "Print JSON");
  c_in->add_flag("--chunks", in.chunks, "List every chunk of every tensor");
  c_in->callback([&] { status = run_inspect(in); });

  verify_args ve;
  auto* c_ve = app.add_subcommand("verify", "Check every checksum and the shard coverage; exit 1 with every problem found");
  c_ve->add_option("PATH", ve.path, "Checkpoint root (its latest tag) or tag directory")->required();
  c_ve->add_option("--tag", ve.tag, "Tag to verify instead of latest");
  c_ve->add_flag("-q,--quiet", ve.quiet, "Print nothing when the checkpoint is sound");
  c_ve->callback([&] { status = run_verify(ve); });

  diff_args di;
  auto* c_di = app.add_subcommand("diff", "Compare two checkpoints tensor by tensor; exit 0 when equal, 1 when not");
  c_di->add_option("A", di.a, "Checkpoint root or tag directory")->required();
  c_di->add_option("B", di.b, "Checkpoint root or tag directory")->required();
  c_di->add_option("--atol", di.atol, "Absolute tolerance (default 0)")->check(CLI::NonNegativeNumber);
  c_di->add_option("--rtol", di.rtol, "Relative tolerance, times |B| (default 0)")->check(CLI::NonNegativeNumber);
  c_di->add_option("--block-bytes", di.block_bytes, "Bytes of each side held in memory at once (default 64 MiB)")->check(CLI::PositiveNumber);
  c_di->add_flag("!--no-values", di.values, "Do not compare per-rank values (RNG states, counters)");
  c_di->add_flag("!--no-config", di.config, "Do not compare the configs");
  c_di->callback([&] { status = run_diff(di); });

  prune_args pr;
  auto* c_pr = app.add_subcommand("prune", "Delete all but the newest N committed tags (never latest) and crashed saves");
  c_pr->add_option("ROOT", pr.root, "Checkpoint root")->required();
  c_pr->add_option("--keep", pr.keep, "Committed tags to keep")->required()->check(CLI::PositiveNumber);
  c_pr->add_flag("-n,--dry-run", pr.dry_run, "Only print what would be deleted");
  c_pr->callback([&] { status = run_prune(pr); });

  reshard_args re;
  std::vector<std::string> splits;
  auto* c_re = app.add_subcommand("reshard", "Rewrite a checkpoint as a job of another tp/pp would save it; streaming, verified");
  c_re->add_option("SRC", re.src, "Checkpoint root (its latest tag) or tag directory")->required();
  c_re->add_option("DST", re.dst, "Checkpoint root to write the tag into")->required();
  c_re->add_option("--tag", re.tag, "Tag of SRC to rewrite instead of latest");
  c_re->add_option("--tp", re.tp, "Tensor-parallel ranks of the new layout")->required()->check(CLI::Range(1u, 4096u));
  c_re->add_option("--pp", re.pp, "Pipeline stages of the new layout (default 1)")->check(CLI::Range(1u, 4096u));
  c_re->add_option("--split", splits, "NAME=DIM: split tensors matching the glob NAME along DIM (-1: keep whole)");
  c_re->add_option("--memory", re.memory_bytes, "Bytes of buffers for all ranks together (default 512 MiB)")->check(CLI::Range(std::uint64_t{16} << 20, std::uint64_t{1} << 40));
  // NAME=DIM pairs of --split (reshard and import).
  const auto parse_splits = [](const std::vector<std::string>& given, std::vector<std::pair<std::string, int>>& into) {
    for (const auto& s : given) {
      const auto eq = s.rfind('=');
      int dim = 0;
      try {
        if (eq == std::string::npos) throw std::invalid_argument(s);
        std::size_t used = 0;
        dim = std::stoi(s.substr(eq + 1), &used);
        if (used != s.size() - eq - 1 || dim < -1) throw std::invalid_argument(s);
      } catch (const std::exception&) {
        throw CLI::ValidationError("--split", "expected NAME=DIM with DIM >= -1, got '" + s + "'");
      }
      into.emplace_back(s.substr(0, eq), dim);
    }
  };
  c_re->callback([&] {
    parse_splits(splits, re.splits);
    status = run_reshard(re);
  });

  export_args ex;
  std::string ex_dtype, ex_shard;
  auto* c_ex = app.add_subcommand("export", "Write one consolidated model as safetensors or a PyTorch .pt file");
  c_ex->add_option("SRC", ex.src, "Checkpoint root (its latest tag) or tag directory")->required();
  c_ex->add_option("OUT", ex.out,
                   "Output: a file (.safetensors, .pt or .bin), or a directory that gets Hugging Face's file names")->required();
  c_ex->add_option("--tag", ex.tag, "Tag of SRC to export instead of latest");
  c_ex->add_option("--format", ex.format, "safetensors or torch")->check(CLI::IsMember({"safetensors", "torch"}))->required();
  c_ex->add_option("--dtype", ex_dtype, "Convert floating-point tensors to f32, bf16, f16 or f64 (an FP8 tensor is refused)")
      ->check(CLI::IsMember({"f32", "bf16", "f16", "f64", "float32", "bfloat16", "float16", "float64"}));
  c_ex->add_option("--max-shard-size", ex_shard, "Split the output into files of at most this size (e.g. 5GB, 500MB, 10GiB)");
  c_ex->add_flag("!--no-optimizer", ex.optimizer, "Leave the optimizer state out");
  c_ex->add_option("--group", ex.group,
                   "Export only the tensors of this group, named without its prefix (--group model: the names a "
                   "module's load_state_dict expects)");
  c_ex->add_option("--layout", ex.layout,
                   "torch: state_dict (a flat dict of tensors); megatron (iteration, args, model, optimizer: one file, or "
                   "Megatron-LM's per-rank folder when OUT has no .pt extension); deepspeed (GPT-NeoX/DeepSpeed's per-rank folder)")
      ->check(CLI::IsMember({"state_dict", "megatron", "deepspeed"}));
  c_ex->callback([&] {
    if (!ex_dtype.empty()) {
      const std::string canon = ex_dtype == "float32" ? "f32" : ex_dtype == "bfloat16" ? "bf16" : ex_dtype == "float16" ? "f16"
                              : ex_dtype == "float64" ? "f64" : ex_dtype;
      ex.dtype = ckpt::dtype_from_string(canon);
    }
    if (!ex_shard.empty()) ex.max_shard_bytes = ckpt::interop::parse_size(ex_shard);
    status = run_export(ex);
  });

  import_args im;
  std::vector<std::string> im_splits;
  auto* c_im = app.add_subcommand("import", "Save a PyTorch .pt file, safetensors model or Megatron-LM / GPT-NeoX checkpoint as a ckpt checkpoint");
  c_im->add_option("SRC", im.file,
                   "A .pt/.bin file torch.save wrote, a .safetensors file, an index JSON, or a Megatron-LM or GPT-NeoX/DeepSpeed "
                   "checkpoint: its root (latest_checkpointed_iteration.txt or latest names the tag) or one tag folder")
      ->required();
  c_im->add_option("ROOT", im.root, "Checkpoint root to save into")->required();
  c_im->add_option("--iteration", im.iteration, "Iteration to record (default: the file's 'iteration', else 0)");
  c_im->add_option("--tag", im.tag, "Tag of SRC to import, when SRC is a checkpoint root (default: the one it names as latest)");
  c_im->add_option("--split", im_splits, "NAME=DIM: tensors matching the glob NAME are split along DIM over the tp ranks (-1: replicated)");
  c_im->add_option("--memory", im.memory_bytes, "Bytes of save buffers for all ranks together (default 128 MiB); tensors stream from SRC through them")
      ->check(CLI::Range(std::uint64_t{16} << 20, std::uint64_t{1} << 40));
  c_im->callback([&] {
    parse_splits(im_splits, im.splits);
    status = run_import(im);
  });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const ckpt::error& e) {
    std::fprintf(stderr, "ckpt: error: %s\n", e.what());
    return exit_error;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt: error: %s\n", e.what());
    return exit_error;
  }
  return status;
}
