// ProgramStage (torus/parallel/pipeline/program_stage.h): a pipeline whose
// stages are precompiled programs, run by PipelineExecutor under GPipe, 1F1B
// and ZB-H1 on 2 ranks (mpirun). The programs here are StagePrograms on the
// CPU device (what a NEFF is on a NeuronCore): stage 0 scales its input by
// w0 elementwise; stage 1 scales by w1 and computes the mean squared error
// to a target. The losses and weight gradients, summed over micro-batches,
// must equal the closed forms computed in one process.
#include "torus/parallel/pipeline/program_stage.h"

#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

#include "torus/comm/process_group.h"
#include "torus/core/error.h"

namespace torus::pp {
namespace {

const comm::ProcessGroupPtr& world() {
  static comm::ProcessGroupPtr w = torus::init();
  return w;
}

constexpr int kN = 6;
constexpr int kMicro = 4;

float w0_of(int i) { return 0.5f + 0.25f * static_cast<float>(i); }
float w1_of(int i) { return 1.5f - 0.125f * static_cast<float>(i); }
float x_of(int m, int i) { return std::sin(0.7f * static_cast<float>(i) + static_cast<float>(m)); }
float t_of(int m, int i) { return std::cos(0.3f * static_cast<float>(i) - static_cast<float>(m)); }

// A program on host memory: named f32 tensors, a function over them.
class HostProgram final : public device::StageProgram {
 public:
  using Fn = std::function<void(std::map<std::string, float*>&)>;
  HostProgram(std::string name, std::vector<device::ProgramTensor> tensors, Fn fn)
      : name_(std::move(name)), tensors_(std::move(tensors)), fn_(std::move(fn)) {}
  const std::string& source() const override { return name_; }
  const std::vector<device::ProgramTensor>& tensors() const override { return tensors_; }
  void bind(const std::string& name, void* ptr, size_t bytes) override {
    for (const auto& t : tensors_) {
      if (t.name == name) {
        ASSERT_EQ(bytes, t.bytes) << name_ << ": " << name;
        bound_[name] = static_cast<float*>(ptr);
        return;
      }
    }
    FAIL() << name_ << " has no tensor " << name;
  }
  void execute() override {
    for (const auto& t : tensors_) ASSERT_TRUE(bound_.count(t.name)) << name_ << ": " << t.name << " unbound";
    fn_(bound_);
    ++stats_.executions;
  }
  device::ProgramStats stats() const override { return stats_; }

 private:
  std::string name_;
  std::vector<device::ProgramTensor> tensors_;
  Fn fn_;
  std::map<std::string, float*> bound_;
  device::ProgramStats stats_;
};

constexpr size_t kBytes = kN * sizeof(float);

device::ProgramTensor in(const char* n, size_t b = kBytes) { return {n, b, true}; }
device::ProgramTensor out(const char* n, size_t b = kBytes) { return {n, b, false}; }

struct Stage0 {
  std::vector<float> w = std::vector<float>(kN), dw = std::vector<float>(kN, 0);
  HostProgram fwd{"stage0.fwd", {in("input"), out("output")}, [this](auto& t) {
                    for (int i = 0; i < kN; ++i) t["output"][i] = t["input"][i] * w[i];
                  }};
  HostProgram bwd_in{"stage0.bwd_in", {in("input"), in("grad_output")}, [](auto&) {}};
  HostProgram bwd_w{"stage0.bwd_w", {in("input"), in("grad_output")}, [this](auto& t) {
                      for (int i = 0; i < kN; ++i) dw[i] += t["grad_output"][i] * t["input"][i];
                    }};
  Stage0() {
    for (int i = 0; i < kN; ++i) w[i] = w0_of(i);
  }
};

struct Stage1 {  // loss = mean((x w1 - t)^2)
  std::vector<float> w = std::vector<float>(kN), dw = std::vector<float>(kN, 0);
  HostProgram fwd{"stage1.fwd", {in("input"), in("target"), out("loss", 4)}, [this](auto& t) {
                    float l = 0;
                    for (int i = 0; i < kN; ++i) {
                      float d = t["input"][i] * w[i] - t["target"][i];
                      l += d * d;
                    }
                    t["loss"][0] = l / kN;
                  }};
  HostProgram bwd_in{"stage1.bwd_in", {in("input"), in("target"), out("grad_input")}, [this](auto& t) {
                       for (int i = 0; i < kN; ++i) {
                         float d = t["input"][i] * w[i] - t["target"][i];
                         t["grad_input"][i] = 2 * d / kN * w[i];
                       }
                     }};
  HostProgram bwd_w{"stage1.bwd_w", {in("input"), in("target")}, [this](auto& t) {
                      for (int i = 0; i < kN; ++i) {
                        float d = t["input"][i] * w[i] - t["target"][i];
                        dw[i] += 2 * d / kN * t["input"][i];
                      }
                    }};
  Stage1() {
    for (int i = 0; i < kN; ++i) w[i] = w1_of(i);
  }
};

at::Tensor data(int m, const std::string& name) {
  at::Tensor t = at::empty({kN}, at::kFloat);
  for (int i = 0; i < kN; ++i) t.data_ptr<float>()[i] = name == "input" ? x_of(m, i) : t_of(m, i);
  return t;
}

void run(ScheduleKind kind) {
  auto pg = world();
  ASSERT_EQ(pg->size(), 2) << "run on 2 ranks";
  const int rank = pg->rank();
  Stage0 s0;
  Stage1 s1;
  CompiledChunk chunk = rank == 0 ? CompiledChunk{&s0.fwd, &s0.bwd_in, &s0.bwd_w}
                                  : CompiledChunk{&s1.fwd, &s1.bwd_in, &s1.bwd_w};
  ProgramStage stage(DeviceType::kCPU, {chunk}, rank == 0, rank == 1, data);
  ExecutorOptions o;
  o.edge_specs = {ProgramStage::edge_spec(kBytes)};
  PipelineExecutor exec(pg, o);
  StepResult r = exec.run(make_schedule({kind, 2, kMicro}), stage);
  EXPECT_EQ(stage.live_bytes(), 0u);  // every micro-batch's saved inputs freed
  // The closed forms, in double.
  for (int i = 0; i < kN; ++i) {
    double dw0 = 0, dw1 = 0;
    for (int m = 0; m < kMicro; ++m) {
      double h = x_of(m, i) * w0_of(i);
      double d = h * w1_of(i) - t_of(m, i);
      dw1 += 2 * d / kN * h;
      dw0 += 2 * d / kN * w1_of(i) * x_of(m, i);
    }
    if (rank == 0) EXPECT_NEAR(s0.dw[i], dw0, 1e-5) << "dw0[" << i << "]";
    if (rank == 1) EXPECT_NEAR(s1.dw[i], dw1, 1e-5) << "dw1[" << i << "]";
  }
  if (rank == 1) {
    ASSERT_EQ(r.losses.size(), static_cast<size_t>(kMicro));
    for (int m = 0; m < kMicro; ++m) {
      double l = 0;
      for (int i = 0; i < kN; ++i) {
        double d = x_of(m, i) * w0_of(i) * w1_of(i) - t_of(m, i);
        l += d * d / kN;
      }
      EXPECT_NEAR(r.losses[static_cast<size_t>(m)].item<float>(), l, 1e-5) << "micro " << m;
    }
  }
  // The programs ran once per micro-batch each.
  const auto& progs = rank == 0 ? std::vector<HostProgram*>{&s0.fwd, &s0.bwd_in, &s0.bwd_w}
                                : std::vector<HostProgram*>{&s1.fwd, &s1.bwd_in, &s1.bwd_w};
  for (auto* p : progs) EXPECT_EQ(p->stats().executions, static_cast<uint64_t>(kMicro)) << p->source();
}

TEST(ProgramStage, GPipe) { run(ScheduleKind::kGPipe); }
TEST(ProgramStage, OneFOneB) { run(ScheduleKind::k1F1B); }
TEST(ProgramStage, ZeroBubbleH1SplitsTheWeightGradient) { run(ScheduleKind::kZeroBubbleH1); }

TEST(ProgramStage, RefusesProgramsWithoutTheirTensors) {
  HostProgram f("f", {in("input")}, [](auto&) {});  // no "output"
  HostProgram b("b", {in("input"), in("grad_output")}, [](auto&) {});
  EXPECT_THROW(ProgramStage(DeviceType::kCPU, {CompiledChunk{&f, &b, nullptr}}, true, false, data), InvalidArgument);
  HostProgram f2("f2", {in("input"), out("output")}, [](auto&) {});
  EXPECT_THROW(ProgramStage(DeviceType::kCPU, {CompiledChunk{&f2, &b, nullptr}}, true, false, nullptr),
               InvalidArgument);
  // A middle stage needs grad_input of the input's size.
  HostProgram bi("bi", {in("input"), in("grad_output"), out("grad_input", 8)}, [](auto&) {});
  EXPECT_THROW(ProgramStage(DeviceType::kCPU, {CompiledChunk{&f2, &bi, nullptr}}, false, false, nullptr),
               InvalidArgument);
}

}  // namespace
}  // namespace torus::pp
