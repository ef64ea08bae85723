#pragma once
// How ckpt declares the functions whose bodies live in impl/*.ipp: `inline` in a header-only
// build (the default: each .ipp is included at the end of its header), with external linkage
// in a CKPT_SEPARATE_COMPILATION build, where only the one translation unit that includes
// ckpt/impl/src.hpp sees (and compiles) the bodies.
#if defined(CKPT_SEPARATE_COMPILATION)
#define CKPT_DECL
#else
#define CKPT_DECL inline
#endif
