#pragma once
// The definitions of detail/restore_plan.hpp: the config check, matching names and the plan.
// Header-only builds include this at the end of detail/restore_plan.hpp; CKPT_SEPARATE_COMPILATION builds
// compile it once, in the translation unit that includes ckpt/impl/src.hpp.

#include <set>
#include <unordered_set>

namespace ckpt::detail {

CKPT_DECL void check_config(const metadata& md, const config& live, const std::vector<std::string>& ignore, const std::string& md_name) {
  std::set<std::string> keys;
  for (const auto& [k, _] : md.config.entries()) keys.insert(k);
  for (const auto& [k, _] : live.entries()) keys.insert(k);
  std::string diffs;
  for (const auto& k : keys) {
    if (std::find(ignore.begin(), ignore.end(), k) != ignore.end()) continue;
    const auto* a = md.config.find(k);
    const auto* b = live.find(k);
    if (a && b && *a == *b) continue;
    diffs += (diffs.empty() ? "" : "; ") + k + " saved " + (a ? *a : std::string("(absent)")) + ", current " +
             (b ? *b : std::string("(absent)"));
  }
  if (!diffs.empty()) throw error(error_kind::mismatch, "config mismatch in " + md_name + ": " + diffs);
}

CKPT_DECL stored_matches match_names(const metadata& md, const stored_index& index, const visitor& v, load_result& result) {
  stored_matches matches;
  matches.reserve(v.tensors().size());
  std::unordered_set<std::string_view> live;
  std::size_t found = 0;
  for (const auto& t : v.tensors()) {
    matches.push_back(index.find_tensor(t.name));
    if (matches.back()) {
      found += !t.name.starts_with("__ckpt");  // counted against the stored names classify looks at
    } else {
      result.missing.push_back(t.name);
      live.insert(t.name);  // live, though not a stored tensor's name
    }
  }
  // Live names are distinct, stored ones distinct: when as many live tensors are stored as there
  // are stored tensors not named "__ckpt…" (which classify passes over), none of those is left
  // over, and the set of every live name (100,000 of them, at every load) is not needed.
  const auto own = static_cast<std::size_t>(
      std::count_if(md.tensors.begin(), md.tensors.end(), [](const tensor_meta& t) { return t.name.starts_with("__ckpt"); }));
  const bool all_stored_live = found == md.tensors.size() - own;
  if (!all_stored_live)
    for (const auto& t : v.tensors()) live.insert(t.name);
  for (const auto& val : v.values()) {
    live.insert(val.name);
    if (!index.find_value(val.name)) result.missing.push_back(val.name);
  }
  std::unordered_set<std::string_view> done;  // values appear once per rank
  auto classify = [&](const std::string& name) {
    // (With every stored tensor live, a live tensor's name is a stored tensor's name or in
    // `live` as a missing one.)
    const bool is_live = live.count(name) || (all_stored_live && index.find_tensor(name));
    if (name.starts_with("__ckpt") || is_live || !done.insert(name).second) return;
    (v.in_skipped_group(name) ? result.skipped : result.unexpected).push_back(name);
  };
  if (!all_stored_live)
    for (const auto& t : md.tensors) classify(t.name);
  for (const auto& val : md.values) classify(val.name);
  return matches;
}

CKPT_DECL restore_plan plan_restore(const metadata& md, const stored_index& index, const visitor& v, const stored_matches& matches,
                                   const load_options& opts, const restore_context& ctx,
                                   const std::function<bool(device)>& accepts, load_result& result) {
  const auto& md_name = ctx.md_name;
  if (matches.size() != v.tensors().size())
    throw error(error_kind::invalid_argument, "plan_restore: " + std::to_string(matches.size()) + " matches for " +
                                          std::to_string(v.tensors().size()) + " live tensors (" + md_name + ")");
  if (opts.strict && (!result.missing.empty() || !result.unexpected.empty())) {
    std::string msg = "checkpoint " + md.tag + " does not match the live state";
    if (!result.missing.empty()) msg += "; missing from the checkpoint: " + join(result.missing);
    if (!result.unexpected.empty()) msg += "; in the checkpoint but not in the live state: " + join(result.unexpected);
    throw error(error_kind::mismatch, msg + " (" + md_name + ")");
  }
  restore_plan plan;
  plan.tensors.reserve(v.tensors().size());
  for (std::size_t i = 0; i < matches.size(); ++i) {
    const auto* found = matches[i];
    if (!found) continue;
    const auto& t = v.tensors()[i];
    const auto& s = *found;
    // Layouts first: a column-major tensor's shapes are in memory order, which only make
    // sense to the user reversed (and a square matrix's agree in either order).
    if (s.order != t.ref.order() ||
        (s.order == layout::column_major && (s.type != t.ref.type() || s.shape != t.ref.global_shape())))
      throw error(error_kind::mismatch, "tensor " + printable(t.name) + ": saved " + std::string(to_string(s.type)) + " " +
                                            std::string(to_string(s.order)) + " " + to_string(logical_shape(s.shape, s.order)) +
                                            ", live " + std::string(to_string(t.ref.type())) + " " +
                                            std::string(to_string(t.ref.order())) + " " +
                                            to_string(logical_shape(t.ref.global_shape(), t.ref.order())) + " (" + md_name + ")");
    if (s.type != t.ref.type() || s.shape != t.ref.global_shape())
      throw error(error_kind::mismatch, "tensor " + printable(t.name) + ": saved " + std::string(to_string(s.type)) + " " +
                                            to_string(s.shape) + ", live " + std::string(to_string(t.ref.type())) + " " +
                                            to_string(t.ref.global_shape()) + " (" + md_name + ")");
    if (!t.ref.writable())
      throw error(error_kind::invalid_argument, "tensor " + printable(t.name) + " is read-only and cannot be loaded into");
    if (!accepts(t.ref.where()))
      throw error(error_kind::invalid_argument, "tensor " + printable(t.name) + " lives on a device the DevicePolicy does not handle");
    plan.tensors.push_back({found, &t.name, &t.ref});
  }

  // Per-rank values decide before any byte is read whether the load can go ahead at all.
  const bool same_layout = md.topology == ctx.live_topology;
  if (!same_layout && opts.on_topology_change == topology_change::error && !v.values().empty())
    throw error(error_kind::mismatch, "checkpoint " + md.tag + " was saved with " + to_string(md.topology) +
                                          " and is loaded with " + to_string(ctx.live_topology) +
                                          ": per-rank values (RNG states) cannot be restored rank-for-rank; set "
                                          "load_options::on_topology_change to keep_live or from_rank_0");
  // Values are per rank: restored rank-for-rank when the layout is the one saved, otherwise
  // as the caller chose.
  const auto my_rank = same_layout ? ctx.rank : 0u;
  for (const auto& val : v.values()) {
    const auto* copies = index.find_value(val.name);
    if (!copies) continue;
    if (!same_layout && opts.on_topology_change == topology_change::keep_live) {
      result.kept_live.push_back(val.name);
      continue;
    }
    const value_meta* pick = nullptr;
    for (const auto* m : *copies)
      if (m->rank == my_rank) pick = m;
    if (!pick)
      throw error(error_kind::mismatch, "value " + printable(val.name) + " was not saved by rank " + std::to_string(my_rank) +
                                            " (" + md_name + ")");
    plan.values.emplace_back(&val, pick);
  }
  return plan;
}

}  // namespace ckpt::detail
