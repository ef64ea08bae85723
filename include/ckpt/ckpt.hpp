#pragma once
/// @file ckpt.hpp
/// The umbrella header: everything a single-process, host-memory user needs. It never
/// includes MPI, CUDA, NCCL or libcurl; those back ends have headers of their own.
///
/// @code
/// #include <ckpt/ckpt.hpp>
///
/// struct model {
///   std::vector<float> w = std::vector<float>(1024);
///   std::mt19937 rng;
///   template <class V> void checkpoint(V& v) { v.tensor("w", w); v.value("rng", rng); }
/// };
///
/// int main() {
///   model m;
///   ckpt::checkpointer cp{ckpt::single_process{}, ckpt::posix{"/tmp/run"}};
///   cp.save(100, m);
///   auto r = cp.load(m);  // r.iteration == 100
/// }
/// @endcode

#include "checkpointer.hpp"
#include "concepts.hpp"
#include "config.hpp"
#include "dtype.hpp"
#include "error.hpp"
#include "host_copy.hpp"
#include "local.hpp"
#include "megatron.hpp"
#include "memory_storage.hpp"
#include "names.hpp"
#include "options.hpp"
#include "posix.hpp"
#include "raw.hpp"
#include "save_handle.hpp"
#include "single_process.hpp"
#include "tensor.hpp"
#include "topology.hpp"
#include "version.hpp"
#include "visitor.hpp"
#include "zstd.hpp"

#if defined(CKPT_SEPARATE_COMPILATION)
// Compiled once, in the translation unit that includes ckpt/impl/src.hpp (impl/instances.hpp).
// Any other checkpointer needs <ckpt/impl/checkpointer.ipp> in the translation unit that makes
// it (checkpointer.hpp says why).
#include "impl/instances.hpp"
#define CKPT_DECLARE_EXTERN_CHECKPOINTER(P, S, C, D) extern template class checkpointer<P, S, C, D>;
namespace ckpt {
CKPT_PRECOMPILED_CHECKPOINTERS(CKPT_DECLARE_EXTERN_CHECKPOINTER)
}  // namespace ckpt
#undef CKPT_DECLARE_EXTERN_CHECKPOINTER
#endif
