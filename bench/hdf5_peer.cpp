// The peer a C++ user might pick instead of a checkpoint library: HDF5 (Debian's libhdf5-dev,
// the C API), one dataset per tensor of the save_load workload (bench/workload.hpp: the same
// names, shapes, dtypes and values), then H5Fflush, H5Fclose and fsync; loaded back with one
// H5Dread per dataset, cold (the file dropped from the page cache) and warm. bf16 has no HDF5
// type: its tensors are stored as 16-bit unsigned integers, as a user would. Built only where
// libhdf5-dev is installed (the `hdf5` dependency). Prints "name value" lines for
// bench/report.py, with the peak resident memory the save and the loads added.
//
//   bench/hdf5_peer --dir /var/tmp --workload fp32|bf16_adam --gib 1

#include <hdf5.h>

#include "workload.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

using namespace bench;

void check(herr_t rc, const char* what) {
  if (rc < 0) die(std::string("HDF5: ") + what + " failed");
}
hid_t check_id(hid_t id, const char* what) {
  if (id < 0) die(std::string("HDF5: ") + what + " failed");
  return id;
}

/// VmHWM (the peak resident set) of this process, in MiB.
double peak_rss_mib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024;
  return 0;
}

hid_t file_type(ckpt::dtype t) { return t == ckpt::dtype::f32 ? H5T_IEEE_F32LE : H5T_STD_U16LE; }
hid_t memory_type(ckpt::dtype t) { return t == ckpt::dtype::f32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_UINT16; }

void save(const state& s, const std::string& path) {
  const hid_t f = check_id(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), "H5Fcreate");
  for (const auto& t : s.tensors) {
    const hsize_t dims[2] = {t.shape[0], t.shape[1]};
    const hid_t space = check_id(H5Screate_simple(2, dims, nullptr), "H5Screate_simple");
    const hid_t d = check_id(H5Dcreate2(f, t.name.c_str(), file_type(t.type), space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                             "H5Dcreate2");
    check(H5Dwrite(d, memory_type(t.type), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data()), "H5Dwrite");
    check(H5Dclose(d), "H5Dclose");
    check(H5Sclose(space), "H5Sclose");
  }
  check(H5Fflush(f, H5F_SCOPE_GLOBAL), "H5Fflush");
  check(H5Fclose(f), "H5Fclose");
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) die("fsync " + path);
  ::close(fd);
}

void load(state& s, const std::string& path) {
  const hid_t f = check_id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "H5Fopen");
  for (auto& t : s.tensors) {
    const hid_t d = check_id(H5Dopen2(f, t.name.c_str(), H5P_DEFAULT), "H5Dopen2");
    check(H5Dread(d, memory_type(t.type), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data()), "H5Dread");
    check(H5Dclose(d), "H5Dclose");
  }
  check(H5Fclose(f), "H5Fclose");
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/var/tmp", workload = "fp32";
  double gib = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--dir") dir = v;
    else if (a == "--workload") workload = v;
    else if (a == "--gib") gib = std::stod(v);
  }
  // HDF5 group names are paths: "layers.0.w1" is one name, as in the checkpoint.
  auto s = make_state(workload, gib);
  auto back = s;
  for (auto& t : back.tensors) std::fill(t.block.begin(), t.block.end(), std::byte{0});
  const double rss_before = peak_rss_mib();
  const auto path = dir + "/hdf5-peer-" + std::to_string(::getpid()) + ".h5";
  ::sync();
  ::sleep(3);  // start from a settled disk, as the other peers do (report.py rotates their order)
  auto t0 = clock_type::now();
  save(s, path);
  std::printf("hdf5_save_s %.6f\n", since(t0));
  settle_cold(path, 3);
  t0 = clock_type::now();
  load(back, path);
  std::printf("hdf5_load_cold_s %.6f\n", since(t0));
  t0 = clock_type::now();
  load(back, path);
  std::printf("hdf5_load_warm_s %.6f\n", since(t0));
  std::printf("hdf5_extra_peak_rss_mib %.3f\n", peak_rss_mib() - rss_before);
  const bool same = back.same_bytes(s);
  std::filesystem::remove(path);
  if (!same) std::fprintf(stderr, "HDF5 read back different bytes\n");
  return same ? 0 : 1;
}
