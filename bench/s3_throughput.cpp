// Upload and download throughput of a checkpoint through an S3-compatible server on loopback,
// with 1, 4 and 8 requests in flight, each as a ratio to `aws s3 cp` of the same files in the
// same run. Run it under tests/s3/harness.py (bench/s3_run.sh does), which starts s3rver:
//
//   bash bench/s3_run.sh [BUILD_DIR] [--mib 1024] [--runs 3]
//
// Upload: cp.save straight into the bucket (ckpt::s3, parts of 64 MiB, upload_concurrency
// parts in flight). Download: cp.load from the bucket (threads = the same count, each chunk one
// ranged GET). The peer: `aws s3 cp --recursive` of the tag's files, up and down, with awscli's
// defaults (8 MiB parts, 10 requests in flight). Every figure is the median of --runs runs.

#include <ckpt/ckpt.hpp>
#include <ckpt/s3.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct state {
  std::vector<std::vector<float>> tensors;
  template <class V>
  void checkpoint(V& v) {
    for (std::size_t i = 0; i < tensors.size(); ++i) v.tensor("layers." + std::to_string(i) + ".weight", tensors[i]);
  }
};

double seconds_of(auto&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

void run(const std::string& cmd) {
  if (std::system((cmd + " > /dev/null").c_str()) != 0) {
    std::fprintf(stderr, "failed: %s\n", cmd.c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t mib = 1024;
  int runs = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--mib") mib = std::stoul(argv[i + 1]);
    if (a == "--runs") runs = std::stoi(argv[i + 1]);
  }
  const char* endpoint = std::getenv("CKPT_TEST_S3_ENDPOINT");
  const char* bucket = std::getenv("CKPT_TEST_S3_BUCKET");
  if (!endpoint || !bucket) {
    std::fprintf(stderr, "run under tests/s3/harness.py (bench/s3_run.sh)\n");
    return 2;
  }
  // The checkpoint: 16 fp32 tensors of N(0, 0.02), mib MiB in all, saved raw.
  state s;
  std::mt19937_64 g(1);
  std::normal_distribution<float> n(0.f, 0.02f);
  const std::size_t per = (mib << 20) / 16 / sizeof(float);
  for (int t = 0; t < 16; ++t) {
    s.tensors.emplace_back(per);
    for (auto& x : s.tensors.back()) x = n(g);
  }
  const auto bytes = static_cast<double>(16 * per * sizeof(float));
  const fs::path local = fs::temp_directory_path() / ("ckpt-s3-bench-" + std::to_string(::getpid()));
  fs::remove_all(local);
  {
    ckpt::checkpointer<> cp{{}, local};
    cp.save(1, s);
  }
  const std::string aws = std::string("aws --endpoint-url ") + endpoint + " s3 cp --recursive --only-show-errors ";
  const std::string remote = std::string("s3://") + bucket + "/bench/";

  std::printf("%zu MiB checkpoint (16 fp32 tensors), %d runs, medians; MB/s = 1e6 bytes/s\n\n", mib, runs);
  std::printf("| requests in flight | ckpt upload MB/s | aws s3 cp up MB/s | ratio | ckpt download MB/s | aws s3 cp down MB/s | ratio |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::uint64_t step = 0;  // a new tag each save; keep_last_n = 1 deletes the previous one
  for (unsigned c : {1u, 4u, 8u}) {
    std::vector<double> up, down, aws_up, aws_down, up_ratio, down_ratio;
    for (int r = 0; r < runs; ++r) {
      ckpt::s3_options o{.endpoint = endpoint, .bucket = bucket, .prefix = "bench/ckpt"};
      o.upload_concurrency = c;
      o.download_concurrency = c;
      o.range_bytes = o.part_bytes;
      ckpt::checkpointer<ckpt::single_process, ckpt::s3> cp{{}, ckpt::s3{o}, {.keep_last_n = 1, .threads = c}};
      const double t_up = seconds_of([&] { cp.save(++step, s); });
      state back;
      for (const auto& t : s.tensors) back.tensors.emplace_back(t.size());
      const double t_down = seconds_of([&] { cp.load(back); });
      if (back.tensors != s.tensors) {
        std::fprintf(stderr, "the loaded state differs from the saved one\n");
        return 1;
      }
      const fs::path dl = local.string() + "-dl";
      fs::remove_all(dl);
      const double a_up = seconds_of([&] { run(aws + (local / "global_step1").string() + " " + remote + "aws/global_step1/"); });
      const double a_down = seconds_of([&] { run(aws + remote + "aws/global_step1/ " + dl.string()); });
      fs::remove_all(dl);
      up.push_back(bytes / t_up / 1e6);
      down.push_back(bytes / t_down / 1e6);
      aws_up.push_back(bytes / a_up / 1e6);
      aws_down.push_back(bytes / a_down / 1e6);
      up_ratio.push_back(a_up / t_up);
      down_ratio.push_back(a_down / t_down);
    }
    std::printf("| %u | %.0f | %.0f | %.2f | %.0f | %.0f | %.2f |\n", c, median(up), median(aws_up), median(up_ratio),
                median(down), median(aws_down), median(down_ratio));
    std::fflush(stdout);
  }
  fs::remove_all(local);
}
