// The `ckpt` command-line tool: look at, check, compare, prune and convert checkpoints.
// Argument parsing is CLI11's; every subcommand lives in a file of its own (see cli.hpp).

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include <ckpt/error.hpp>

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
  c_re->callback([&] {
    for (const auto& s : splits) {
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
      re.splits.emplace_back(s.substr(0, eq), dim);
    }
    status = run_reshard(re);
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
