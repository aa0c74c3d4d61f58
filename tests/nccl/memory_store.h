// Test helper: an in-process Store (the NCCL tests run their ranks as
// threads of one process and exchange the unique id through it).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "torus/comm/store.h"
#include "torus/core/error.h"

namespace torus::testing {

class MemoryStore final : public comm::Store {
 public:
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      data_[key] = value;
    }
    cv_.notify_all();
  }
  std::vector<uint8_t> get(const std::string& key, Duration timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return data_.count(key) != 0; })) {
      throw TimeoutError("MemoryStore: timed out waiting for key '" + key + "'");
    }
    return data_[key];
  }
  int64_t add(const std::string& key, int64_t delta) override {
    int64_t v;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& bytes = data_[key];
      v = (bytes.empty() ? 0 : std::stoll(std::string(bytes.begin(), bytes.end()))) + delta;
      std::string s = std::to_string(v);
      bytes.assign(s.begin(), s.end());
    }
    cv_.notify_all();
    return v;
  }
  void wait(const std::vector<std::string>& keys, Duration timeout) override {
    for (const auto& k : keys) (void)get(k, timeout);
  }
  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& k : keys) {
      if (data_.count(k) == 0) return false;
    }
    return true;
  }
  bool remove(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    return data_.erase(key) != 0;
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return data_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<uint8_t>> data_;
};

}  // namespace torus::testing
