// gtest main shared by Torus test binaries. Under mpirun (any launcher that
// sets a rank variable) ranks other than 0 print only failures, so the
// output stays readable while every rank still runs every test.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace {

int launcher_rank() {
  for (const char* v : {"TORUS_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK"}) {
    if (const char* s = std::getenv(v)) return std::atoi(s);
  }
  return 0;
}

class FailuresOnly : public testing::EmptyTestEventListener {
 public:
  explicit FailuresOnly(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed()) {
      fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
              r.line_number(), r.summary());
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  int rank = launcher_rank();
  if (rank != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOnly(rank));
  }
  return RUN_ALL_TESTS();
}
