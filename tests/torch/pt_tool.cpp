// The C++ side of check_torch.py, which compares ckpt's .pt files with real PyTorch:
//   pt_tool write DIR   writes DIR/every.pt, DIR/weights_only.pt and DIR/model_optim_rng.pt
//   pt_tool read FILE   loads FILE with ckpt::interop::load_torch and prints a canonical dump
// The dump format and the deterministic tensor values are defined identically in
// check_torch.py; see `dump` and `make` there.

#include <ckpt/interop/torch.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

namespace {

using ckpt::dtype;
using ckpt::interop::host_tensor;
using ckpt::interop::py_object;
using ckpt::interop::py_tensor;

std::string hex(const void* p, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = static_cast<const unsigned char*>(p)[i];
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

void dump(const py_object& o, std::string& out) {
  // A class of plain data (argparse.Namespace, set, torch.Size, numpy arrays...) is named first.
  if (const auto c = o.python_class(); c != ckpt::interop::py_class::builtin && c != ckpt::interop::py_class::ordered_dict)
    out += "@" + o.python_class_name() + ":";
  switch (o.kind()) {
    case ckpt::interop::py_kind::none: out += "N"; break;
    case ckpt::interop::py_kind::boolean: out += o.as_bool() ? "T" : "F"; break;
    case ckpt::interop::py_kind::integer: out += "i" + std::to_string(o.as_int()); break;
    case ckpt::interop::py_kind::floating: {
      const double d = o.as_float();
      unsigned char be[8];
      const auto bits = std::bit_cast<std::uint64_t>(d);
      for (int i = 0; i < 8; ++i) be[i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
      out += "f" + hex(be, 8);
      break;
    }
    case ckpt::interop::py_kind::string: out += "s" + hex(o.as_str().data(), o.as_str().size()); break;
    case ckpt::interop::py_kind::bytes: out += "b" + hex(o.as_bytes().data(), o.as_bytes().size()); break;
    case ckpt::interop::py_kind::list: case ckpt::interop::py_kind::tuple: {
      out += o.is_list() ? "[" : "(";
      for (std::size_t i = 0; i < o.items().size(); ++i) {
        if (i) out += ",";
        dump(o.items()[i], out);
      }
      out += o.is_list() ? "]" : ")";
      break;
    }
    case ckpt::interop::py_kind::dict: {
      out += "{";
      bool first = true;
      for (const auto& [k, v] : o.entries()) {
        if (!first) out += ",";
        first = false;
        dump(k, out);
        out += ":";
        dump(v, out);
      }
      out += "}";
      break;
    }
    case ckpt::interop::py_kind::tensor: {
      const auto& t = o.as_tensor().value;
      out += "t" + std::string(ckpt::to_string(t.type)) + ":";
      for (std::size_t i = 0; i < t.shape.size(); ++i) out += (i ? "x" : "") + std::to_string(t.shape[i]);
      out += ":" + hex(t.data.data(), t.data.size());
      break;
    }
  }
}

// Element i of a tensor with seed s, the same formula as check_torch.py's make().
host_tensor make(dtype type, ckpt::shape_t shape, std::uint64_t seed) {
  host_tensor t{type, std::move(shape), {}};
  const std::uint64_t n = t.numel();
  t.data.resize(n * ckpt::size_of(type));
  auto put = [&]<class T>(std::uint64_t i, T v) { std::memcpy(t.data.data() + i * sizeof(T), &v, sizeof(T)); };
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::int64_t k = static_cast<std::int64_t>((i * 7 + seed * 13) % 251) - 125;
    switch (type) {
      case dtype::f64: put(i, static_cast<double>(k) / 3.0); break;
      case dtype::f32: put(i, static_cast<float>(static_cast<double>(k) / 3.0)); break;
      case dtype::f16: put(i, ckpt::float16(static_cast<float>(k) * 0.5f).bits); break;
      case dtype::bf16: put(i, ckpt::bfloat16(static_cast<float>(k) * 0.5f).bits); break;
      case dtype::i64: put(i, static_cast<std::int64_t>(k * (std::int64_t{1} << 46))); break;
      case dtype::i32: put(i, static_cast<std::int32_t>(k * 16777259)); break;
      case dtype::i16: put(i, static_cast<std::int16_t>(k * 257)); break;
      case dtype::i8: put(i, static_cast<std::int8_t>(k)); break;
      case dtype::u8: put(i, static_cast<std::uint8_t>(k + 125)); break;
      case dtype::boolean: put(i, static_cast<std::uint8_t>(k % 3 == 0)); break;
      // Not in check_torch.py's files: torch 1.13, its reference, has no such dtypes
      // (test_torch_pt.cpp and cli_interop check their .pt form).
      case dtype::u16: put(i, static_cast<std::uint16_t>(k + 125)); break;
      case dtype::u32: put(i, static_cast<std::uint32_t>(k + 125)); break;
      case dtype::u64: put(i, static_cast<std::uint64_t>(k + 125)); break;
      case dtype::f8_e4m3: case dtype::f8_e5m2: put(i, static_cast<std::uint8_t>(k + 125)); break;
    }
  }
  return t;
}

// Everything the weights_only unpickler of torch 1.13 accepts (no floats, no bytes).
py_object weights_only_tree(ckpt::interop::torch_writer& w) {
  auto tensors = py_object::ordered_dict();
  const dtype all[] = {dtype::f64, dtype::f32, dtype::f16, dtype::bf16, dtype::i64,
                       dtype::i32, dtype::i16, dtype::i8, dtype::u8, dtype::boolean};
  std::uint64_t seed = 1;
  for (dtype t : all) tensors.set(std::string(ckpt::to_string(t)), w.add_tensor(make(t, {3, 5}, seed++)));
  return py_object::dict({
      {"tensors", tensors},
      {"scalar", w.add_tensor(make(dtype::f64, {}, 40))},
      {"empty", w.add_tensor(make(dtype::f32, {0}, 41))},
      {"empty2d", w.add_tensor(make(dtype::i64, {2, 0}, 42))},
      {"nested", py_object::dict({{"a", py_object::list({1, -2, "three", true, false, nullptr})},
                                  {"b", py_object::dict({{"c", py_object::list({py_object::list(), py_object::dict()})}})}})},
      {"ints", py_object::list({0, 255, 256, 65535, 65536, -1, -129, 2147483647, -2147483648LL, 4294967296LL,
                                std::int64_t{1} << 62, std::numeric_limits<std::int64_t>::min(),
                                std::numeric_limits<std::int64_t>::max()})},
      {"unicode", "h\xc3\xa9llo \xe2\x98\x83"},
      {"tuple", py_object::tuple({1, py_object::tuple({2, 3}), py_object::tuple(), "x", nullptr})},
  });
}

py_object every_tree(ckpt::interop::torch_writer& w) {
  py_object root = weights_only_tree(w);
  root.set("floats", py_object::list({0.0, -0.0, 0.1, 1.5, -2.25e-300, 1e300, 3.0, std::numeric_limits<double>::infinity()}));
  root.set("bytes", py_object::list({py_object::bytes(std::string_view("\x00\xff abc\x80", 7)), py_object::bytes("")}));
  root.set("keys", py_object::dict({{1, "one"}, {-5, "minus five"}, {py_object::tuple({1, "a"}), "tuple key"},
                                    {py_object(), "none key"}, {2.5, "float key"}}));
  py_object long_list = py_object::list();
  for (int i = 0; i < 2500; ++i) long_list.append(i * 3);
  root.set("long_list", long_list);
  py_object many = py_object::dict();
  for (int i = 0; i < 300; ++i) many.set("key" + std::to_string(i), py_object::list({i, "v" + std::to_string(i)}));
  root.set("many_strings", many);  // more than 256 memo entries: LONG_BINPUT / LONG_BINGET
  // Views of one storage: the base 4x6, its transpose, and a slice with a storage offset.
  py_object base = w.add_tensor(make(dtype::f32, {4, 6}, 50));
  py_tensor tr = base.as_tensor();
  tr.value.shape = {6, 4};
  tr.storage.stride = {1, 6};
  py_tensor slice = base.as_tensor();
  slice.value.shape = {2, 3};
  slice.storage.offset = 8;
  slice.storage.stride = {6, 1};
  py_tensor grad = base.as_tensor();
  grad.requires_grad = true;
  root.set("views", py_object::dict({{"base", base}, {"t", tr}, {"slice", slice}, {"grad", grad}}));
  // A tensor that carries its own bytes: finish() writes its storage.
  root.set("inline", make(dtype::bf16, {2, 2}, 51));
  return root;
}

py_object megatron_tree(ckpt::interop::torch_writer& w) {
  const int layers = 2, hidden = 8, vocab = 16;
  auto encoder = py_object::ordered_dict();
  std::uint64_t seed = 100;
  std::vector<std::pair<std::string, ckpt::shape_t>> params;
  for (int l = 0; l < layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    params.push_back({p + "input_layernorm.weight", {hidden}});
    params.push_back({p + "attention.query_key_value.weight", {3 * hidden, hidden}});
    params.push_back({p + "attention.dense.weight", {hidden, hidden}});
    params.push_back({p + "mlp.dense_h_to_4h.weight", {4 * hidden, hidden}});
    params.push_back({p + "mlp.dense_4h_to_h.weight", {hidden, 4 * hidden}});
  }
  for (const auto& [name, shape] : params) encoder.set(name, w.add_tensor(make(dtype::bf16, shape, seed++)));
  encoder.set("final_layernorm.weight", w.add_tensor(make(dtype::bf16, {hidden}, seed++)));
  py_object model = py_object::ordered_dict(
      {{"language_model",
        py_object::dict({{"embedding", py_object::dict({{"word_embeddings", py_object::ordered_dict({{"weight", w.add_tensor(make(dtype::bf16, {vocab, hidden}, seed++))}})}})},
                         {"encoder", encoder}})}});
  py_object state = py_object::dict();
  py_object fp32 = py_object::list();
  for (std::size_t i = 0; i < params.size(); ++i) {
    state.set(static_cast<std::int64_t>(i),
              py_object::dict({{"exp_avg", w.add_tensor(make(dtype::f32, params[i].second, 200 + i))},
                               {"exp_avg_sq", w.add_tensor(make(dtype::f32, params[i].second, 300 + i))},
                               {"step", 1000}}));
    fp32.append(w.add_tensor(make(dtype::f32, params[i].second, 400 + i)));
  }
  py_object ids = py_object::list();
  for (std::size_t i = 0; i < params.size(); ++i) ids.append(static_cast<std::int64_t>(i));
  py_object optimizer = py_object::dict({
      {"optimizer", py_object::dict({{"state", state},
                                     {"param_groups", py_object::list({py_object::dict({{"lr", 0.0003},
                                                                                         {"betas", py_object::tuple({0.9, 0.95})},
                                                                                         {"eps", 1e-08},
                                                                                         {"weight_decay", 0.01},
                                                                                         {"amsgrad", false},
                                                                                         {"params", ids}})})}})},
      {"fp32_from_fp16_params", py_object::list({fp32})},
  });
  py_object mt = py_object::list();
  for (std::int64_t i = 0; i < 625; ++i) mt.append((i * 2654435761LL) % 4294967296LL);
  py_object rng = py_object::list({py_object::dict({
      {"random_rng_state", py_object::tuple({3, py_object::tuple(mt.items()), nullptr})},
      {"torch_rng_state", w.add_tensor(make(dtype::u8, {816}, 500))},
      {"cuda_rng_tracker", py_object::dict({{"model-parallel-rng", w.add_tensor(make(dtype::u8, {816}, 501))}})},
  })});
  return py_object::dict({
      {"iteration", 1000},
      {"args", py_object::dict({{"num_layers", layers}, {"hidden_size", hidden}, {"lr", 0.0003}, {"fp16", false},
                                {"bf16", true}, {"tokenizer_type", "GPT2BPETokenizer"}, {"rotary_pct", 0.25},
                                {"vocab_file", nullptr}, {"seq_length", 16}})},
      {"checkpoint_version", 3.0},
      {"model", model},
      {"optimizer", optimizer},
      {"rng_state", rng},
  });
}

int run(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "write" && argc == 3) {
    const std::filesystem::path dir = argv[2];
    {
      ckpt::interop::torch_writer w(dir / "weights_only.pt");
      w.finish(weights_only_tree(w));
    }
    {
      ckpt::interop::torch_writer w(dir / "every.pt");
      w.finish(every_tree(w));
    }
    {
      ckpt::interop::torch_writer w(dir / "model_optim_rng.pt", {.archive_name = "model_optim_rng", .zip = {}});
      w.finish(megatron_tree(w));
    }
    {
      ckpt::interop::torch_writer w(dir / "zip64.pt", {.archive_name = "archive", .zip = {.force_zip64 = true}});
      w.finish(weights_only_tree(w));
    }
    return 0;
  }
  if (mode == "read" && argc == 3) {
    std::string out;
    dump(ckpt::interop::load_torch(argv[2]), out);
    std::cout << out << "\n";
    return 0;
  }
  std::cerr << "usage: pt_tool write DIR | pt_tool read FILE.pt\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const ckpt::error& e) {
    std::cerr << "pt_tool: ckpt::error(" << ckpt::to_string(e.kind()) << "): " << e.what() << "\n";
    return 1;
  }
}
