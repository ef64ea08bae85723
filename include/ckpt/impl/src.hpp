#pragma once
/// @file impl/src.hpp
/// Separate compilation (Asio's model): in a program built with CKPT_SEPARATE_COMPILATION
/// defined everywhere, exactly one translation unit includes this header. It compiles, once,
/// the parts of ckpt that do not depend on the user's types (metadata JSON, the format, the
/// commit merge, names) and the bodies of the checkpointers impl/instances.hpp lists; every other TU
/// sees only their declarations. Meson's and CMake's `ckpt_impl` library is such a TU.
///
/// @code
/// // ckpt_impl.cpp, compiled once with -DCKPT_SEPARATE_COMPILATION:
/// #include <ckpt/impl/src.hpp>
/// @endcode

#if !defined(CKPT_SEPARATE_COMPILATION)
#error "ckpt/impl/src.hpp is for builds with CKPT_SEPARATE_COMPILATION defined (in every translation unit)"
#endif


#include "../ckpt.hpp"
#include "checkpointer.ipp"
#include "chunk_layout.ipp"
#include "commit.ipp"
#include "format.ipp"
#include "gather.ipp"
#include "metadata.ipp"
#include "names.ipp"
#include "names_detail.ipp"
#include "posix.ipp"
#include "region.ipp"
#include "restore_plan.ipp"
#include "save_plan.ipp"
#include "streamed_gather.ipp"
#include "tensor.ipp"
#include "visitor.ipp"

#define CKPT_DEFINE_CHECKPOINTER(P, S, C, D) template class checkpointer<P, S, C, D>;
namespace ckpt {
CKPT_PRECOMPILED_CHECKPOINTERS(CKPT_DEFINE_CHECKPOINTER)
}  // namespace ckpt
#undef CKPT_DEFINE_CHECKPOINTER
