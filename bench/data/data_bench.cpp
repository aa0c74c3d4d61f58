// torus-bench-data — tokens/s of TokenSampler (torus/run/token_data.h)
// reading its rows from a memory-mapped .tok file and from a Megatron
// .bin/.idx pair, page cache warm, beside a plain memcpy of the same windows'
// bytes out of the same map (the machine limit of the gather: no index
// arithmetic, no int64 conversion, no id check).
//
//   torus-bench-data [--tokens 64M] [--seq 1024] [--batch 64] [--dp 1] [--steps 200] [--dir DIR]
//                    [--no-probe] [--commit SHA] [--json FILE]
//
// The data: --tokens uint16 ids from a splitmix64 stream (vocabulary 50304),
// written as data.tok and as data.bin + data.idx (documents of 1000 tokens)
// in --dir (default: a fresh folder in the temporary directory, removed at
// the end), then read once whole (validate_tokens(), which also checks
// every id) so the page cache is warm. One data-parallel rank's share is timed: rows
// [0, batch / dp) of steps 0 .. steps - 1, on one thread. Reported per
// format: ms per step (median), tokens/s (ids returned, seq + 1 per row), the
// source GB/s (2 bytes per id) and the ratio to the memcpy gather of the
// same windows. A memcpy probe of one large buffer is printed beside.
//
// Verification, before anything is reported: every timed row of the first
// and last step equals the file's bytes at the sampler's window offset, read
// with pread (not through the map); a mismatch exits 2.
//
// JSON (--json): {program, command, commit, date, config, probe, rows, verified}.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "common/membw.h"
#include "common/options.h"
#include "common/sweep.h"
#include "torus/run/corpus.h"
#include "torus/run/token_data.h"

namespace {
namespace fs = std::filesystem;
using torus::run::TokenDataset;
using torus::run::TokenSampler;

struct Options {
  int64_t tokens = int64_t{64} << 20;
  int64_t seq = 1024;
  int64_t batch = 64;
  int64_t dp = 1;
  int64_t steps = 200;
  std::string dir;
  bool probe = true;
  std::string commit = "unknown";
  std::string json;
};

[[noreturn]] void usage(const std::string& error) {
  std::FILE* out = error.empty() ? stdout : stderr;
  if (!error.empty()) std::fprintf(stderr, "torus-bench-data: %s\n\n", error.c_str());
  std::fprintf(out,
               "usage: torus-bench-data [options]\n"
               "  --tokens N     tokens in the generated dataset (default 64M; K/M/G suffixes)\n"
               "  --seq N        seq_len: rows hold N + 1 tokens (default 1024)\n"
               "  --batch N      global batch rows (default 64)\n"
               "  --dp N         data-parallel ranks; rows [0, batch / dp) are timed (default 1)\n"
               "  --steps N      timed steps per format (default 200)\n"
               "  --dir DIR      where the data files go (default: a temporary folder, removed)\n"
               "  --no-probe     skip the memcpy probe\n"
               "  --commit SHA   the commit recorded in the JSON (default 'unknown')\n"
               "  --json FILE    write the results as JSON\n");
  std::exit(error.empty() ? 0 : 1);
}

Options parse(int argc, char** argv) {
  Options o;
  try {
    torus::bench::Cli cli;
    bool help = false;
    cli.flag("--help,-h", [&] { help = true; });
    cli.option("--tokens", [&](const std::string& v) { o.tokens = static_cast<int64_t>(torus::bench::parse_size(v)); });
    torus::bench::int_option(cli, "--seq", o.seq);
    torus::bench::int_option(cli, "--batch", o.batch);
    torus::bench::int_option(cli, "--dp", o.dp);
    torus::bench::int_option(cli, "--steps", o.steps);
    cli.option("--dir", [&](const std::string& v) { o.dir = v; });
    cli.flag("--no-probe", [&] { o.probe = false; });
    cli.option("--commit", [&](const std::string& v) { o.commit = v; });
    cli.option("--json", [&](const std::string& v) { o.json = v; });
    cli.parse(argc, argv);
    if (help) usage("");
  } catch (const std::invalid_argument& e) {
    usage(e.what());
  }
  if (o.batch % o.dp != 0) usage("--batch must be a multiple of --dp");
  if (o.tokens < o.seq + 1) usage("--tokens must exceed --seq");
  return o;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

std::string command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    if (i) s += ' ';
    s += argv[i];
  }
  return s;
}

void put(std::string& b, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// data.tok and data.bin/.idx of the same ids (docs/data.md's layouts).
void write_data(const fs::path& dir, int64_t n) {
  constexpr int64_t kDoc = 1000;
  std::string ids;
  ids.reserve(static_cast<size_t>(2 * n));
  for (int64_t i = 0; i < n; ++i) put(ids, torus::run::splitmix64(static_cast<uint64_t>(i)) % 50304, 2);
  const int64_t docs = (n + kDoc - 1) / kDoc;
  std::string tok = "TORUSTOK";
  put(tok, 1, 4), put(tok, 2, 4), put(tok, n, 8), put(tok, 50304, 8), put(tok, docs, 8);
  for (int64_t d = 0; d <= docs; ++d) put(tok, std::min(d * kDoc, n), 8);
  std::ofstream(dir / "data.tok", std::ios::binary) << tok << ids;
  std::ofstream(dir / "data.bin", std::ios::binary) << ids;
  std::string idx("MMIDIDX\0\0", 9);
  put(idx, 1, 8), put(idx, 8, 1), put(idx, docs, 8), put(idx, docs + 1, 8);
  for (int64_t d = 0; d < docs; ++d) put(idx, std::min(kDoc, n - d * kDoc), 4);
  for (int64_t d = 0; d < docs; ++d) put(idx, 2 * d * kDoc, 8);
  for (int64_t d = 0; d <= docs; ++d) put(idx, d, 8);
  std::ofstream(dir / "data.idx", std::ios::binary) << idx;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Row {
  std::string format;
  double step_ms = 0, tokens_per_s = 0, source_gbps = 0, memcpy_ms = 0, vs_memcpy = 0;
};

// Every row of `step` against pread of `file` at the window's byte offset.
bool verify(const TokenSampler& s, int64_t step, int64_t rows, const std::string& file, int64_t header) {
  const int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0) return false;
  const std::vector<int64_t> got = s.rows(step, 0, rows);
  std::vector<uint16_t> raw(static_cast<size_t>(s.window()));
  bool ok = true;
  for (int64_t r = 0; r < rows && ok; ++r) {
    const auto p = s.position(step, r);
    const int64_t off = s.window_offset(s.sample(p.epoch, p.sample_in_epoch));
    const ssize_t want = static_cast<ssize_t>(raw.size() * 2);
    ok = ::pread(fd, raw.data(), raw.size() * 2, header + 2 * off) == want;
    for (int64_t j = 0; ok && j < s.window(); ++j) ok = got[r * s.window() + j] == raw[j];
  }
  ::close(fd);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const std::string command = command_line(argc, argv);
  const bool own_dir = o.dir.empty();
  const fs::path dir =
      own_dir ? fs::temp_directory_path() / ("torus_bench_data_" + std::to_string(::getpid())) : fs::path(o.dir);
  fs::create_directories(dir);
  write_data(dir, o.tokens);
  const int64_t rows = o.batch / o.dp;
  std::printf("# torus-bench-data: %lld uint16 tokens, seq %lld, batch %lld, dp %lld (timing %lld rows), %lld steps\n",
              static_cast<long long>(o.tokens), static_cast<long long>(o.seq), static_cast<long long>(o.batch),
              static_cast<long long>(o.dp), static_cast<long long>(rows), static_cast<long long>(o.steps));
  std::optional<torus::bench::MemcpyProbe> probe;
  if (o.probe) {
    probe = torus::bench::memcpy_probe();
    std::printf("# %s\n", torus::bench::describe(*probe).c_str());
  }
  std::printf("%-9s %10s %14s %11s %11s %10s\n", "format", "step ms", "tokens/s", "src GB/s", "memcpy ms",
              "vs memcpy");
  std::vector<Row> results;
  bool verified = true;
  const int64_t header = 40 + 8 * ((o.tokens + 999) / 1000 + 1);
  for (const auto& [name, path, file, skip] :
       {std::tuple<std::string, fs::path, fs::path, int64_t>{"tok", dir / "data.tok", dir / "data.tok", header},
        {"megatron", dir / "data", dir / "data.bin", 0}}) {
    try {
      const TokenDataset data = TokenDataset::open(path.string());
      data.validate_tokens();  // warms the page cache, checks every id
      const TokenSampler s(data, {.seq_len = o.seq, .batch = o.batch, .seed = 1});
      if (!verify(s, 0, rows, file.string(), skip) || !verify(s, o.steps - 1, rows, file.string(), skip)) {
        std::fprintf(stderr, "torus-bench-data: %s: rows differ from the file's bytes\n", name.c_str());
        verified = false;
        continue;
      }
      std::vector<int64_t> out(static_cast<size_t>(rows * s.window()));
      std::vector<int64_t> idx(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) idx[r] = r;
      std::vector<double> t_rows, t_copy;
      const uint8_t* base = nullptr;
      {  // the map's bytes, for the memcpy gather: read them through a second map of the same file
        const int fd = ::open(file.c_str(), O_RDONLY);
        base = static_cast<const uint8_t*>(::mmap(nullptr, fs::file_size(file), PROT_READ, MAP_SHARED, fd, 0));
        ::close(fd);
      }
      std::vector<uint8_t> bytes(static_cast<size_t>(rows * s.window() * 2));
      for (int64_t step = 0; step < o.steps; ++step) {
        double t0 = now_s();
        s.read_rows(step, idx, out);
        t_rows.push_back(now_s() - t0);
        std::vector<int64_t> offsets(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) {
          const auto p = s.position(step, r);
          offsets[r] = s.window_offset(s.sample(p.epoch, p.sample_in_epoch));
        }
        t0 = now_s();
        for (int64_t r = 0; r < rows; ++r) {
          std::memcpy(bytes.data() + r * s.window() * 2, base + skip + 2 * offsets[r], s.window() * 2);
        }
        t_copy.push_back(now_s() - t0);
      }
      ::munmap(const_cast<uint8_t*>(base), fs::file_size(file));
      Row row{.format = name};
      const double step_s = median(t_rows);
      row.step_ms = 1e3 * step_s;
      row.tokens_per_s = static_cast<double>(rows * s.window()) / step_s;
      row.source_gbps = row.tokens_per_s * 2 / 1e9;
      row.memcpy_ms = 1e3 * median(t_copy);
      row.vs_memcpy = row.step_ms / row.memcpy_ms;
      std::printf("%-9s %10.4f %14.4g %11.2f %11.4f %10.2f\n", name.c_str(), row.step_ms, row.tokens_per_s,
                  row.source_gbps, row.memcpy_ms, row.vs_memcpy);
      results.push_back(row);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "torus-bench-data: %s: %s\n", name.c_str(), e.what());
      verified = false;
    }
  }
  if (own_dir) fs::remove_all(dir);
  if (!o.json.empty()) {
    nlohmann::json jrows = nlohmann::json::array();
    for (const Row& r : results) {
      jrows.push_back({{"format", r.format}, {"step_ms", r.step_ms}, {"tokens_per_s", r.tokens_per_s},
                       {"source_gbps", r.source_gbps}, {"memcpy_ms", r.memcpy_ms}, {"vs_memcpy", r.vs_memcpy}});
    }
    nlohmann::json jprobe = nullptr;
    if (probe) jprobe = {{"probe", "memcpy"}, {"bytes", probe->bytes}, {"runs", probe->runs}, {"gbps", probe->gbps}};
    const nlohmann::json out = {
        {"program", "torus-bench-data"}, {"command", command}, {"commit", o.commit}, {"date", utc_now()},
        {"config", {{"tokens", o.tokens}, {"dtype", "uint16"}, {"seq", o.seq}, {"batch", o.batch}, {"dp", o.dp},
                    {"rows_timed", rows}, {"steps", o.steps}}},
        {"probe", jprobe}, {"rows", jrows}, {"verified", verified}};
    std::ofstream f(o.json);
    if (!f) {
      std::fprintf(stderr, "torus-bench-data: cannot write %s\n", o.json.c_str());
      return 1;
    }
    f << out.dump(1) << "\n";
  }
  return verified ? 0 : 2;
}
