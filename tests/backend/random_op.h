// One op of a randomized case on one rank: its buffers (with guard bytes
// around each), its inputs, what it must produce, and the checks after it
// completed. See random_cases.h for the values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "random_cases.h"
#include "torus/comm/backend.h"

namespace torus::comm::rc {

// Outcome categories, in increasing order of severity (a case takes the
// worst its ranks report). Everything from kError on is a failure.
enum class Cat : uint8_t { kPass, kExcluded, kSkipped, kError, kHang, kClobber, kWrong };
std::string_view cat_name(Cat c);
inline bool is_failure(Cat c) {
  return c >= Cat::kError;
}

// A buffer of `bytes` with kGuard bytes of a known pattern on each side,
// placed as `place` says. Its contents start as a pattern of the key (a
// "sentinel", so that an element nobody wrote is noticed).
class Region {
 public:
  static constexpr size_t kGuard = 64;
  Region(Place place, size_t bytes, size_t elt, uint64_t key);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  char* data() { return base_ + offset_; }
  size_t bytes() const { return bytes_; }
  // "" when both guards are intact, else what was overwritten.
  std::string guard_damage() const;
  // For the self-test: overwrite one guard byte.
  void damage_guard() { base_[offset_ + bytes_] ^= 0x5a; }

 private:
  char guard_byte(size_t k) const;
  Place place_;
  bool pooled_ = false;
  char* base_ = nullptr;
  size_t offset_ = 0, bytes_ = 0, total_ = 0;
  uint64_t key_;
};

class OpRun {
 public:
  // Allocates and fills this rank's buffers of `op` on group `g` (of which
  // this rank is group rank g.rank()).
  OpRun(const Op& op, Backend& g, Duration timeout);
  // Issues the op (send/recv: all of this rank's messages). May throw.
  void issue();
  struct Issued {
    WorkPtr work;
    std::chrono::steady_clock::time_point at;
  };
  std::vector<Issued>& works() { return works_; }

  // After every Work completed: guards, inputs that must not change, outputs.
  // Returns kPass and "" or the worst finding and its description.
  std::pair<Cat, std::string> check() const;

  // Self-test hooks: whether this rank has an output element, and spoiling it.
  bool has_output() const;
  void corrupt_output();
  void damage_output_guard();

 private:
  Region& region(size_t bytes, uint64_t salt);
  // Expectations: `want` bytes at `at`; `output` false means "must be left as it was".
  struct Expect {
    const char* at;
    std::vector<char> want;
    bool output;
    std::string what;
    std::function<std::string(size_t)> explain;  // extra text for element i (reductions: the inputs)
    Region* region;
  };
  void expect_output(const char* at, std::vector<char> want, std::string what, Region* r,
                     std::function<std::string(size_t)> explain = {});
  void expect_unchanged(const char* at, size_t bytes, std::string what);
  std::function<std::string(size_t)> explain_column(size_t first_column) const;

  Op op_;
  Backend& g_;
  Duration timeout_;
  int n_, me_;
  size_t elt_;
  std::vector<std::unique_ptr<Region>> regions_;
  std::vector<Expect> expects_;
  std::vector<size_t> send_counts_, recv_counts_;
  std::vector<std::function<WorkPtr()>> issue_;
  std::vector<Issued> works_;
};

}  // namespace torus::comm::rc
