// Each data rank reads only its own rows (Trainer::local_rows, LocalBatch),
// under mpirun on 4 ranks:
//  * local_rows over the data ranks covers the global batch exactly once
//    (ranks of one data rank — its tp and pp ranks — read the same rows),
//    and matches the micro-batch split of the whole batch: micro-batch m's
//    rows are shared by the data ranks in rank order;
//  * training on LocalBatch gives bit-identical losses and weights to
//    training on the whole batch, in dp4, tp2 x dp2 and pp2 x dp2 (1F1B),
//    and so does evaluation;
//  * a LocalBatch of the wrong size is refused before any communication.
#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <initializer_list>
#include <set>
#include <string>

#include "parallel/parallel_test_util.h"
#include "torus/core/error.h"
#include "torus/engine/gpt_model.h"
#include "train/engine_test_util.h"

namespace torus::run {}  // the run layer's names, where a test uses them
namespace torus::engine {}  // the engine's names, where a test uses them
namespace torus::train_test {
using namespace torus::engine;  // NOLINT
using namespace torus::run;     // NOLINT
namespace {

using testing::world;
using testing_util::small_gpt;

at::Tensor batch_of(int64_t step, int64_t rows, int64_t seq) {
  return testing_util::batch_of(step, rows, seq, 11);
}

// f() throws InvalidArgument whose message holds every one of `parts`.
template <typename F>
void expect_invalid(F&& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "no InvalidArgument";
  } catch (const InvalidArgument& e) {
    for (const char* p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

at::Tensor take_rows(const at::Tensor& batch, const std::vector<int64_t>& rows) {
  return batch.index_select(0, at::tensor(rows, at::TensorOptions().dtype(at::kLong)));
}

ParallelLayout layout_of(int tp, int pp, int dp, int micro) {
  ParallelLayout l;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.num_micro = micro;
  if (pp > 1) l.schedule = pp::ScheduleKind::k1F1B;
  return l;
}

// All ranks' local rows of a global batch of `rows` rows, rank by rank.
std::vector<std::vector<int64_t>> every_rank_rows(const Trainer& t, int64_t rows, int64_t per_rank) {
  const std::vector<int64_t> mine = t.local_rows(rows);
  EXPECT_EQ(static_cast<int64_t>(mine.size()), per_rank);
  at::Tensor in = at::tensor(mine, at::TensorOptions().dtype(at::kLong));
  at::Tensor out = at::empty({world()->size() * per_rank}, in.options());
  world()->all_gather(in, out)->wait();
  std::vector<std::vector<int64_t>> all(static_cast<size_t>(world()->size()));
  for (int r = 0; r < world()->size(); ++r) {
    for (int64_t i = 0; i < per_rank; ++i) all[r].push_back(out[r * per_rank + i].item<int64_t>());
  }
  return all;
}

void check_layout(int tp, int pp, int dp, int micro) {
  SCOPED_TRACE("tp" + std::to_string(tp) + " pp" + std::to_string(pp) + " dp" + std::to_string(dp) + " micro " +
               std::to_string(micro));
  ASSERT_EQ(tp * pp * dp, world()->size());
  const ParallelLayout layout = layout_of(tp, pp, dp, micro);
  OptimizerConfig optim;
  optim.lr = 1e-3;
  GPTTrainer whole(world(), small_gpt(), layout, optim);
  GPTTrainer local(world(), small_gpt(), layout, optim);
  const int64_t rows = int64_t{dp} * micro * 2, per_rank = rows / dp, seq = 16;

  // The rows: each row of the batch once over the data ranks, each data
  // rank's micro-batch m a contiguous part of the whole batch's micro-batch m.
  const auto all = every_rank_rows(local, rows, per_rank);
  std::set<std::vector<int64_t>> distinct(all.begin(), all.end());
  EXPECT_EQ(static_cast<int>(distinct.size()), dp) << "ranks of one data rank must read the same rows";
  std::vector<int> seen(static_cast<size_t>(rows), 0);
  for (const auto& r : distinct) {
    for (size_t i = 0; i < r.size(); ++i) {
      ASSERT_GE(r[i], 0);
      ASSERT_LT(r[i], rows);
      ++seen[r[i]];
      const int64_t m = static_cast<int64_t>(i) / (per_rank / micro);
      EXPECT_EQ(r[i] / (rows / micro), m) << "row " << r[i] << " outside micro-batch " << m;
    }
  }
  for (int64_t i = 0; i < rows; ++i) EXPECT_EQ(seen[i], 1) << "row " << i;

  const std::vector<int64_t> mine = local.local_rows(rows);
  for (int k = 0; k < 4; ++k) {
    const at::Tensor batch = batch_of(k, rows, seq);
    const StepStats a = whole.train_step(batch);
    const StepStats b = local.train_step(LocalBatch{take_rows(batch, mine), rows});
    EXPECT_EQ(a.loss, b.loss) << "step " << k + 1;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << k + 1;
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(b.tokens, rows * seq);
  }
  const at::Tensor val = batch_of(100, rows, seq);
  EXPECT_EQ(whole.evaluate(val), local.evaluate(LocalBatch{take_rows(val, mine), rows}));
  const auto wa = whole.gather_local_parameters(), wb = local.gather_local_parameters();
  ASSERT_EQ(wa.size(), wb.size());
  for (const auto& [name, w] : wa) EXPECT_TRUE(at::equal(w, wb.at(name))) << name;
}

TEST(LocalBatch, DataParallel) {
  check_layout(1, 1, 4, 2);
}
TEST(LocalBatch, TensorAndDataParallel) {
  check_layout(2, 1, 2, 2);
}
TEST(LocalBatch, PipelineAndDataParallel) {
  check_layout(1, 2, 2, 4);
}

TEST(LocalBatch, WrongSizesAreRefused) {
  GPTTrainer t(world(), small_gpt(), layout_of(1, 1, 4, 2));
  expect_invalid([&] { t.local_rows(6); }, {"6 rows", "4 x 2"});
  const at::Tensor batch = batch_of(0, 8, 16);
  // 8 rows over dp 4: 2 rows each; 3 given.
  expect_invalid([&] { t.train_step(LocalBatch{batch.narrow(0, 0, 3), 8}); }, {"2 rows", "given 3"});
  expect_invalid([&] { t.evaluate(LocalBatch{batch.narrow(0, 0, 2).to(at::kInt), 8}); }, {"int64"});
}

}  // namespace
}  // namespace torus::train_test
