// Unit tests of core: dtypes, log levels, environment parameters, Work.
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "torus/comm/work.h"
#include "torus/core/dtype.h"
#include "torus/core/error.h"
#include "torus/core/logging.h"
#include "torus/core/params.h"

namespace torus {
namespace {

TEST(DType, SizesAndNamesRoundTrip) {
  const size_t sizes[] = {4, 8, 2, 2, 4, 8, 1};
  int i = 0;
  for (DType t : kAllDTypes) {
    EXPECT_EQ(dtype_size(t), sizes[i++]);
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
  }
  EXPECT_EQ(dtype_from_name("bfloat16"), DType::kBF16);
  EXPECT_THROW(dtype_from_name("complex64"), InvalidArgument);
  EXPECT_TRUE(dtype_is_floating(DType::kBF16));
  EXPECT_FALSE(dtype_is_floating(DType::kU8));
}

TEST(Logging, ParsesLevels) {
  EXPECT_EQ(parse_log_level("DEBUG"), LogLevel::kDebug);
  EXPECT_EQ(parse_log_level("3"), LogLevel::kWarn);
  EXPECT_THROW(parse_log_level("loud"), InvalidArgument);
  LogLevel before = log_level();
  set_log_level(LogLevel::kError);
  EXPECT_FALSE(log_enabled(LogLevel::kWarn));
  EXPECT_TRUE(log_enabled(LogLevel::kError));
  set_log_level(before);
}

class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~EnvGuard() {
    if (old_.empty()) {
      ::unsetenv(name_);
    } else {
      ::setenv(name_, old_.c_str(), 1);
    }
  }

 private:
  const char* name_;
  std::string old_;
};

TEST(Params, ParsesAndValidatesEnvironment) {
  EnvGuard a("TORUS_TIMEOUT_MS", "1500");
  EnvGuard b("TORUS_DEBUG_COLLECTIVES", "yes");
  EnvGuard c("TORUS_JOB_TOKEN", "secret-value");
  EnvGuard d("TORUS_TIMEOUTMS", "5");  // a typo
  EnvParams p = EnvParams::from_env();
  EXPECT_EQ(p.timeout.count(), 1500);
  EXPECT_TRUE(p.debug_collectives);
  EXPECT_EQ(p.job_token, "secret-value");
  ASSERT_EQ(p.unknown.size(), 1u);
  EXPECT_EQ(p.unknown[0], "TORUS_TIMEOUTMS");
  for (const auto& [name, value] : p.describe()) {
    EXPECT_EQ(value.find("secret"), std::string::npos) << name << " leaks the token";
  }
}

TEST(Params, RejectsBadValuesNamingTheVariable) {
  {
    EnvGuard a("TORUS_TIMEOUT_MS", "ten");
    try {
      EnvParams::from_env();
      FAIL() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("TORUS_TIMEOUT_MS"), std::string::npos);
    }
  }
  {
    EnvGuard a("TORUS_TIMEOUT_MS", "-4");
    EXPECT_THROW(EnvParams::from_env(), InvalidArgument);
  }
  {
    EnvGuard a("TORUS_BACKEND", "carrier-pigeon");
    EXPECT_THROW(EnvParams::from_env(), InvalidArgument);
  }
}

TEST(Work, CompletionCallbacksAndErrors) {
  comm::WorkInfo info;
  info.op = comm::OpType::kAllReduce;
  info.group = "g";
  info.seq = 3;
  auto w = std::make_shared<comm::Work>(info);
  int calls = 0;
  w->on_complete([&](std::exception_ptr e) {
    EXPECT_EQ(e, nullptr);
    ++calls;
  });
  auto held = std::make_shared<int>(7);
  w->keep_alive(held);
  EXPECT_EQ(held.use_count(), 2);
  EXPECT_FALSE(w->is_completed());
  EXPECT_THROW(w->wait(std::chrono::milliseconds(20)), TimeoutError);
  std::thread t([&] { w->mark_completed(); });
  w->wait();
  t.join();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(w->succeeded());
  EXPECT_EQ(held.use_count(), 1) << "keep-alive objects are released on completion";

  auto f = std::make_shared<comm::Work>(info);
  f->on_complete([](std::exception_ptr) { throw CommError("post-processing failed"); });
  f->mark_completed();
  EXPECT_THROW(f->wait(), CommError);
  EXPECT_NE(info.describe().find("all_reduce seq 3 on group 'g'"), std::string::npos);
}

}  // namespace
}  // namespace torus
