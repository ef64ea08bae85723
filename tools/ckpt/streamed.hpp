#pragma once
// Tensors `ckpt import` saves without holding them: their bytes stay in the source files (.pt
// or safetensors)
// until the checkpointer asks for them, a chunk at a time, so an import's memory is the
// checkpointer's staging buffers plus what the tool itself holds (ZeRO's joined state, RNG
// states), not the model.
//
// A streamed tensor is a tensor_ref on device::external(k), k its place in a file_tensors
// table; the `streamed_from_files` DevicePolicy reads entry k from its file when the save
// stages it. Tensors in memory (host) go through as they would with ckpt::host_copy.

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include <ckpt/error.hpp>
#include <ckpt/interop/safetensors.hpp>
#include <ckpt/interop/torch.hpp>
#include <ckpt/tensor.hpp>

namespace ckpt_tool {

/// The streamed tensors of an import: for each, its file and its place in the file. A .pt
/// tensor's zip record is CRC-checked as it is read (torch_tensor_source); safetensors has no
/// checksums, so its bytes are read as they are, inside the bounds the header was checked for.
class file_tensors {
 public:
  /// The source of `file`, opened once.
  ckpt::interop::torch_tensor_source& source(const std::filesystem::path& file) {
    for (auto& s : sources_)
      if (s->path() == file) return *s;
    return *sources_.emplace_back(std::make_unique<ckpt::interop::torch_tensor_source>(file));
  }
  /// Records `t` (read without its bytes) and gives its number.
  int add(ckpt::interop::torch_tensor_source& src, const ckpt::interop::py_tensor& t) {
    return push({&src, ckpt::interop::py_tensor{ckpt::interop::host_tensor{t.value.type, t.value.shape, {}}, t.storage, false}, nullptr, {}, {}});
  }
  /// Records tensor `name` of a safetensors file (which must outlive this table).
  int add(const ckpt::interop::safetensors_file& file, const ckpt::interop::safetensors_entry& t) {
    return push({nullptr, ckpt::interop::py_tensor{ckpt::interop::host_tensor{t.type, t.shape, {}}, {}, false}, &file, t.name, {}});
  }
  /// Records a tensor joined from pieces of others: segment i puts `bytes` bytes of `flat`
  /// (from byte `from`, in `sources[i]`) at byte `at`. A ZeRO parameter's state is one.
  struct piece {
    ckpt::interop::torch_tensor_source* source;
    std::shared_ptr<const ckpt::interop::py_tensor> flat;  // bytes in memory when load_torch read them, else in source
    std::uint64_t from, at, bytes;
  };
  int add(ckpt::dtype type, ckpt::shape_t shape, std::vector<piece> pieces) {
    std::sort(pieces.begin(), pieces.end(), [](const piece& a, const piece& b) { return a.at < b.at; });
    return push({nullptr, ckpt::interop::py_tensor{ckpt::interop::host_tensor{type, std::move(shape), {}}, {}, false}, nullptr, {},
                 std::move(pieces)});
  }
  /// Bytes [offset, offset + out.size()) of tensor `k`.
  void read(int k, std::uint64_t offset, std::span<std::byte> out) const {
    const auto& e = entries_.at(static_cast<std::size_t>(k));
    if (e.safetensors) return e.safetensors->read_part(e.name, offset, out);  // pread: safe from several threads
    if (e.source) return e.source->read(e.tensor, offset, out);
    std::uint64_t filled = 0;
    for (const auto& p : e.pieces) {
      const std::uint64_t lo = std::max(offset, p.at), hi = std::min(offset + out.size(), p.at + p.bytes);
      if (lo >= hi) continue;
      const auto dst = out.subspan(static_cast<std::size_t>(lo - offset), static_cast<std::size_t>(hi - lo));
      if (!p.flat->value.data.empty())
        std::memcpy(dst.data(), p.flat->value.data.data() + p.from + (lo - p.at), dst.size());
      else
        p.source->read(*p.flat, p.from + (lo - p.at), dst);
      filled += hi - lo;
    }
    if (filled != out.size())  // the join checked the pieces cover the tensor; this would be a bug
      throw ckpt::error(ckpt::error_kind::corrupt, "ckpt import: tensor " + std::to_string(k) + " has bytes no partition holds");
  }
  /// A view ckpt can save tensor `k` through: external memory the DevicePolicy reads.
  ckpt::tensor_ref ref(int k) const {
    const auto& t = entries_.at(static_cast<std::size_t>(k)).tensor.value;
    static std::byte nowhere;  // never dereferenced: the DevicePolicy reads the file
    return ckpt::tensor_ref(t.type, t.shape, &nowhere, ckpt::device::external(k));
  }

 private:
  struct entry {
    ckpt::interop::torch_tensor_source* source;  // a .pt file's tensor, or
    ckpt::interop::py_tensor tensor;             // (dtype, shape and storage; no bytes)
    const ckpt::interop::safetensors_file* safetensors;  // a safetensors file's, by name
    std::string name;
    std::vector<piece> pieces;  // or joined from pieces of others
  };
  /// Appends `e`; its number is what a tensor_ref on device::external(number) reads.
  int push(entry e) {
    if (entries_.size() >= static_cast<std::size_t>(std::numeric_limits<int>::max()))
      throw ckpt::error(ckpt::error_kind::invalid_argument, "ckpt import: too many tensors");
    entries_.push_back(std::move(e));
    return static_cast<int>(entries_.size() - 1);
  }

  std::vector<std::unique_ptr<ckpt::interop::torch_tensor_source>> sources_;
  std::deque<entry> entries_;
};

/// The DevicePolicy of an import: host tensors by memcpy, external ones from their file.
struct streamed_from_files {
  const file_tensors* files = nullptr;

  bool accepts(ckpt::device d) const noexcept { return d.type == ckpt::device::kind::host || d.type == ckpt::device::kind::external; }
  void to_host(const ckpt::tensor_ref& t, std::uint64_t offset, std::span<std::byte> dst) const {
    if (t.where().type == ckpt::device::kind::external)
      files->read(t.where().id, offset, dst);
    else if (!dst.empty())
      std::memcpy(dst.data(), t.data() + offset, dst.size());
  }
  void from_host(std::span<const std::byte>, const ckpt::tensor_ref&, std::uint64_t) const {
    throw ckpt::error(ckpt::error_kind::invalid_argument, "ckpt import saves from its source files and never loads into them");
  }
};

}  // namespace ckpt_tool
