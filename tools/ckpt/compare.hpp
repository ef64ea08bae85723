#pragma once
// Comparing the tensors of two checkpoints block by block, in bounded memory: what `ckpt diff`
// reports and what `ckpt reshard` checks its output with.

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ckpt/reader.hpp>

#include "blocks.hpp"

namespace ckpt_tool {

/// How one tensor of A differs from the same-named tensor of B.
struct tensor_diff {
  double max_abs = 0, max_rel = 0;
  std::uint64_t mismatched = 0;  ///< elements outside atol + rtol * |b|
  std::string problem;           ///< set when dtype or shape differ (nothing was compared)
};

/// Folds one block of A and B into `d`. Elements are compared as doubles (exactly for every
/// dtype but 64-bit integers beyond 2^53, which are compared by their bytes when no tolerance
/// is given); NaN equals NaN, and infinities equal themselves.
inline void compare_block(const std::byte* a, const std::byte* b, std::uint64_t n, ckpt::dtype t, double atol, double rtol,
                          tensor_diff& d) {
  const bool exact_bytes = !ckpt::is_floating(t) && atol == 0 && rtol == 0;
  const auto elem = ckpt::size_of(t);
  for (std::uint64_t i = 0; i < n; ++i) {
    const double x = ckpt::element_as_double(a, t, i), y = ckpt::element_as_double(b, t, i);
    if (std::isnan(x) || std::isnan(y)) {
      if (std::isnan(x) != std::isnan(y)) {
        ++d.mismatched;
        d.max_abs = d.max_rel = HUGE_VAL;
      }
      continue;
    }
    if (x == y) {
      if (exact_bytes && std::memcmp(a + i * elem, b + i * elem, elem) != 0) ++d.mismatched;
      continue;
    }
    const double abs = std::isinf(x) || std::isinf(y) ? HUGE_VAL : std::fabs(x - y);
    const double rel = y == 0 ? HUGE_VAL : abs / std::fabs(y);
    d.max_abs = std::max(d.max_abs, abs);
    d.max_rel = std::max(d.max_rel, rel);
    if (!(abs <= atol + rtol * std::fabs(y))) ++d.mismatched;
  }
}

/// Compares each pair (a tensor of A, the same-named tensor of B), holding at most `budget`
/// bytes a side: large tensors go block by block, small ones are batched so that one load
/// reads many. `on_bytes(done)` reports progress in bytes of A compared.
template <class SA, class SB>
std::vector<tensor_diff> compare_tensors(ckpt::reader<SA>& ra, ckpt::reader<SB>& rb,
                                         const std::vector<std::pair<const ckpt::tensor_info*, const ckpt::tensor_info*>>& common,
                                         double atol, double rtol, std::uint64_t budget,
                                         const std::function<void(std::uint64_t)>& on_bytes = {}) {
  std::vector<tensor_diff> diffs(common.size());
  std::uint64_t done = 0;
  struct pending {
    std::size_t tensor;
    std::vector<std::byte> a, b;
  };
  std::vector<pending> batch;
  std::vector<std::pair<std::string, ckpt::tensor_ref>> ta, tb;
  std::uint64_t batch_bytes = 0;
  auto flush = [&] {
    if (batch.empty()) return;
    ra.read_all(ta);
    rb.read_all(tb);
    for (auto& p : batch) {
      const auto* t = common[p.tensor].first;
      compare_block(p.a.data(), p.b.data(), p.a.size() / ckpt::size_of(t->type), t->type, atol, rtol, diffs[p.tensor]);
      done += p.a.size();
    }
    if (on_bytes) on_bytes(done);
    batch.clear();
    ta.clear();
    tb.clear();
    batch_bytes = 0;
  };
  for (std::size_t k = 0; k < common.size(); ++k) {
    const auto* x = common[k].first;  // not a structured binding: the lambda below captures it
    const auto* y = common[k].second;
    if (x->type != y->type || x->shape != y->shape || x->order != y->order) {
      // Layouts are named when they differ or are column-major (whose shapes are in memory order).
      const bool layouts = x->order != y->order || x->order == ckpt::layout::column_major;
      const auto lay = [&](ckpt::layout l) { return layouts ? std::string(ckpt::to_string(l)) + " " : std::string(); };
      diffs[k].problem = "A is " + std::string(ckpt::to_string(x->type)) + " " + lay(x->order) + ckpt::detail::to_string(x->shape) +
                         ", B is " + std::string(ckpt::to_string(y->type)) + " " + lay(y->order) + ckpt::detail::to_string(y->shape);
      continue;
    }
    if (x->name == ckpt::detail::validation_name) {
      // ckpt's own tensor, which read_all does not reach: read whole (logits are small).
      std::vector<std::byte> a(static_cast<std::size_t>(x->raw_bytes)), b(a.size());
      ra.read_validation_logits(ckpt::tensor_ref(x->type, x->shape, a.data()));
      rb.read_validation_logits(ckpt::tensor_ref(y->type, y->shape, b.data()));
      compare_block(a.data(), b.data(), a.size() / ckpt::size_of(x->type), x->type, atol, rtol, diffs[k]);
      done += a.size();
      continue;
    }
    for_each_block(x->shape, ckpt::size_of(x->type), budget, [&](const ckpt::shape_t& offset, const ckpt::shape_t& shape) {
      const auto bytes = ckpt::detail::element_count(shape, x->name) * ckpt::size_of(x->type);
      if (batch_bytes + bytes > budget) flush();
      auto& p = batch.emplace_back(pending{k, std::vector<std::byte>(bytes), std::vector<std::byte>(bytes)});
      const ckpt::shard_spec spec{.global_shape = x->shape, .offset = offset};
      ta.emplace_back(x->name, ckpt::tensor_ref(x->type, shape, p.a.data()).laid_out(x->order).sharded(spec));
      tb.emplace_back(x->name, ckpt::tensor_ref(x->type, shape, p.b.data()).laid_out(y->order).sharded(spec));
      batch_bytes += bytes;
      // A name may appear once per load: a tensor of several blocks goes one block per load.
      if (shape != x->shape) flush();
    });
  }
  flush();
  return diffs;
}

}  // namespace ckpt_tool
