#pragma once
// Pieces every subcommand of the `ckpt` tool shares: finding the checkpoint a path names,
// printing sizes, JSON strings and a progress bar, and the subcommands' entry points.

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <ckpt/detail/tag_store.hpp>
#include <ckpt/dtype.hpp>
#include <ckpt/error.hpp>

namespace ckpt_tool {

/// Exit statuses: 0 success (or "equal", "sound"), 1 a negative answer (different, damaged),
/// 2 an error that stopped the command.
inline constexpr int exit_ok = 0, exit_negative = 1, exit_error = 2;

/// A checkpoint root and, when the path named one, a tag in it.
struct location {
  std::filesystem::path root;
  std::optional<std::string> tag;  ///< none: the tag `latest` names
};

/// PATH is either a checkpoint root or a tag directory inside one (it holds metadata.json or
/// ckpt's marker); `--tag` overrides the tag.
inline location locate(const std::filesystem::path& path, const std::optional<std::string>& tag = std::nullopt) {
  namespace fs = std::filesystem;
  auto p = path.lexically_normal();
  if (p.has_filename() == false) p = p.parent_path();
  if (!fs::exists(p)) throw ckpt::error(ckpt::error_kind::not_found, "no such checkpoint: " + path.string());
  location loc{p, tag};
  const bool tag_dir = fs::exists(p / std::string(ckpt::detail::metadata_file)) || fs::exists(p / std::string(ckpt::detail::marker_file));
  if (tag_dir) {
    loc.root = p.parent_path().empty() ? fs::path(".") : p.parent_path();
    if (!loc.tag) loc.tag = p.filename().string();
  }
  return loc;
}

/// 1536 -> "1.5 KiB".
inline std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (b >= 1024 && u < 5) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

/// A JSON string literal of `s` (quotes included). Names are UTF-8 (ckpt checks that at save).
inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

/// A config value as JSON: ckpt keeps config values as text (numbers in decimal, bools as
/// true/false, strings as they are), so numbers and bools go out bare and the rest quoted.
inline std::string json_config_value(std::string_view text) {
  if (text == "true" || text == "false") return std::string(text);
  // A JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  std::size_t i = 0;
  const auto digits = [&] {
    const auto from = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    return i > from;
  };
  bool number = true;
  if (i < text.size() && text[i] == '-') ++i;
  if (i < text.size() && text[i] == '0') ++i;
  else number = digits();
  if (number && i < text.size() && text[i] == '.') {
    ++i;
    number = digits();
  }
  if (number && i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    number = digits();
  }
  return number && i == text.size() ? std::string(text) : json_string(text);
}

/// Bytes done, rate and ETA on one redrawn line of stderr, only when stderr is a terminal: a
/// log file or a pipe gets nothing. Redraws at most ten times a second.
class progress_bar {
 public:
  progress_bar(std::string label, std::uint64_t total) : label_(std::move(label)), total_(total), on_(::isatty(2) == 1) {}
  ~progress_bar() { finish(); }
  progress_bar(const progress_bar&) = delete;
  progress_bar& operator=(const progress_bar&) = delete;

  void update(std::uint64_t done) {
    if (!on_) return;
    const auto now = clock::now();
    if (now - last_ < std::chrono::milliseconds(100) && done < total_) return;
    last_ = now;
    const double secs = std::chrono::duration<double>(now - start_).count();
    const double rate = secs > 0 ? static_cast<double>(done) / secs : 0;
    const double frac = total_ ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
    constexpr int width = 30;
    const int filled = static_cast<int>(frac * width);
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(width, '.');
    char eta[32] = "";
    if (rate > 0 && done < total_) std::snprintf(eta, sizeof eta, " ETA %.0fs", static_cast<double>(total_ - done) / rate);
    std::fprintf(stderr, "\r%s [%s] %3.0f%% %s / %s  %s/s%s\033[K", label_.c_str(), bar.c_str(), frac * 100,
                 human_bytes(static_cast<double>(done)).c_str(), human_bytes(static_cast<double>(total_)).c_str(),
                 human_bytes(rate).c_str(), eta);
    drawn_ = true;
  }
  void finish() {
    if (drawn_) std::fputc('\n', stderr);
    drawn_ = false;
  }

 private:
  using clock = std::chrono::steady_clock;
  std::string label_;
  std::uint64_t total_;
  bool on_;
  bool drawn_ = false;
  clock::time_point start_ = clock::now(), last_{};
};

// The subcommands. Each returns the process's exit status; a ckpt::error escaping one is
// reported by main and exits with exit_error.
struct ls_args { std::string root; bool json = false; };
struct inspect_args { std::string path; std::optional<std::string> tag; bool json = false; bool chunks = false; };
struct verify_args { std::string path; std::optional<std::string> tag; bool quiet = false; };
struct diff_args { std::string a, b; double atol = 0, rtol = 0; bool values = true, config = true; std::uint64_t block_bytes = 64ull << 20; };
struct reshard_args {
  std::string src, dst;
  std::optional<std::string> tag;
  std::uint32_t tp = 1, pp = 1;
  std::vector<std::pair<std::string, int>> splits;  ///< (name glob, dimension; -1 keeps it whole)
  std::uint64_t memory_bytes = 512ull << 20;        ///< buffers of all ranks together
};
struct export_args {
  std::string src, out;
  std::optional<std::string> tag;
  std::string format = "safetensors";            ///< safetensors or torch
  std::optional<ckpt::dtype> dtype;              ///< floating-point tensors converted to this
  std::optional<std::uint64_t> max_shard_bytes;  ///< none: one file
  bool optimizer = true;                         ///< false: leave the optimizer group out
  std::string layout = "state_dict";             ///< torch: state_dict, or megatron (model_optim_rng.pt)
  std::optional<std::string> group;              ///< only the tensors under "group.", named without it
  std::uint64_t block_bytes = 64ull << 20;
};
struct import_args {
  std::string file, root;                  ///< file: a file, a tag folder or a checkpoint root
  std::optional<std::uint64_t> iteration;  ///< none: the file's "iteration", else 0
  std::optional<std::string> tag;          ///< of SRC (a root); a single file's import saves under it
  std::vector<std::pair<std::string, int>> splits;  ///< (name glob, dimension; -1 replicated)
  std::uint64_t memory_bytes = 128ull << 20;        ///< save buffers of all ranks together
};
struct prune_args { std::string root; std::size_t keep = 0; bool dry_run = false; };

int run_ls(const ls_args&);
int run_inspect(const inspect_args&);
int run_verify(const verify_args&);
int run_diff(const diff_args&);
int run_prune(const prune_args&);
int run_reshard(const reshard_args&);
int run_export(const export_args&);
int run_import(const import_args&);

}  // namespace ckpt_tool
