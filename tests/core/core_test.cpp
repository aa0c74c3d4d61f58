// Unit tests of core: dtypes, log levels, Work (environment parameters: params_test.cpp).
#include <gtest/gtest.h>

#include <thread>

#include "torus/comm/work.h"
#include "torus/core/dtype.h"
#include "torus/core/error.h"
#include "torus/core/logging.h"

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
