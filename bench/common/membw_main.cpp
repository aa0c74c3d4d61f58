// bench/common/membw_main.cpp — torus-bench-membw: the single-core memcpy
// probe on its own, for scripts that want the limit of this host measured
// while nothing else runs (bench/collectives/run.py).
//
//   torus-bench-membw [--bytes 64M] [--runs 9] [--json FILE]
#include <cstdio>
#include <exception>
#include <optional>

#include "cli.h"
#include "membw.h"
#include "report.h"
#include "sweep.h"

int main(int argc, char** argv) {
  using namespace torus::bench;
  try {
    size_t bytes = size_t{64} << 20;
    int runs = 9;
    std::optional<std::string> json;
    bool help = false;
    Cli cli;
    cli.flag("-h,--help", [&] { help = true; });
    cli.option("--bytes", [&](const std::string& v) { bytes = parse_size(v); });
    cli.option("--runs", [&](const std::string& v) { runs = std::stoi(v); });
    cli.option("--json", [&](const std::string& v) { json = v; });
    cli.parse(argc, argv);
    if (help) {
      std::printf(
          "torus-bench-membw — single-core memcpy bandwidth (median of several copies).\n\n"
          "  --bytes SIZE   size of one copy (default 64M)\n"
          "  --runs N       timed copies (default 9)\n"
          "  --json FILE    write [{\"probe\": \"memcpy\", \"bytes\", \"runs\", \"gbps\"}]\n"
          "GB/s = bytes copied / time, 1 GB = 1e9 B.\n");
      return 0;
    }
    const MemcpyProbe probe = memcpy_probe(bytes, runs);
    std::printf("%s\n", describe(probe).c_str());
    if (json && !write_json(*json, {}, probe)) return 1;
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torus-bench-membw: %s\n", e.what());
    return 1;
  }
}
