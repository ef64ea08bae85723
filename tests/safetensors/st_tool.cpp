// The C++ half of the PyTorch cross-check (check_safetensors.py drives it):
//
//   st_tool write DIR        writes DIR/single/model.safetensors (the table in declaration order),
//                            DIR/sorted/model.safetensors (reference order) and DIR/sharded/
//                            (200-byte shards and an index), all from the shared value table
//   st_tool check PATH       reads a file or an index and checks it holds exactly the table's
//                            tensors with the table's values; prints its metadata
//   st_tool dump PATH        prints every tensor and metadata entry of a file or index
//   st_tool copy IN OUT      reads safetensors file IN and writes its tensors and metadata to OUT
//                            in the reference implementation's order (sort_by_alignment); OUT may
//                            be IN itself
//
// The table and its values are defined identically in check_safetensors.py: element i of tensor
// k comes from a 64-bit hash of (k, i), so both sides compute the same bytes independently.

#include <ckpt/interop/safetensors.hpp>

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace st = ckpt::interop;
using ckpt::dtype;

namespace {

struct entry {
  const char* name;
  dtype type;
  ckpt::shape_t shape;
};

// Keep in step with TABLE in check_safetensors.py.
const std::vector<entry>& table() {
  static const std::vector<entry> t{
      {"emb.f64", dtype::f64, {3, 5}},
      {"layers.0.f32", dtype::f32, {4, 6}},
      {"layers.0.f16", dtype::f16, {7}},
      {"layers.0.bf16", dtype::bf16, {2, 3, 4}},
      {"big.f32", dtype::f32, {16, 5}},
      {"i64", dtype::i64, {9}},
      {"i32", dtype::i32, {2, 5}},
      {"i16", dtype::i16, {11}},
      {"i8", dtype::i8, {13}},
      {"u8", dtype::u8, {3, 3}},
      {"flags", dtype::boolean, {7}},
      {"scalar.f32", dtype::f32, {}},
      {"scalar.i64", dtype::i64, {}},
      {"empty.f32", dtype::f32, {0}},
      {"empty.bf16", dtype::bf16, {3, 0}},
      {"tail.f16", dtype::f16, {2, 2}},
  };
  return t;
}

std::uint64_t hash(std::uint64_t k, std::uint64_t i) {
  std::uint64_t x = (k + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 31);
}

/// Floats are multiples of 1/16 in [-16, 16), exact in every float dtype (bf16 included), with
/// -0, +inf, -inf and NaN at fixed positions.
double float_value(std::uint64_t k, std::uint64_t i) {
  switch (i % 11) {
    case 3: return -0.0;
    case 5: return std::numeric_limits<double>::infinity();
    case 7: return -std::numeric_limits<double>::infinity();
    case 9: return std::numeric_limits<double>::quiet_NaN();
    default: return static_cast<double>(static_cast<std::int64_t>((hash(k, i) >> 40) % 512) - 256) / 16.0;
  }
}

template <class T>
void put(std::vector<std::byte>& out, T v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

/// The bytes of table entry `k`.
std::vector<std::byte> expected_bytes(std::size_t k) {
  const auto& e = table()[k];
  std::vector<std::byte> out;
  const std::uint64_t n = ckpt::detail::element_count(e.shape, e.name);
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t h = hash(k, i);
    switch (e.type) {
      case dtype::f64: put(out, float_value(k, i)); break;
      case dtype::f32: put(out, static_cast<float>(float_value(k, i))); break;
      case dtype::f16: put(out, ckpt::float16(static_cast<float>(float_value(k, i))).bits); break;
      case dtype::bf16: put(out, ckpt::bfloat16(static_cast<float>(float_value(k, i))).bits); break;
      case dtype::i64: put(out, h); break;
      case dtype::i32: put(out, static_cast<std::uint32_t>(h)); break;
      case dtype::i16: put(out, static_cast<std::uint16_t>(h)); break;
      case dtype::i8:
      case dtype::u8: put(out, static_cast<std::uint8_t>(h)); break;
      case dtype::boolean: put(out, static_cast<std::uint8_t>((h >> 7) & 1)); break;
      // Not in the table (torch 1.13, the cross-check's reference, lacks them; reference_cases.py
      // covers them), but any bit pattern is a value.
      case dtype::u16: put(out, static_cast<std::uint16_t>(h)); break;
      case dtype::u32: put(out, static_cast<std::uint32_t>(h)); break;
      case dtype::u64: put(out, h); break;
      case dtype::f8_e4m3: case dtype::f8_e5m2: put(out, static_cast<std::uint8_t>(h)); break;
    }
  }
  return out;
}

std::vector<st::tensor_decl> declarations() {
  std::vector<st::tensor_decl> d;
  for (const auto& e : table()) d.push_back({e.name, e.type, e.shape});
  return d;
}

std::size_t table_index(const std::string& name) {
  for (std::size_t k = 0; k < table().size(); ++k)
    if (name == table()[k].name) return k;
  return table().size();
}

// Keep in step with METADATA in check_safetensors.py.
const st::safetensors_metadata metadata{
    {"format", "pt"}, {"producer", "ckpt st_tool"}, {"note \xe2\x9c\x93", "quote \" backslash \\ newline \n tab \t"}};

int write(const std::string& dir) {
  {
    std::filesystem::create_directories(dir + "/single");
    st::safetensors_writer w(dir + "/single/model.safetensors", declarations(), metadata);
    // Backwards and in two pieces per tensor, to exercise streaming placement.
    for (std::size_t k = table().size(); k-- > 0;) {
      const auto bytes = expected_bytes(k);
      const std::span<const std::byte> all(bytes);
      w.write(table()[k].name, all.first(all.size() / 2));
      w.write(table()[k].name, all.subspan(all.size() / 2));
    }
    w.finish();
  }
  {
    std::filesystem::create_directories(dir + "/sorted");
    auto decls = declarations();
    st::sort_by_alignment(decls);
    st::safetensors_writer w(dir + "/sorted/model.safetensors", decls, {{"format", "pt"}});
    for (std::size_t k = 0; k < table().size(); ++k) w.write(table()[k].name, expected_bytes(k));
    w.finish();
  }
  {
    st::safetensors_sharded_writer w(dir + "/sharded", declarations(), {{"format", "pt"}}, st::parse_size("200B"));
    for (std::size_t k = 0; k < table().size(); ++k) w.write(table()[k].name, expected_bytes(k));
    w.finish();
  }
  return 0;
}

std::string hex(std::span<const std::byte> b) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  for (auto x : b) {
    s += digits[std::to_integer<unsigned>(x) >> 4];
    s += digits[std::to_integer<unsigned>(x) & 15];
  }
  return s;
}
std::string hex(std::string_view s) { return hex(std::as_bytes(std::span(s.data(), s.size()))); }

/// Every tensor of a file or an index: its header entry and a way to read it.
struct opened {
  std::optional<st::safetensors_file> file;
  std::optional<st::safetensors_index> index;

  explicit opened(const std::string& path) {
    if (path.ends_with(".index.json"))
      index.emplace(path);
    else
      file.emplace(path);
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    if (file)
      for (const auto& t : file->tensors()) out.push_back(t.name);
    else
      for (const auto& [n, f] : index->weight_map()) out.push_back(n);
    std::sort(out.begin(), out.end());
    return out;
  }
  const st::safetensors_entry& at(const std::string& n) const { return file ? file->at(n) : index->at(n); }
  st::host_tensor read(const std::string& n) const { return file ? file->read(n) : index->read(n); }
  st::safetensors_metadata metadata() const {
    if (file) return file->metadata();
    // An index has no metadata of its own; its shards must agree.
    st::safetensors_metadata m = index->shards().empty() ? st::safetensors_metadata{} : index->shards()[0].metadata();
    for (const auto& s : index->shards())
      if (s.metadata() != m) throw std::runtime_error("shards disagree on metadata: " + s.path());
    return m;
  }
};

void print_metadata(const opened& o) {
  for (const auto& [k, v] : o.metadata()) std::cout << "meta " << hex(k) << " " << hex(v) << "\n";
}

int check(const std::string& path) {
  const opened o(path);
  int bad = 0;
  const auto names = o.names();
  for (const auto& n : names) {
    const std::size_t k = table_index(n);
    if (k == table().size()) {
      std::cerr << "unexpected tensor " << n << "\n";
      ++bad;
      continue;
    }
    const auto& e = table()[k];
    const auto t = o.read(n);
    if (t.type != e.type || t.shape != e.shape) {
      std::cerr << n << ": dtype " << ckpt::to_string(t.type) << " shape " << ckpt::detail::to_string(t.shape)
                << ", expected " << ckpt::to_string(e.type) << " " << ckpt::detail::to_string(e.shape) << "\n";
      ++bad;
    } else if (t.data != expected_bytes(k)) {
      std::cerr << n << ": bytes differ\n  got      " << hex(t.data) << "\n  expected " << hex(expected_bytes(k))
                << "\n";
      ++bad;
    }
  }
  if (names.size() != table().size()) {
    std::cerr << "file holds " << names.size() << " tensors, the table " << table().size() << "\n";
    ++bad;
  }
  print_metadata(o);
  std::cout << (bad ? "FAILED " : "ok ") << names.size() << "\n";
  return bad ? 1 : 0;
}

int dump(const std::string& path) {
  const opened o(path);
  for (const auto& n : o.names()) {
    const auto t = o.read(n);
    std::string shape = "[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) shape += (i ? "," : "") + std::to_string(t.shape[i]);
    std::cout << "tensor " << hex(n) << " " << st::safetensors_dtype_name(t.type) << " " << shape << "] " << hex(t.data)
              << "\n";
  }
  print_metadata(o);
  return 0;
}

int copy(const std::string& in, const std::string& out) {
  const st::safetensors_file f(in);
  std::vector<st::tensor_decl> decls;
  for (const auto& t : f.tensors()) decls.push_back({t.name, t.type, t.shape});
  st::sort_by_alignment(decls);
  st::safetensors_writer w(out, decls, f.metadata());
  for (const auto& d : decls) w.write(d.name, f.read(d.name).data);
  w.finish();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (argc != (mode == "copy" ? 4 : 3)) {
    std::cerr << "usage: st_tool write DIR | check PATH | dump PATH | copy IN OUT\n";
    return 2;
  }
  try {
    if (mode == "copy") return copy(argv[2], argv[3]);
    if (mode == "write") return write(argv[2]);
    if (mode == "check") return check(argv[2]);
    if (mode == "dump") return dump(argv[2]);
  } catch (const ckpt::error& e) {
    std::cerr << "ckpt::error (" << ckpt::to_string(e.kind()) << "): " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  std::cerr << "unknown mode " << mode << "\n";
  return 2;
}
