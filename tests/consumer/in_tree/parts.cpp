// Compiled and linked with each optional target the machine has (ckpt::mpi, ckpt::s3,
// ckpt::cuda, ckpt::libtorch, ckpt::eigen), so that a target that lacks an include directory or a library fails here. Built,
// not run: the CUDA part needs a GPU.
#if CKPT_PART_MPI
#include <ckpt/mpi.hpp>
#endif
#if CKPT_PART_S3
#include <ckpt/s3.hpp>
#endif
#if CKPT_PART_CUDA
#include <ckpt/cuda/device_copy.hpp>
#include <ckpt/cuda/nccl.hpp>
#endif
#if CKPT_PART_LIBTORCH
#include <ckpt/adapters/libtorch.hpp>
#endif
#if CKPT_PART_EIGEN
#include <ckpt/adapters/eigen.hpp>
#endif

#include <cstdio>

int main() {
  int parts = 0;
#if CKPT_PART_MPI
  int up = 0;
  MPI_Initialized(&up);  // links libmpi
  ++parts;
#endif
#if CKPT_PART_S3
  std::puts(curl_version());  // links libcurl
  ++parts;
#endif
#if CKPT_PART_CUDA
  int n = 0;
  (void)cudaGetDeviceCount(&n);  // links cudart
  ++parts;
#endif
#if CKPT_PART_LIBTORCH
  const auto t = torch::arange(6, torch::kFloat).reshape({2, 3});  // links libtorch
  if (ckpt::libtorch::ref(t).numel() != 6) return 1;
  ++parts;
#endif
#if CKPT_PART_EIGEN
  Eigen::MatrixXf m(2, 3);
  if (ckpt::tensor_traits<Eigen::MatrixXf>::ref(m).numel() != 6) return 1;
  ++parts;
#endif
  std::printf("consumer_parts: %d optional parts\n", parts);
  return 0;
}
