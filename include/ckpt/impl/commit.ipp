#pragma once
// The definitions of detail/commit.hpp: the ranks' reports and rank 0's merge of them into one
// tag's metadata. Header-only builds include this at the end of detail/commit.hpp;
// CKPT_SEPARATE_COMPILATION builds compile it once, in the translation unit that includes
// ckpt/impl/src.hpp.

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <unordered_map>

namespace ckpt::detail {

namespace report_impl {

/// Appends little-endian fields to a string (the layout bounded_reader reads back).
struct out {
  table_string s;
  template <class T>
  void put(T v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(std::string_view v) {
    put<std::uint64_t>(v.size());
    s.append(v);
  }
  void u64s(std::span<const std::uint64_t> v) { s.append(reinterpret_cast<const char*>(v.data()), v.size() * 8); }
};

constexpr std::uint8_t grid_kind = static_cast<std::uint8_t>(chunk_layout::kind::grid);
constexpr std::uint8_t list_kind = static_cast<std::uint8_t>(chunk_layout::kind::list);

/// One tensor of a schema, as rank 0 reads it.
struct schema_entry {
  std::string name;
  dtype type = dtype::f32;
  layout order = layout::row_major;
  shape_t shape;
  bool grid = false;
  shape_t block;
  region_table pieces;     // coordinates, relative to the cell
  std::size_t tensor = 0;  // index into the merge's tensors
  std::uint64_t cells = 0;  // of its grid, when the merge keeps it a grid
};

struct schema {
  std::vector<schema_entry> tensors;
  std::vector<std::string> held;
  std::size_t grids = 0;
  std::uint32_t first_rank = 0;  // the lowest rank that has it, for messages
};

/// A rank's report, its parts located.
struct report {
  std::optional<file_meta> file;
  std::vector<value_record> values;
  std::uint64_t schema_hash = 0, schema_size = 0;
  std::vector<std::array<std::uint64_t, 3>> runs;  // cells: count, first, step
  std::span<const std::byte> lists;                // the chunks of its list tensors (empty: none)
  std::span<const std::byte> schema;               // empty unless sent
};

inline schema parse_schema(std::span<const std::byte> bytes, std::uint32_t rank) {
  bounded_reader r(bytes, "the schema of rank " + std::to_string(rank), error_kind::communication);
  schema s;
  s.first_rank = rank;
  s.tensors.resize(r.count(20, "tensor"));
  for (auto& e : s.tensors) {
    e.name = r.string();
    const auto t = r.u8();
    const auto dt = dtype_from_id(t & 0x7fu);
    if (!dt) r.fail("unknown dtype id " + std::to_string(t) + " for tensor " + printable(e.name));
    e.type = *dt;
    e.order = layout_of_byte(t);
    e.shape = r.shape();
    const auto n = e.shape.size();
    const auto kind = r.u8();
    if (kind == grid_kind) {
      e.grid = true;
      ++s.grids;
      e.block.resize(n);
      if (n) r.copy(e.block.data(), n * 8);
      e.pieces.ndim = static_cast<std::uint32_t>(n);
      e.pieces.resize(r.count(std::max<std::uint64_t>(16 * n, 1), "piece"));
      if (n) r.copy(e.pieces.coords.data(), e.pieces.size() * 16 * n);
    } else if (kind != list_kind) {
      r.fail("unknown layout kind " + std::to_string(kind) + " of tensor " + printable(e.name));
    }
  }
  s.held.resize(r.count(8, "held name"));
  for (auto& h : s.held) h = r.string();
  if (r.remaining()) r.fail(std::to_string(r.remaining()) + " stray bytes at its end");
  return s;
}

inline report parse_report(std::span<const std::byte> b, std::uint32_t rank) {
  bounded_reader r(b, "the report of rank " + std::to_string(rank), error_kind::communication);
  report rep;
  if (r.u8() != 0) {
    auto& f = rep.file.emplace();
    f.path = r.string();
    f.size = r.u64();
    f.index_xxh3 = r.u64();
    f.rank = r.u32();
  }
  rep.values.resize(r.count(36, "value"));
  for (auto& v : rep.values) {
    v.name = r.string();
    v.rank = r.u32();
    v.file_offset = r.u64();
    v.size = r.u64();
    v.xxh3 = r.u64();
  }
  rep.schema_hash = r.u64();
  rep.schema_size = r.u64();
  rep.runs.resize(r.count(24, "cell run"));
  for (auto& run : rep.runs)
    for (auto& x : run) x = r.u64();
  const auto lists = r.u64();
  rep.lists = r.take(lists);
  if (r.u8() != 0) rep.schema = r.take(r.count(1, "schema byte"));
  if (r.remaining()) r.fail(std::to_string(r.remaining()) + " stray bytes at its end");
  return rep;
}

inline std::string saved_as(const schema_entry& e) {
  return std::string(to_string(e.type)) + " " + std::string(ckpt::to_string(e.order)) + " " + to_string(e.shape);
}

}  // namespace report_impl

CKPT_DECL rank_summary summarize(const written_shard* w, const std::vector<std::string>& held) {
  using namespace report_impl;
  out schema, own, lists;
  schema.put<std::uint8_t>(1);
  own.put<std::uint8_t>(1);
  std::vector<std::uint64_t> cells;
  own.put<std::uint8_t>(w ? 1 : 0);
  if (w) {
    own.str(w->path);
    own.put(w->size);
    own.put(w->index_xxh3);
    own.put(w->index.rank);
  }
  own.put<std::uint64_t>(w ? w->index.values.size() : 0);
  if (w)
    for (const auto& v : w->index.values) {
      own.str(v.name);
      own.put(v.rank);
      own.put(v.file_offset);
      own.put(v.size);
      own.put(v.xxh3);
    }
  schema.put<std::uint64_t>(w ? w->index.tensors.size() : 0);
  if (w)
    for (const auto& g : w->index.tensors) {
      const auto n = g.global_shape.size();
      const auto& c = g.chunks;
      schema.str(g.name);
      schema.put(dtype_byte(g.type, g.order));
      schema.put<std::uint64_t>(n);
      schema.u64s(g.global_shape);
      // The box of this rank's chunks. It is a grid cell when it divides the tensor and sits on
      // a multiple of its own shape (an even split); the chunks are then the cell's pieces.
      if (n > max_dims) throw error(error_kind::invalid_argument, "tensor " + printable(g.name) + " has " + std::to_string(n) + " dimensions");
      dims_array lo, hi;
      std::fill_n(lo.begin(), n, ~std::uint64_t{0});
      std::fill_n(hi.begin(), n, 0);
      std::uint64_t elements = 0;
      for (std::size_t i = 0; i < c.size(); ++i) {
        for (std::size_t d = 0; d < n; ++d) {
          lo[d] = std::min(lo[d], c.offset(i)[d]);
          hi[d] = std::max(hi[d], c.offset(i)[d] + c.shape(i)[d]);
        }
        elements += c.elements(i);
      }
      bool grid = c.size() > 0 && c.ndim == n;
      std::uint64_t box = 1, cell = 0;
      for (std::size_t d = 0; d < n && grid; ++d) {
        const auto b = hi[d] - lo[d];
        if (b == 0 || g.global_shape[d] % b != 0 || lo[d] % b != 0) grid = false;
        else {
          box *= b;
          cell = cell * (g.global_shape[d] / b) + lo[d] / b;
        }
      }
      if (grid && elements != box) grid = false;  // not the whole box (rank 0 checks pieces tile it)
      if (grid) {
        schema.put(grid_kind);
        for (std::size_t d = 0; d < n; ++d) schema.put(hi[d] - lo[d]);
        schema.put<std::uint64_t>(c.size());
        for (std::size_t i = 0; i < c.size(); ++i) {
          for (std::size_t d = 0; d < n; ++d) schema.put(c.offset(i)[d] - lo[d]);
          schema.u64s(c.shape(i));
        }
        cells.push_back(cell);
      } else {
        schema.put(list_kind);
        if (lists.s.empty()) lists.put<std::uint8_t>(1);  // byte-order flag: rank 0 reads the part in place
        lists.put<std::uint64_t>(c.size());
        if (c.ndim == n) lists.u64s(std::span(c.coords.data(), c.size() * 2 * n));
      }
    }
  schema.put<std::uint64_t>(held.size());
  for (const auto& h : held) schema.str(h);
  rank_summary s;
  s.schema_hash = xxh3(as_bytes(schema.s));
  own.put(s.schema_hash);
  own.put<std::uint64_t>(schema.s.size());
  // The cells, as arithmetic runs: a tensor-parallel rank holds cell k of every tensor.
  std::vector<std::array<std::uint64_t, 3>> runs;
  for (std::size_t i = 0; i < cells.size();) {
    std::array<std::uint64_t, 3> run = {1, cells[i], 0};
    if (i + 1 < cells.size()) {
      run[2] = cells[i + 1] - cells[i];  // modulo 2^64: a falling run works too
      while (i + run[0] < cells.size() && cells[i + run[0]] == run[1] + run[0] * run[2]) ++run[0];
    }
    runs.push_back(run);
    i += run[0];
  }
  own.put<std::uint64_t>(runs.size());
  for (const auto& run : runs)
    for (const auto x : run) own.put(x);
  own.put<std::uint64_t>(lists.s.size());
  own.s += lists.s;
  s.schema = std::move(schema.s);
  s.own = std::move(own.s);
  return s;
}

CKPT_DECL table_string encode_report(const rank_summary& s, bool with_schema) {
  report_impl::out o;
  o.s = s.own;
  o.put<std::uint8_t>(with_schema ? 1 : 0);
  if (with_schema) o.str(s.schema);
  return std::move(o.s);
}

CKPT_DECL std::string encode_written(const written_shard* w) {
  report_impl::out o;
  o.put<std::uint8_t>(1);  // the byte-order flag bounded_reader expects
  o.put<std::uint8_t>(w ? 1 : 0);
  if (!w) return std::string(o.s.begin(), o.s.end());
  o.put(w->size);
  o.put(w->index_xxh3);
  o.put<std::uint64_t>(w->index.values.size());
  for (const auto& v : w->index.values) {
    o.str(v.name);
    o.put(v.rank);
    o.put(v.file_offset);
    o.put(v.size);
    o.put(v.xxh3);
  }
  return std::string(o.s.begin(), o.s.end());
}

CKPT_DECL void attach_written(metadata& md, const std::vector<std::vector<std::byte>>& written) {
  std::size_t f = 0;  // md.files are in rank order, one per rank that planned a file
  for (std::size_t r = 0; r < written.size(); ++r) {
    const auto rank = static_cast<std::uint32_t>(r);
    bounded_reader rd(written[r], "what rank " + std::to_string(r) + " reported after writing", error_kind::communication);
    const bool has_file = rd.u8() != 0;
    const bool planned = f < md.files.size() && md.files[f].rank == rank;
    if (has_file != planned)
      rd.fail(has_file ? "it wrote a file it did not plan" : "it planned a file but wrote none");
    if (!has_file) {
      if (rd.remaining()) rd.fail(std::to_string(rd.remaining()) + " stray bytes at its end");
      continue;
    }
    md.files[f].size = rd.u64();
    md.files[f].index_xxh3 = rd.u64();
    const auto n = rd.count(36, "value");
    for (std::uint64_t i = 0; i < n; ++i) {
      value_meta v;
      v.name = rd.string();
      v.rank = rd.u32();
      v.file = static_cast<std::uint32_t>(f);
      v.file_offset = rd.u64();
      v.size = rd.u64();
      v.xxh3 = rd.u64();
      md.values.push_back(std::move(v));
    }
    if (rd.remaining()) rd.fail(std::to_string(rd.remaining()) + " stray bytes at its end");
    ++f;
  }
  if (f != md.files.size())
    throw error(error_kind::communication, std::to_string(md.files.size() - f) + " planned shard files were not reported written");
}

CKPT_DECL metadata merge_reports(const std::string& tag, std::uint64_t iteration, const ckpt::topology& topo,
                                 const ckpt::config& cfg, std::span<const std::span<const std::byte>> reports,
                                 unsigned threads) {
  using namespace report_impl;
  metadata md;
  md.tag = tag;
  md.iteration = iteration;
  md.topology = topo;
  md.config = cfg;
  const std::string cannot = "cannot commit " + tag + ": ";

  // The reports, and the schemas the lowest rank of each sent.
  std::vector<report> reps;
  reps.reserve(reports.size());
  std::unordered_map<std::uint64_t, std::size_t> schema_of_hash;
  std::vector<schema> schemas;
  std::vector<std::uint32_t> file_of(reports.size(), 0);
  for (std::size_t r = 0; r < reports.size(); ++r) {
    const auto rank = static_cast<std::uint32_t>(r);
    auto& rep = reps.emplace_back(parse_report(reports[r], rank));
    if (rep.file) {
      file_of[r] = static_cast<std::uint32_t>(md.files.size());
      md.files.push_back(*rep.file);
    }
    for (auto& v : rep.values) md.values.push_back({std::move(v.name), v.rank, file_of[r], v.file_offset, v.size, v.xxh3});
    if (!rep.schema.empty() && !schema_of_hash.count(rep.schema_hash)) {
      if (rep.schema.size() != rep.schema_size || xxh3(rep.schema) != rep.schema_hash)
        throw error(error_kind::communication, "the schema rank " + std::to_string(r) + " sent does not match its checksum");
      schema_of_hash.emplace(rep.schema_hash, schemas.size());
      schemas.push_back(parse_schema(rep.schema, rank));
    }
  }

  // Every tensor, in order of first sighting, and whether all its writers agree on one grid.
  struct merged {
    schema_entry* first = nullptr;  // where it was first seen (its block and pieces move to the layout)
    bool grid = true;
    // A grid's cells: the file of each (no_file until one claims it; its part of `cell_files`
    // below, one array for all tensors rather than one each), or, when it has more cells than
    // writers (so it has a gap, and the array could be huge), (cell, file) pairs.
    std::span<std::uint32_t> file_of_cell;
    std::vector<std::pair<std::uint64_t, std::uint32_t>> cells;
    region_table list;  // when not a grid
    std::uint64_t grid_cells = 0;
    std::size_t writers = 0;
  };
  std::vector<merged> tensors;
  // Names seen, as views of the schemas' names (which stay put until the finish moves them).
  std::size_t entries = 0;  // at least as many as the distinct tensors: no growth below
  for (const auto& s : schemas) entries += s.tensors.size();
  tensors.reserve(entries);
  name_index by_name(entries);
  const auto name_of = [](const merged& m) -> std::string_view { return m.first->name; };
  std::vector<const schema*> schema_of(reps.size(), nullptr);
  std::vector<bool> resolved(schemas.size(), false);
  for (std::size_t r = 0; r < reps.size(); ++r) {
    const auto it = schema_of_hash.find(reps[r].schema_hash);
    if (it == schema_of_hash.end())
      throw error(error_kind::communication, "rank " + std::to_string(r) + " refers to a schema no rank sent");
    auto& s = schemas[it->second];
    s.first_rank = std::min(s.first_rank, static_cast<std::uint32_t>(r));
    schema_of[r] = &s;
    if (resolved[it->second]) continue;
    resolved[it->second] = true;
    for (auto& e : s.tensors) {
      const auto [at, fresh] = by_name.try_add(e.name, tensors.size(), tensors, name_of);
      e.tensor = at;
      if (fresh) {
        auto& m = tensors.emplace_back();
        m.first = &e;
        m.grid = e.grid;
        continue;
      }
      auto& m = tensors[e.tensor];
      if (m.first->type != e.type || m.first->shape != e.shape || m.first->order != e.order)
        throw error(error_kind::invalid_argument, "tensor " + printable(e.name) + " is saved as " + saved_as(*m.first) +
                                                      " by one rank and as " + saved_as(e) + " by rank " + std::to_string(r));
      if (m.grid && (!e.grid || e.block != m.first->block || e.pieces.coords != m.first->pieces.coords)) m.grid = false;
    }
  }
  for (auto& m : tensors) {
    const auto& e = *m.first;
    if (!m.grid) continue;
    // A grid's cells are numbered: check that they can be, and that the pieces tile a cell.
    std::uint64_t cells = 1;
    for (std::size_t d = 0; d < e.shape.size(); ++d) {
      if (e.block[d] == 0 || e.shape[d] % e.block[d] != 0) throw error(error_kind::communication, "bad grid of " + printable(e.name));
      cells *= e.shape[d] / e.block[d];  // cannot overflow: at most the tensor's element count
    }
    m.grid_cells = cells;
    check_tiling(e.name, e.block, e.pieces, [](std::size_t) { return std::string("one rank's file"); },
                 error_kind::invalid_argument, cannot, "(one rank's shard) ");
  }
  constexpr std::uint32_t no_file = ~std::uint32_t{0};
  for (std::size_t r = 0; r < reps.size(); ++r)
    if (reps[r].file)
      for (const auto& e : schema_of[r]->tensors) ++tensors[e.tensor].writers;
  std::uint64_t array_cells = 0;  // at most the writers of all tensors
  for (const auto& m : tensors)
    if (m.grid && m.grid_cells <= m.writers) array_cells += m.grid_cells;
  std::vector<std::uint32_t> cell_files(array_cells, no_file);
  array_cells = 0;
  for (auto& m : tensors)
    if (m.grid) {
      if (m.grid_cells <= m.writers) {
        m.file_of_cell = std::span(cell_files.data() + array_cells, m.grid_cells);
        array_cells += m.grid_cells;
      } else {
        m.cells.reserve(m.writers);
      }
    }
  for (auto& s : schemas)  // each grid entry's cell count, once
    for (auto& e : s.tensors)
      if (e.grid) e.cells = tensors[e.tensor].grid ? tensors[e.tensor].grid_cells : 0;

  // The common case, made a tight loop: a schema whose every tensor stays a grid with a file
  // array. Its slots, one per tensor in schema order.
  struct slot {
    std::uint32_t* files;
    std::uint64_t cells;
  };
  std::vector<std::vector<slot>> fast(schemas.size());
  for (std::size_t i = 0; i < schemas.size(); ++i) {
    for (const auto& e : schemas[i].tensors) {
      auto& m = tensors[e.tensor];
      if (!e.grid || !m.grid || m.file_of_cell.empty()) {
        fast[i].clear();
        break;
      }
      fast[i].push_back({m.file_of_cell.data(), m.grid_cells});
    }
  }

  // Which cell (or chunks) of each tensor each file holds.
  std::vector<std::uint64_t> coords;
  for (std::size_t r = 0; r < reps.size(); ++r) {
    const auto& rep = reps[r];
    const auto& s = *schema_of[r];
    if (!rep.file) {
      if (!s.tensors.empty())
        throw error(error_kind::communication, "rank " + std::to_string(r) + " reports tensors but no file");
      continue;
    }
    const auto f = file_of[r];
    if (const auto& slots = fast[static_cast<std::size_t>(&s - schemas.data())];
        !slots.empty() && rep.lists.empty()) {
      std::size_t k = 0;
      bool clean = true;
      for (const auto& [count, first, step] : rep.runs) {
        if (count > slots.size() - k) break;  // the general path below says what is wrong
        for (std::uint64_t j = 0; j < count; ++j, ++k) {
          const auto cell = first + j * step;
          if (cell >= slots[k].cells || slots[k].files[cell] != no_file) {
            clean = false;
            break;
          }
          slots[k].files[cell] = f;
        }
        if (!clean) break;
      }
      if (clean && k == slots.size()) continue;
      // Undo this rank's claims, and let the general path find and report the problem.
      k = 0;
      for (const auto& [count, first, step] : rep.runs)
        for (std::uint64_t j = 0; j < count && k < slots.size(); ++j, ++k) {
          const auto cell = first + j * step;
          if (cell < slots[k].cells && slots[k].files[cell] == f) slots[k].files[cell] = no_file;
        }
    }
    static constexpr std::byte no_lists[1] = {std::byte{1}};  // just the byte-order flag
    bounded_reader rd(rep.lists.empty() ? std::span<const std::byte>(no_lists) : rep.lists,
                      "the chunk lists of rank " + std::to_string(r), error_kind::communication);
    std::size_t run = 0;
    std::uint64_t in_run = 0;
    std::uint64_t listed = 0;
    for (const auto& run_ : rep.runs) listed += run_[0];
    if (listed != s.grids)
      throw error(error_kind::communication, "rank " + std::to_string(r) + " reports " + std::to_string(listed) +
                                                 " grid cells for the " + std::to_string(s.grids) + " grid tensors of its schema");
    for (const auto& e : s.tensors) {
      auto& m = tensors[e.tensor];
      const auto n = e.shape.size();
      if (e.grid) {
        while (in_run == rep.runs[run][0]) {
          ++run;
          in_run = 0;
        }
        const auto cell = rep.runs[run][1] + in_run * rep.runs[run][2];
        ++in_run;
        if (m.grid) {
          if (cell >= e.cells)
            throw error(error_kind::communication, "rank " + std::to_string(r) + " reports cell " + std::to_string(cell) +
                                                       " of tensor " + printable(e.name) + ", which has " + std::to_string(e.cells));
          if (m.file_of_cell.empty()) {
            m.cells.emplace_back(cell, f);
          } else if (m.file_of_cell[cell] == no_file) {
            m.file_of_cell[cell] = f;
          } else {  // kept for the finish, which names both files in name order of tensors
            m.cells.emplace_back(cell, f);
          }
          continue;
        }
        // Another rank cut this tensor differently: list this rank's chunks one by one.
        shape_t origin(n), at(n);
        std::uint64_t rest = cell;
        for (std::size_t d = n; d > 0; --d) {
          const auto k = e.shape[d - 1] / e.block[d - 1];
          origin[d - 1] = rest % k * e.block[d - 1];
          rest /= k;
        }
        m.list.ndim = static_cast<std::uint32_t>(n);
        for (std::size_t p = 0; p < e.pieces.size(); ++p) {
          for (std::size_t d = 0; d < n; ++d) at[d] = origin[d] + e.pieces.offset(p)[d];
          m.list.push(f, at, e.pieces.shape(p));
        }
      } else {
        const auto count = rd.count(std::max<std::uint64_t>(16 * n, 1), "chunk");
        coords.resize(count * 2 * n);
        if (n) rd.copy(coords.data(), coords.size() * 8);
        m.list.ndim = static_cast<std::uint32_t>(n);
        for (std::uint64_t i = 0; i < count; ++i)
          m.list.push(f, std::span(coords.data() + i * 2 * n, n), std::span(coords.data() + i * 2 * n + n, n));
      }
    }
    if (rd.remaining()) rd.fail(std::to_string(rd.remaining()) + " stray bytes at its end");
  }

  // A tensor some rank holds must have been written by the rank the policy chose; if that rank
  // does not hold it (the layout differs from what the policy assumes), it would vanish.
  for (std::size_t r = 0; r < reps.size(); ++r) {
    const auto& s = *schema_of[r];
    if (s.first_rank != r) continue;  // each schema once, at its lowest rank
    for (const auto& name : s.held)
      if (by_name.find(name, tensors, name_of) == name_index::npos)
        throw error(error_kind::invalid_argument,
                    cannot + "tensor " + printable(name) + " is held by rank " + std::to_string(r) +
                        " but no rank wrote it: the rank the shard policy chose as its writer does not declare it "
                        "(megatron: declare it on every rank of its pipeline stage or give it a shard_spec; "
                        "gather_to_root: declare it on rank 0)");
  }

  // Each tensor's layout, its cells or chunks checked to tile it exactly once: on `threads`
  // workers, each failure kept, and the first in name order reported.
  // Each tensor's place in metadata.json (name order), decided before the finish moves the
  // names, so that it fills the metadata in place. Sorted as (name, index) pairs side by side:
  // comparing through the tensors' records, hundreds of bytes apart, made this sort a quarter
  // of a 100,000-tensor merge; and by a sort made for names that share long prefixes.
  std::vector<std::size_t> slot_of(tensors.size());
  {
    std::vector<named_position> order(tensors.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = {tensors[i].first->name, i};
    sort_by_name(order);
    for (std::size_t k = 0; k < order.size(); ++k) slot_of[order[k].second] = k;
  }
  md.tensors.resize(tensors.size());
  std::vector<std::exception_ptr> failed(tensors.size());  // by place: the first is the first in name order
  std::atomic<std::size_t> next{0};
  auto finish = [&](std::size_t i) {
    auto& m = tensors[i];
    auto& e = *m.first;
    auto& t = md.tensors[slot_of[i]];
    t.name = std::move(e.name);  // the merge is the schema's last reader: messages below use t's
    t.type = e.type;
    t.shape = std::move(e.shape);
    t.order = e.order;
    t.chunks.ndim = static_cast<std::uint32_t>(t.shape.size());
    auto& l = t.placement.emplace();
    const auto where = [&](std::uint32_t f) { return md.files[f].path; };
    if (!m.grid) {
      l.how = chunk_layout::kind::list;
      l.chunks() = std::move(m.list);
      l.chunks().ndim = static_cast<std::uint32_t>(t.shape.size());
      check_tiling(t.name, t.shape, l.chunks(), [&](std::size_t c) { return where(l.chunks().file[c]); },
                   error_kind::invalid_argument, cannot);
      t.chunk_count = l.chunks().size();
      return;
    }
    l.how = chunk_layout::kind::grid;
    l.block = std::move(e.block);  // the merge is the schema's last reader
    l.pieces() = std::move(e.pieces);
    const auto n = t.shape.size();
    const auto region_of = [&](std::uint64_t cell) {
      shape_t a(n), b(n);
      for (std::size_t d = n; d > 0; --d) {
        const auto k = t.shape[d - 1] / l.block[d - 1];
        a[d - 1] = cell % k * l.block[d - 1];
        b[d - 1] = a[d - 1] + l.block[d - 1];
        cell /= k;
      }
      return region_string(a, b);
    };
    const auto fail = [&](const std::string& what) {
      throw error(error_kind::invalid_argument, cannot + "tensor " + printable(t.name) + ": " + what);
    };
    const auto gap = [&](std::uint64_t cell) {
      fail("region " + region_of(cell) + " of global shape " + to_string(t.shape) + " is not stored by any shard");
    };
    auto& cells = m.cells;
    auto& file_of_cell = m.file_of_cell;
    if (!file_of_cell.empty()) {
      // Claimed twice: the first claim is in the array, the later ones in `cells`.
      if (!cells.empty()) {
        const auto [cell, f] = *std::min_element(cells.begin(), cells.end());
        fail("region " + region_of(cell) + " is stored twice (in " + where(file_of_cell[cell]) + " and " + where(f) + ")");
      }
      for (std::uint64_t k = 0; k < file_of_cell.size(); ++k)
        if (file_of_cell[k] == no_file) gap(k);
    } else {
      if (!std::is_sorted(cells.begin(), cells.end())) std::sort(cells.begin(), cells.end());
      for (std::size_t k = 0; k < cells.size(); ++k) {
        if (k > 0 && cells[k].first == cells[k - 1].first)
          fail("region " + region_of(cells[k].first) + " is stored twice (in " + where(cells[k - 1].second) + " and " +
               where(cells[k].second) + ")");
        if (cells[k].first != k) gap(k);
      }
      gap(cells.size());  // fewer writers than cells: one is missing
    }
    l.runs = runs_of(file_of_cell);
    t.chunk_count = m.grid_cells * l.pieces().size();
  };
  threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(std::max<std::size_t>(tensors.size(), 1))));
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < tensors.size();) {
      try {
        finish(i);
      } catch (...) {
        failed[slot_of[i]] = std::current_exception();
      }
    }
  };
  {
    std::vector<std::jthread> pool;
    for (unsigned w = 1; w < threads; ++w) pool.emplace_back(work);
    work();
  }
  for (const auto& f : failed)
    if (f) std::rethrow_exception(f);
  return md;
}

}  // namespace ckpt::detail
